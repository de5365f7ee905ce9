"""Merge of a sweep (rank 0): the stored units -> one entry per setting with measured and predicted
figures and their uncertainty, and the paper's claims tested on the data.

Predictions reuse the demo's code (``coolsd.studies.demo``: T10/T11 per recorded vanilla round, the renewal
recursion over the image's positions, the speed-up model), called on the vanilla rows the sweep stored.
Quality (``quality``: MNIST's classifier always, other models with --quality): FID with a jackknife interval
(and KID, IS, precision/recall, CLIP score) through ``coolsd.quality``, stamped; MNIST adds class accuracy and
the target NLL per token.
"""
from __future__ import annotations

import math

import numpy as np

from . import quality as qual
from .metrics import frontier_difference, tokens_per_call
from .run import AR, Context, SweepConfig, Unit, host_tables
from .store import Store

__all__ = ["load", "analyse", "CLAIMS"]

# (id, statement, A = (method, pinned params), B = (method, pinned params)); "A's quality is better
# (lower FD / NLL) than B's at equal tokens per target call"
CLAIMS = (
    ("cool-sd_vs_uniform-rsd", "Cool-SD's quality is better than UniformRSD's at equal tokens per target call "
     "(paper, Figure 3)", ("cool-sd", {}), ("uniform-rsd", {})),
    ("exponential_vs_linear", "the exponential schedule (Cool-SD) is better than the linear decaying one at equal "
     "tokens per target call (paper, Figure 5)", ("cool-sd", {}), ("linear-rsd", {})),
    ("lantern++_gstar_vs_own", "LANTERN++ with the G* resampler is better than with its own at equal tokens per "
     "target call (paper, Figure 4)", ("lantern++", {"resampler": "optimal"}), ("lantern++", {"resampler": "lantern"})),
)
Z = 2.0   # |z| beyond which a paired difference counts as separated


def _value(e: dict, y: str, se: str):
    return None if e.get(y) is None or e.get(se) is None else (e[y], e[se])


def _fid(e: dict, name: str):
    d = e.get(name)
    return None if not d or d.get("measured") is None else (d["measured"], d["se"])


# quality measures the claims are tested on (lower is better): entry -> (value, SE) or None
MEASURES = {"frechet_distance": lambda e: _value(e, "frechet_distance", "frechet_distance_se"),
            "nll_per_token": lambda e: _value(e, "nll_per_token", "nll_per_token_se"),
            "tv_to_target": lambda e: _fid(e, "tv_to_target"),
            "kl_to_target": lambda e: _fid(e, "kl_to_target")}


def load(store: Store, cfg: SweepConfig, unit: Unit) -> dict:
    """The first ``cfg.images`` images of one setting (AR: ``unit.setting`` None), every block merged:
    per-image arrays, per-round arrays (with global image index), recorded vanilla rows, wall seconds."""
    per_image, per_round, rec, wall, versions = {}, {}, {}, 0.0, set()
    for j in range(cfg.n_blocks):
        a, meta = store.read_unit(unit.slug, j)
        if meta["key"] != unit.key or meta["index"] != j:
            raise ValueError(f"unit file {store.unit_path(unit.slug, j)} holds {meta['key']} block {meta['index']}; "
                             "delete it and rerun")
        wall += meta["wall_seconds"]
        versions.add(meta.get("code_version"))
        for k, v in a.items():
            if k.startswith("round_"):
                per_round.setdefault(k, []).append(a["image_index"][v] if k == "round_image" else v)
            elif k.startswith("rec"):
                rec.setdefault(k, []).append(v)
            else:
                per_image.setdefault(k, []).append(v)
    out = {k: np.concatenate(v)[:cfg.images] for k, v in per_image.items()}
    rounds = {k: np.concatenate(v) for k, v in per_round.items()}
    keep = rounds["round_image"] < cfg.images
    out |= {k: v[keep] for k, v in rounds.items()}
    out |= {k: np.concatenate(v) for k, v in rec.items()}
    out["wall_per_image"] = wall / (cfg.n_blocks * cfg.unit_images)
    out["code_versions"] = sorted(str(v) for v in versions)
    return out


