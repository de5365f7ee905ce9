"""Fidelity to the target of every setting of a sweep, measured (docs/theory.md section 11).

For each chain setting s, from the images already stored:

* its own images x ~ P^_s: teacher-forced rows (``real.decode.score``), exact log P^_s(x) and log P(x), and the
  per-image TV bound from the image's own rounds (``theory.likelihood.path_bound``);
* the plain-AR images x ~ P: log P(x) and log P^_s(x) (the second, independent TV estimate).

P is the target's law as sampled, CFG- and temperature-processed (``Context.proc``), so ``nll_per_token`` =
-log P / T is the NLL under the law actually sampled. The AR images' rows are computed once per rank (one batch
at a time, the recursion run for every setting of that rank); each setting's per-image arrays are cached in
``DIR/fidelity/<slug>.npz`` (written atomically, keyed by setting, image count and code version), so an
interrupted merge resumes and the ranks share the work (setting i on rank i mod world). ``entries`` turns
them into the report's ``tv_to_target`` / ``kl_to_target`` / ``tv_bound_image`` (``theory.likelihood.fidelity.report``).
Static and dynamic trees and Jacobi drafting: not scored (``real.decode.score.TREE_REASON`` / ``JACOBI_REASON``).
"""
from __future__ import annotations

import io
import json

import numpy as np
import torch

from .run import Context, SweepConfig, Unit
from .store import Store

__all__ = ["shard", "entries", "score_images", "FORMAT"]

FORMAT = 1
BATCH = 50     # images per teacher-forced batch


def _path(s) -> str:
    return f"fidelity/{s.slug}.npz"


def _want(cfg: SweepConfig, ctx: Context, key: str) -> dict:
    return {"format": FORMAT, "key": key, "images": cfg.images, "code_version": ctx.code_version}


def _cached(store: Store, cfg, ctx, s) -> dict | None:
    path = store.root / _path(s)
    if not path.exists():
        return None
    try:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            if meta != _want(cfg, ctx, s.key):
                return None
            return {k: z[k] for k in z.files if k != "meta"}
    except (OSError, ValueError, KeyError):
        return None                               # damaged: recompute and overwrite


def _write(store: Store, cfg, ctx, s, arrays: dict) -> None:
    from .store import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(_want(cfg, ctx, s.key))), **arrays)
    path = store.root / _path(s)
    path.parent.mkdir(exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())


