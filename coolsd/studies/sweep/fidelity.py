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
Trees (docs/theory.md section 11b): static trees and the release construction of dynamic trees are scored the same
way from their teacher-forced tree rows (``real.decode.score_tree``: rows indexed by round start, dynamic trees regrown
at every round start), KL both ways and TV with intervals; there is no per-image TV bound (the T11 path bound is a
chain's). Sampled static candidates above the exact path's cost guard and lossless dynamic trees are estimated
(sections 11c, 11d: T14, T15; the entry's ``kl_method`` is "mc", else "exact"); a setting whose construction has no
likelihood (greedy trees) gets its reason instead (``real.decode.score_tree.check``). Jacobi drafting: not
scored (``real.decode.score.JACOBI_REASON``).
"""
from __future__ import annotations

import io
import json

import numpy as np
import torch

from .run import Context, SweepConfig, Unit
from .store import Store

__all__ = ["shard", "entries", "score_images", "FORMAT"]

FORMAT = 3      # 2: tree settings (no bound; a reason where the construction has no exact likelihood); 3: sampled
#                 static trees above the cost guard estimated (T14) instead of a reason
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


def conds_of(ctx: Context, index: np.ndarray) -> list:
    """The conditions of images with global indices ``index`` (as ``Context.conds`` gives them per unit)."""
    u = ctx.cfg.unit_images
    return [ctx.conds(int(i) // u)[int(i) % u] for i in index]


def proc_of(ctx: Context, s):
    from real.decode.methods import method_processing

    return method_processing(s.method, ctx.proc)


def rule_of(ctx: Context, s):
    """The setting's verifier on the host (numpy tables: the likelihood is float64 theory code)."""
    from .run import host_tables

    return s.verifier(ctx.L, *host_tables(ctx))


def scored(ctx: Context) -> bool:
    """Whether the sweep's drafting can have an exact likelihood (a drafter's chains or trees; per setting the tree
    construction may still have none: ``_reason``): the mode declares it (``ModeDef.no_likelihood``)."""
    return ctx.cfg.drafting.mode.no_likelihood is None


def tree_mode(ctx: Context):
    """The sweep's tree mode (``StaticTree`` / ``DynamicTree``), or None for chains."""
    if ctx.tree is None and getattr(ctx, "dynamic", None) is None:
        return None
    return ctx.mode


def reason(ctx: Context, s, rule) -> str | None:
    """Why setting ``s`` has no exact likelihood under the sweep's tree mode, or None (chains: always None)."""
    if tree_mode(ctx) is None:
        return None
    try:                                       # the mode's likelihood hook (real.decode.modes)
        ctx.cfg.drafting.mode.likelihood(ctx.mode, rule, int(ctx.bundle.target.vocab_size), proc_of(ctx, s))
    except NotImplementedError as e:
        return str(e)
    return None


def method(ctx: Context, s) -> str:
    """The likelihood's method: "exact", or "mc" where setting ``s``'s log P^ is T14's estimate (``real.decode.score_tree.method``)."""
    from real.decode.score_tree import method as tree_method

    mode = tree_mode(ctx)
    return "exact" if mode is None else tree_method(mode, rule_of(ctx, s), int(ctx.bundle.target.vocab_size))


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
    mode = tree_mode(ctx)
    rules = {s.key: rule_of(ctx, s) for s in todo}
    reasons = {s.key: reason(ctx, s, rules[s.key]) for s in todo}
    for s in [s for s in todo if reasons[s.key] is not None]:   # no exact likelihood: the reason is stored
        _write(store, cfg, ctx, s, {"reason": np.array(reasons[s.key])})
    todo = [s for s in todo if reasons[s.key] is None]
    if not todo:
        return len(mine)
    ar = load(store, cfg, Unit(None, 0))
    n_ar = len(ar["tokens"])
    ar_idx = np.arange(n_ar)
    same = [s for s in todo if proc_of(ctx, s) == ctx.proc]      # AR images were sampled under ctx.proc
    sc = score_images(b.target, b.draft, conds_of(ctx, ar_idx), ar["tokens"], {s.key: rules[s.key] for s in same}, L,
                      ctx.proc, drafting=mode)
    lp_ar = sc["log_p"]
    lph_ar = {s.key: sc["log_p_hat"].get(s.key, np.full(n_ar, np.nan)) for s in todo}
    for s in todo:       # a loop over this rank's settings
        d = load(store, cfg, Unit(s, 0))
        n = len(d["tokens"])
        rounds = None
        if mode is None:   # chains: the per-image TV bound from the image's own rounds
            rounds = round_offsets(d["round_image"], d["round_drafted"], d["round_accepted"], n, T)
        sc = score_images(b.target, b.draft, conds_of(ctx, np.arange(n)), d["tokens"], {s.key: rules[s.key]}, L,
                          proc_of(ctx, s), rounds=rounds, drafting=mode)
        arrays = {"log_p_hat": sc["log_p_hat"][s.key], "log_p": sc["log_p"], "ar_log_p_hat": lph_ar[s.key],
                  "ar_log_p": lp_ar, "ar_comparable": np.array(s in same)}
        if rounds is not None:
            arrays["bound"] = sc["bound"][s.key]
        _write(store, cfg, ctx, s, arrays)
    return len(mine)


def score_images(target, draft, conds, tokens, rules: dict, L: int, proc, rounds=None, batch: int = BATCH,
                 drafting=None, on_device: bool = False) -> dict:
    """Exact per-image fidelity arrays of n images ``tokens`` (n, T) with conditions ``conds`` (n,): teacher-forced
    rows once per batch of ``batch`` images, then for every rule of ``rules`` ({key: verifier}) the recursion, and,
    for chains with ``rounds`` = (offset, drafting) (n, T) of the images' own rounds
    (``theory.likelihood.path_bound.round_offsets``), the per-image TV bound
    (``theory.likelihood.path_bound.image_path_bounds``). Chains (``drafting`` None, L drafts): rows
    ``real.decode.score.teacher_forced_rows``, recursion ``theory.likelihood.log_likelihood``; a tree mode
    (``drafting``: ``StaticTree``, release ``DynamicTree``): rows ``real.decode.score_tree.tree_rows``, recursion
    ``theory.likelihood.tree_log_likelihood`` (``score_tree.tree_likelihood``; no bound). Returns {"log_p": (n,),
    "log_p_hat": {key: (n,)}, "bound": {key: (n,)} (empty without ``rounds``)}, float64. ``on_device``: chains'
    recursion runs on the rows' own torch tensors (array API: a CUDA model's rows stay on the GPU; ``rules`` must then
    hold their tables as tensors there, e.g. ``Context.verifier``), else on numpy copies. The chains' rules are scored
    together (``theory.likelihood.chain.log_likelihoods``: the scaled rules from statistics of the rows formed once,
    one pass each; the same law as ``log_likelihood``, to float64 rounding). Used by the sweep
    (``shard``, ``predict.shard``) and the demo."""
    from real.decode.score import teacher_forced_rows
    from real.decode.score_tree import tree_likelihood, tree_rows
    from theory.likelihood import log_target
    from theory.likelihood.chain import log_likelihoods
    from theory.likelihood.path_bound import image_path_bounds

    tokens = np.asarray(tokens)
    n = len(tokens)
    tree = drafting is not None
    if tree and rounds is not None:
        raise ValueError("score_images: the per-image TV bound (rounds) is a chain's; tree drafting has none")
    if not all(m.batched and (not tree or m.row_masks) for m in (target, draft) if m is not None):
        batch = 1                  # single-length models (the transformers adapters) score one image at a time
    lp = np.empty(n)
    lph = {k: np.empty(n) for k in rules}
    bound = {k: np.empty(n) for k in rules} if rounds is not None else {}
    for a in range(0, n, batch):   # a loop over batches of images: rows once, the recursion per rule
        tok = torch.as_tensor(tokens[a:a + batch])
        x = tok.numpy()
        if tree:
            rows = tree_rows(target, draft, list(conds[a:a + batch]), tok, drafting, processing=proc)
            lp[a:a + batch] = log_target(rows.p.cpu().numpy(), x)
            for k, rule in rules.items():   # a loop over the rules scored on these images
                lph[k][a:a + batch] = tree_likelihood(rows, x, rule, drafting, seed=a)   # T14: draws by batch
            continue
        rows = teacher_forced_rows(target, draft, list(conds[a:a + batch]), tok, L=L, processing=proc)
        if on_device and rounds is None:
            xd = tok.to(rows.p.device)
            lp[a:a + batch] = log_target(rows.p, xd).cpu().numpy()
            for k, v in log_likelihoods(rows.p, rows.q, xd, rules, L, convention=rows.convention).items():
                lph[k][a:a + batch] = v.cpu().numpy()
            continue
        p, q = rows.p.cpu().numpy(), rows.q.cpu().numpy()
        lp[a:a + batch] = log_target(p, x)
        for k, v in log_likelihoods(p, q, x, rules, L, convention=rows.convention).items():
            lph[k][a:a + batch] = v
        for k, rule in rules.items() if rounds is not None else ():   # a loop over the rules: their TV bounds
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
        if "reason" in z:      # a tree construction without an exact likelihood
            out[s.key] = {"tv_to_target": None, "kl_to_target": None, "kl_from_ar": None, "tv_bound_image": None,
                          "fidelity_reason": str(z["reason"])}
            continue
        ar = (z["ar_log_p_hat"], z["ar_log_p"]) if bool(z["ar_comparable"]) else None
        rep = fidelity.report((z["log_p_hat"], z["log_p"]), ar, T=T, bound_per_image=z.get("bound"))
        if ar is None:
            rep["tv_to_target"]["from_ar_reason"] = ("the setting's processing differs from the AR images' "
                                                     "(greedy rows): no AR sample of its target law")
        rep["kl_method"] = method(ctx, s)
        nll = -z["log_p"] / T
        rep["nll_per_token"] = float(nll.mean())
        rep["nll_per_token_se"] = float(nll.std(ddof=1) / np.sqrt(nll.size))
        out[s.key] = rep
        if base is None:
            nll = -z["ar_log_p"] / T
            base = {"nll_per_token": float(nll.mean()), "nll_per_token_se": float(nll.std(ddof=1) / np.sqrt(nll.size))}
    return out, base