def _stats(d: dict) -> dict:
    """``real.decode.engine.summarize``-like totals of a merged setting (for ``coolsd.studies.demo.unit_costs``)."""
    return {"rounds": int(d["image_rounds"].sum()), "seconds": float(d["image_seconds"].sum()),
            "tokens": int(d["tokens"].size), "draft_forwards": int(d["image_draft_forwards"].sum()),
            "time_draft_s": float(d["round_t_draft"].sum()), "time_target_s": float(d["round_t_target"].sum()),
            "time_verify_s": float(d["round_t_verify"].sum())}


def _vanilla_source(ctx: Context, van: dict):
    """The prediction input from the vanilla rows: chain arrays (p, q, drafts, n_drafted, start), or tree groups
    {depth: (p, q, tokens, start)}, rows in the dtype they were recorded in (the predictions convert them to float64
    a chunk of rounds at a time: ``demo.predict.predict_chain``, ``tree_prediction``; a float64 copy of every row
    at once was (rounds x (2L + 1) x V x 8) bytes); None when nothing was recorded."""
    if getattr(ctx, "dynamic", None) is not None:
        return None         # dynamic trees: no rows recorded by the sweep (run.run_unit)
    if ctx.tree is None:
        if "rec_p" not in van:
            return None
        return van["rec_p"], van["rec_q"], van["rec_drafts"], van["rec_n_drafted"], van["rec_start"]
    deps = sorted({int(k[4:].split("_")[0]) for k in van if k.startswith("rect")})
    return {d: (van[f"rect{d}_p"], van[f"rect{d}_q"], van[f"rect{d}_tokens"], van[f"rect{d}_start"])
            for d in deps} or None