def _conds(ctx: Context, index: np.ndarray) -> list:
    """The conditions of images with global indices ``index`` (as ``Context.conds`` gives them per unit)."""
    u = ctx.cfg.unit_images
    return [ctx.conds(int(i) // u)[int(i) % u] for i in index]


def _proc(ctx: Context, s):
    from real.decode.methods import method_processing

    return method_processing(s.method, ctx.proc)


def _rule(ctx: Context, s):
    """The setting's verifier on the host (numpy tables: the likelihood is float64 theory code)."""
    from .run import host_tables

    return s.verifier(ctx.L, *host_tables(ctx))


def scored(ctx: Context) -> bool:
    """Whether the sweep's drafting has an exact likelihood (chain rounds of a drafter)."""
    return ctx.tree is None and getattr(ctx, "dynamic", None) is None and getattr(ctx, "jacobi", None) is None


def shard(store: Store, cfg: SweepConfig, ctx: Context, rank: int, world: int, load) -> int:
    """This rank's settings' fidelity arrays (computed, or found in the cache). Returns how many it holds.
    ``load(store, cfg, unit)`` reads a setting's merged images (``analysis.load``)."""
    from theory.likelihood.path_bound import round_offsets

    if not scored(ctx):
        return 0
    mine = list(cfg.settings)[rank::world]
    todo = [s for s in mine if _cached(store, cfg, ctx, s) is None]
    if not todo:
        return len(mine)
    b, L, T = ctx.bundle, ctx.L, ctx.bundle.num_tokens
    rules = {s.key: _rule(ctx, s) for s in todo}
    ar = load(store, cfg, Unit(None, 0))
    n_ar = len(ar["tokens"])
    ar_idx = np.arange(n_ar)
    same = [s for s in todo if _proc(ctx, s) == ctx.proc]      # AR images were sampled under ctx.proc
    sc = score_images(b.target, b.draft, _conds(ctx, ar_idx), ar["tokens"], {s.key: rules[s.key] for s in same}, L,
                      ctx.proc)
    lp_ar = sc["log_p"]
    lph_ar = {s.key: sc["log_p_hat"].get(s.key, np.full(n_ar, np.nan)) for s in todo}
    for s in todo:       # a loop over this rank's settings
        d = load(store, cfg, Unit(s, 0))
        n = len(d["tokens"])
        offset, drafting = round_offsets(d["round_image"], d["round_drafted"], d["round_accepted"], n, T)
        sc = score_images(b.target, b.draft, _conds(ctx, np.arange(n)), d["tokens"], {s.key: rules[s.key]}, L,
                          _proc(ctx, s), rounds=(offset, drafting))
        lp, lph, bound = sc["log_p"], sc["log_p_hat"][s.key], sc["bound"][s.key]
        _write(store, cfg, ctx, s, {"log_p_hat": lph, "log_p": lp, "bound": bound, "ar_log_p_hat": lph_ar[s.key],
                                    "ar_log_p": lp_ar, "ar_comparable": np.array(s in same)})
    return len(mine)


def score_images(target, draft, conds, tokens, rules: dict, L: int, proc, rounds=None, batch: int = BATCH) -> dict:
    """Exact per-image fidelity arrays of n images ``tokens`` (n, T) with conditions ``conds`` (n,): teacher-forced
    rows (``real.decode.score.teacher_forced_rows``) once per batch of ``batch`` images, then for every chain rule
    of ``rules`` ({key: verifier}) the recursion (``theory.likelihood.log_likelihood``) and, with ``rounds`` =
    (offset, drafting) (n, T) of the images' own rounds (``theory.likelihood.path_bound.round_offsets``), the per-image TV
    bound (``theory.likelihood.path_bound.image_path_bounds``). Returns {"log_p": (n,), "log_p_hat": {key: (n,)},
    "bound": {key: (n,)} (empty without ``rounds``)}, float64. Used by the sweep (``shard``) and the demo."""
    from real.decode.score import teacher_forced_rows
    from theory.likelihood import log_likelihood, log_target
    from theory.likelihood.path_bound import image_path_bounds

    tokens = np.asarray(tokens)
    n = len(tokens)
    if not all(m.batched for m in (target, draft) if m is not None):
        batch = 1                  # single-length models (the transformers adapters) score one image at a time
    lp = np.empty(n)
    lph = {k: np.empty(n) for k in rules}
    bound = {k: np.empty(n) for k in rules} if rounds is not None else {}
    for a in range(0, n, batch):   # a loop over batches of images: rows once, the recursion per rule
        tok = torch.as_tensor(tokens[a:a + batch])
        rows = teacher_forced_rows(target, draft, list(conds[a:a + batch]), tok, L=L, processing=proc)
        p, q, x = rows.p.cpu().numpy(), rows.q.cpu().numpy(), tok.numpy()
        lp[a:a + batch] = log_target(p, x)
        for k, rule in rules.items():   # a loop over the rules scored on these images
            lph[k][a:a + batch] = log_likelihood(p, q, x, rule, L, convention=rows.convention)
            if rounds is not None:
                bound[k][a:a + batch] = image_path_bounds(p, q, rounds[0][a:a + batch], rounds[1][a:a + batch], rule, L)
    return {"log_p": lp, "log_p_hat": lph, "bound": bound}


def entries(store: Store, cfg: SweepConfig, ctx: Context) -> tuple[dict, dict | None]:
    """({setting key: report fields}, AR baseline fields or None) from the cached arrays (rank 0, after every
    rank's ``shard``). Fields: ``tv_to_target``, ``kl_to_target``, ``kl_from_ar``, ``tv_bound_image``,
    ``bound_check`` (``theory.likelihood.fidelity.report``) and ``nll_per_token`` / ``_se`` under the processed target."""
    from theory.likelihood import fidelity

    if not scored(ctx):
        return {}, None
    T = ctx.bundle.num_tokens
    out, base = {}, None
    for s in cfg.settings:   # a loop over settings (each a few vectorised reductions)
        z = _cached(store, cfg, ctx, s)
        if z is None:
            raise ValueError(f"fidelity arrays of {s.key} missing from {store.root / 'fidelity'}: rerun the merge")
        ar = (z["ar_log_p_hat"], z["ar_log_p"]) if bool(z["ar_comparable"]) else None
        rep = fidelity.report((z["log_p_hat"], z["log_p"]), ar, T=T, bound_per_image=z["bound"])
        if ar is None:
            rep["tv_to_target"]["from_ar_reason"] = ("the setting's processing differs from the AR images' "
                                                     "(greedy rows): no AR sample of its target law")
        nll = -z["log_p"] / T
        rep["nll_per_token"] = float(nll.mean())
        rep["nll_per_token_se"] = float(nll.std(ddof=1) / np.sqrt(nll.size))
        out[s.key] = rep
        if base is None:
            nll = -z["ar_log_p"] / T
            base = {"nll_per_token": float(nll.mean()), "nll_per_token_se": float(nll.std(ddof=1) / np.sqrt(nll.size))}
    return out, base

