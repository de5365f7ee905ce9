"""Per-setting image quality of a sweep through ``coolsd.quality``: prepared once per rank before any image is
generated (``setup``: weights, reference, image size, captions all checked), then computed per setting at the
merge from the stored codes (decoded batch by batch), sharded over the ranks and cached in
``DIR/quality/<slug>.json`` (keyed by setting, image count, code version, the quality request and its stamps).

MNIST (always): the shipped classifier's features against the held-out digits, FD = torchmetrics' FID with our
jackknife interval, plus class accuracy and the target NLL per token. Other models with ``--quality fid``:
FID / KID / IS / precision-recall in the extractor's space against ``--quality-ref``; ``--quality clip``:
CLIP score against the captions. The FD the claims and figures use is the FID of the report's extractor.
"""
from __future__ import annotations

import json
import math

import torch

__all__ = ["spec_of", "describe", "setup", "quality", "quality_shard", "check_stamps", "DECODE_BATCH"]

DECODE_BATCH = 64         # codes decoded per decoder call at the merge
_FORMAT = 2


def _mnist_spec():
    from coolsd.quality import QualitySpec

    return QualitySpec(("fid",), weights="mnist", reference="mnist")


def spec_of(cfg):
    """The quality request of a sweep: ``cfg.quality``, MNIST's classifier spec for --model mnist, else None."""
    if cfg.model == "mnist":
        return _mnist_spec()
    return cfg.quality


def _image_shape(bundle) -> tuple:
    """(C, H, W) of the model's decoded images, from decoding one all-zero code image."""
    if bundle.vq is None:
        raise ValueError("--quality: this model has no image decoder (Bundle.vq), its codes cannot be scored")
    dev = getattr(bundle.target, "device", "cpu")
    with torch.no_grad():
        x = bundle.vq.decode_code(torch.zeros(1, bundle.num_tokens, dtype=torch.long, device=dev))
    return tuple(int(s) for s in x.shape[1:])


def setup(cfg, ctx):
    """``coolsd.quality.prepare`` of the sweep's request on this rank's models (once: kept on ``ctx.quality``);
    None when the sweep measures no quality. Every bad input is an error here, before any generation."""
    if getattr(ctx, "quality", None) is not None or spec_of(cfg) is None:
        return getattr(ctx, "quality", None)
    import dataclasses

    from coolsd.quality import prepare

    spec = dataclasses.replace(spec_of(cfg), device=str(ctx.device))   # this rank's device (cuda:LOCAL_RANK)
    prompts = dict(cfg.model_options).get("prompts")
    ctx.quality = prepare(spec, image_shape=_image_shape(ctx.bundle), conds=ctx.bundle.conds, prompts=prompts)
    return ctx.quality


def _batches(ctx, q, d):
    """(decoded images, captions) of the setting's codes, DECODE_BATCH at a time; image i has condition
    i mod len(conds) (``run.Context.conds``), so caption i mod len(captions)."""
    tokens = torch.as_tensor(d["tokens"])
    dev = getattr(ctx.bundle.target, "device", "cpu")
    for a in range(0, len(tokens), DECODE_BATCH):  # decoder batches bound the images held in memory
        with torch.no_grad():
            x = ctx.bundle.vq.decode_code(tokens[a:a + DECODE_BATCH].to(dev)).float().cpu()
        caps = None if q.captions is None else [q.captions[i % len(q.captions)] for i in range(a, a + len(x))]
        yield x, caps