def analyse(store: Store, cfg: SweepConfig, ctx: Context) -> dict:
    """The report dict: {"methods": [...], "baseline": {...}, "claims": [...], "config": ...}."""
    from coolsd.studies.demo import predict as demo

    ar = load(store, cfg, Unit(None, 0))
    ar_stats = _stats(ar)
    T = ctx.bundle.num_tokens
    with_quality = qual.spec_of(cfg) is not None
    loaded = {s.key: load(store, cfg, Unit(s, 0)) for s in cfg.settings}
    van_setting = next(s for s in cfg.settings if s.method == "vanilla")
    van = loaded[van_setting.key]
    source = _vanilla_source(ctx, van)
    predictable = source is not None
    per_row = _per_row(ctx.bundle, T)
    nb, cb = host_tables(ctx)
    drafting = cfg.drafting_kind
    first = np.r_[True, van["round_image"][1:] != van["round_image"][:-1]]
    first_single = bool((van["round_drafted"][first] == 0).all())
    costs = demo.unit_costs(_stats(van), ar_stats) if predictable else None
    baseline = {"name": AR, "images": int(len(ar["tokens"])), "tokens_per_target_call": 1.0,
                "seconds_per_image": ar["wall_per_image"]}
    if with_quality:
        baseline |= qual.quality(store, cfg, ctx, Unit(None, 0), load)
    from . import fidelity

    fid, fid_base = fidelity.entries(store, cfg, ctx)
    if fid_base is not None:
        if "nll_per_token" in baseline:   # the quality pass's NLL is under the unguided conditional model
            baseline["nll_unguided_per_token"] = baseline.pop("nll_per_token")
            baseline["nll_unguided_per_token_se"] = baseline.pop("nll_per_token_se")
        baseline |= fid_base
    entries = []
    chains = (demo.chain_predictions(source, {s.key: s.verifier(ctx.L, nb, cb) for s in cfg.settings}, ctx.L,
                                     first_single, T=T, per_row=per_row)
              if predictable and ctx.tree is None else {})     # the recorded rounds read once for every rule
    for i, s in enumerate(cfg.settings):
        d = loaded[s.key]
        tpc, se = tokens_per_call(d["image_rounds"], T)
        pred = None
        if predictable:
            rule = s.verifier(ctx.L, nb, cb)
            if ctx.tree is None:
                pred = chains[s.key]
                verify_s = demo.time_verifier(source, ctx.verifier(s), None, device=ctx.device)
            else:
                pred = demo.tree_prediction(source, rule, ctx.tree, T=T, per_row=per_row,
                                            draft_law="point" if ctx.mode.candidates == "topk" else "without_replacement")
                verify_s = demo.time_verifier(source, ctx.verifier(s), ctx.tree, device=ctx.device)
        drafted = d["round_drafted"]
        depth = np.where(d["round_depth"] >= 0, d["round_depth"], drafted)
        e = {"name": s.method, "params": s.params_dict, "drafting": drafting,
             "draft": ctx.bundle.info.get("draft"), "L": ctx.L, "family": s.family, "key": s.key,
             "images": int(len(d["tokens"])),
             "accepted_length": {"predicted": pred["tokens_per_call"] if pred else None, "measured": tpc,
                                 "measured_se": se},
             "speedup": {"predicted": demo.predicted_speedup(pred, costs, verify_s, T) if pred else None,
                         "measured": ar["wall_per_image"] / d["wall_per_image"]},
             "tv_bound": pred["tv_bound"] if pred else None, "tv_bound_se": pred["tv_bound_se"] if pred else None,
             "acceptance_rate": float(d["round_accepted"].sum() / depth.sum()) if depth.sum() else None,
             "seconds_per_image": d["wall_per_image"], "rounds": int(d["image_rounds"].sum())}
        if with_quality:
            e |= qual.quality(store, cfg, ctx, Unit(s, 0), load)
        for k in ("frechet_distance", "frechet_distance_ci", "class_accuracy", "nll_per_token"):
            e.setdefault(k, None)
        if s.key in fid:
            if e.get("nll_per_token") is not None and "fidelity_reason" not in fid[s.key]:
                e["nll_unguided_per_token"] = e.pop("nll_per_token")
                e["nll_unguided_per_token_se"] = e.pop("nll_per_token_se", None)
            e |= fid[s.key]
        else:
            e |= {"tv_to_target": None, "kl_to_target": None, "tv_bound_image": None,
                  "fidelity_reason": f"{drafting} drafting: no exact likelihood: {_no_likelihood(cfg)}"}
        entries.append(e)
    versions = sorted({v for d in (ar, *loaded.values()) for v in d["code_versions"]})
    batch_note = _batch_note(cfg, ctx, loaded, T)
    stamp = qual.check_stamps([baseline, *entries])          # one stamp for the whole report, else an error
    has_fd = with_quality and "frechet_distance" in baseline
    return {"methods": entries, "baseline": baseline, "claims": claims(entries) if (has_fd or fid) else [],
            "predictions": {"available": predictable, "first_round_prefill_only": first_single,
                            "from": f"vanilla {drafting} rows of "
                                    f"{len(np.unique(van['round_image'][van['round_image'] < cfg.record_images]))} "
                                    "images (coolsd.studies.demo predictions)" if predictable else
                                    ("not available (dynamic trees: the sweep records no per-round trees; "
                                     "coolsd generate --record does)" if cfg.drafting.mode.grown_tree else
                                     "not available (no recorded vanilla rows: --record-images 0?)"),
                            "tokens_per_row": per_row,
                            "costs": costs},
            "quality": qual.describe(stamp), "quality_stamp": stamp,
            "code_versions": versions, "batch_note": batch_note}