def _measure(cfg, ctx, d, where: str = "the generated images") -> dict:
    from coolsd.quality.evaluate import check_finite_images

    q = setup(cfg, ctx)
    r = q.measure(_batches(ctx, q, d), where)
    out = dict(r)
    if "fid" in r:      # the report's FD (table, figures, claims) is the FID of this extractor
        out |= {"frechet_distance": r["fid"], "frechet_distance_ci": r["fid_ci"], "frechet_distance_se": r["fid_se"]}
    if cfg.model == "mnist":
        from coolsd.studies.demo.quality import nll_with_se
        from real.zoo import vq
        from real.zoo.metrics import class_accuracy

        images = vq.decode(torch.as_tensor(d["tokens"]))
        check_finite_images(images, where)
        labels = torch.as_tensor(d["classes"])
        acc = class_accuracy(images, labels)
        dev = getattr(ctx.bundle.target, "device", "cpu")
        out |= {"class_accuracy": acc, "class_accuracy_se": math.sqrt(acc * (1 - acc) / len(labels)),
                **nll_with_se(ctx.bundle.target, labels.to(dev), torch.as_tensor(d["tokens"]).to(dev))}
    return out


def quality(store, cfg, ctx, unit, load) -> dict:
    """``_measure`` of one setting's first ``cfg.images`` images (``load(store, cfg, unit)`` reads them), cached
    in ``DIR/quality/<slug>.json`` (written atomically; reused while setting, image count, code version, the
    quality request and its stamps match), so an interrupted merge keeps the settings it finished and ranks
    share the work (``quality_shard``)."""
    from .store import json_safe

    q = setup(cfg, ctx)
    name = f"quality/{unit.slug}.json"
    path = store.root / name
    want = {"format": _FORMAT, "key": unit.key, "images": cfg.images, "code_version": ctx.code_version,
            "request": q.spec.identity(), "stamps": q.stamps(cfg.images)}
    if path.exists():
        try:
            cached = json.loads(path.read_text())
            if {k: cached.get(k) for k in want} == json.loads(json.dumps(want)):
                return cached["quality"]
        except (OSError, ValueError, KeyError):
            pass                                   # damaged: recompute and overwrite
    path.parent.mkdir(exist_ok=True)
    where = f"the units of {unit.key} in {str(store.unit_path(unit.slug, 0).parent)!r}"
    r = json_safe(_measure(cfg, ctx, load(store, cfg, unit), where))
    store.write_text(name, json.dumps({**want, "quality": r}, allow_nan=False) + "\n")
    return r


def quality_shard(store, cfg, ctx, rank: int, world: int, load) -> int:
    """This rank's share of the per-setting quality (AR first, then the grid; setting i on rank i mod world),
    cached as ``quality`` does. Returns how many it computed or found (0 when the sweep measures no quality)."""
    from .run import Unit

    if spec_of(cfg) is None:
        return 0
    units = [Unit(None, 0)] + [Unit(s, 0) for s in cfg.settings]
    mine = units[rank::world]
    for u in mine:  # one setting at a time: each is a whole batched computation
        quality(store, cfg, ctx, u, load)
    return len(mine)


def check_stamps(rows) -> dict | None:
    """The one quality stamp {metric: stamp} shared by every row (baseline and settings) of a report;
    StampMismatch when two differ (never merged silently). None when no row has one."""
    from coolsd.quality import require_same

    stamps = [r["quality_stamp"] for r in rows if r.get("quality_stamp")]
    if not stamps:
        return None
    for metric in stamps[0]:
        require_same([s[metric] for s in stamps], f"the settings of this report ({metric})")
    return stamps[0]


def describe(stamp: dict | None) -> str:
    """The report's one-line statement of what the quality figures are."""
    if not stamp:
        return "not measured (--quality fid / clip with local weights: docs/guide/quality.md)"
    parts = []
    for metric, s in stamp.items():
        ref = f" against {s['reference']} (sha256 {s['reference_sha256'][:12]}...)" if s.get("reference") else ""
        parts.append(f"{metric}: {s['library']}, extractor {s['extractor']} (weights {s['weights']}, sha256 "
                     f"{s['weights_sha256'][:12]}...){ref}, {s['images']} images per setting, preprocessing "
                     f"{json.dumps(s['preprocessing'], sort_keys=True)}")
    return "; ".join(parts)