def _batch_note(cfg: SweepConfig, ctx: Context, loaded: dict, T: int) -> dict:
    """Where SD stops paying with batch size on this machine (``coolsd.studies.batching``): chain drafting on a
    batched model; otherwise a sentence saying why there is no curve."""
    from coolsd.studies import batching

    B = cfg.batch_size or cfg.unit_images
    t, d = ctx.bundle.target, ctx.bundle.draft
    if ctx.tree is not None or not getattr(t, "batched", False) or not hasattr(t, "cache_len"):
        why = "tree drafting" if ctx.tree is not None else "a model that generates one image at a time"
        return {"text": f"Speed-ups measured at batch size {B} on {ctx.device}; no batch-size curve for {why}."}
    Bs = batching.batches_up_to(B)
    try:
        costs = {b: batching.unit_costs(t, d, b, ctx.proc, ctx.L, T=int(ctx.bundle.num_tokens)) for b in Bs}
    except (AttributeError, TypeError) as e:    # a model outside the LlamaGen-style calls the timer makes
        return {"text": f"Speed-ups measured at batch size {B} on {ctx.device}; no batch-size curve for this "
                        f"model ({type(e).__name__}: {e})."}
    per = {s.key: batching.stops_paying(loaded[s.key]["image_rounds"], costs, T, ctx.L) for s in cfg.settings}
    return {"batches": list(Bs), "methods": {k: {"stops_paying_at": v["stops_paying_at"],
                                               "predicted": {str(b): x for b, x in v["predicted"].items()}}
                                           for k, v in per.items()},
            "text": batching.note(per, B, str(ctx.device))}


def _per_row(bundle, T: int) -> int:
    """Tokens per image row for the row-wise acceptance estimate of the predictions: the model's code
    grid (``Bundle.info["grid"]`` = [rows, columns]), else the side of a square image, else the whole
    image as one row (pooled)."""
    grid = bundle.info.get("grid")
    if grid and len(grid) == 2 and grid[0] * grid[1] == T:
        return int(grid[1])
    side = math.isqrt(T)
    return side if side * side == T else T


def _match(e: dict, method: str, pinned: dict) -> bool:
    from theory.rules import methods

    if e["name"] != method:
        return False
    full = methods.resolve(method, e["params"])
    return all(full[k] == v for k, v in pinned.items())


def claims(entries: list[dict]) -> list[dict]:
    """Each claim of ``CLAIMS`` on every pair of matching frontier families, for each of ``MEASURES``: the paired
    difference A - B by interpolation along A's frontier (``metrics.frontier_difference``, with the measured
    tokens per call's SEs);
    held (z <= -2), not held (z >= 2), not separable, or not testable (no overlap / too few points)."""
    out = []
    for cid, text, (ma, pa), (mb, pb) in CLAIMS:
        fa = _families([e for e in entries if _match(e, ma, pa)])
        fb = _families([e for e in entries if _match(e, mb, pb)])
        for na, ea in fa.items():
            for nb_, eb in fb.items():
                if na == nb_:
                    continue
                row = {"id": cid, "claim": text, "a": na, "b": nb_, "points_a": len(ea), "points_b": len(eb)}
                for measure, get in MEASURES.items():
                    ya, yb = [get(e) for e in ea], [get(e) for e in eb]
                    if any(v is None for v in ya + yb):
                        row[measure] = {"verdict": "not testable (a value is missing or infinite)"}
                        continue
                    r = frontier_difference([e["accepted_length"]["measured"] for e in ea], [v[0] for v in ya],
                                            [v[1] for v in ya], [e["accepted_length"]["measured"] for e in eb],
                                            [v[0] for v in yb], [v[1] for v in yb],
                                            [e["accepted_length"]["measured_se"] for e in ea],
                                            [e["accepted_length"]["measured_se"] for e in eb])
                    verdict = ("not testable (the frontiers do not overlap in tokens per call)" if r is None else
                               "held" if r["z"] <= -Z else "not held" if r["z"] >= Z else "not separable")
                    row[measure] = {**(r or {}), "verdict": verdict}
                out.append(row)
        if not fa or not fb:
            out.append({"id": cid, "claim": text, "a": ma, "b": mb,
                        **{m: {"verdict": "not testable (the grid lacks one of the two methods)"} for m in MEASURES}})
    return out


def _families(entries: list[dict]) -> dict:
    fam: dict = {}
    for e in entries:
        fam.setdefault(e["family"], []).append(e)
    return fam


def _no_likelihood(cfg) -> str:
    """Why the sweep's mode has no exact likelihood (its declaration's reason; tree modes: per construction)."""
    from real.decode.score import TREE_REASON

    return cfg.drafting.mode.no_likelihood or TREE_REASON
