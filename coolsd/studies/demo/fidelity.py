"""Fidelity to the target of every demo run, measured exactly (docs/theory.md section 11; issue 25).

For each chain run: teacher-forced rows of its own images give log P^(x) and log P(x) (KL(P^||P), TV from the SD
images) and, from the image's own rounds, the predicted per-image TV bound; the plain-AR images scored under the
same rule give the second, independent TV estimate E_P[(1 - P^/P)_+]. The scoring is the sweep's
(``coolsd.studies.sweep.fidelity.score_images``), the summaries ``theory.likelihood.fidelity.report``. All runs sample the
same processed target (CFG, temperature: ``Settings``), so the AR images are a sample of every run's P.
Static-tree runs are scored the same way from their tree rows (``real.decode.score_tree``; KL both ways and TV, no
per-image bound); sampled candidates above the exact path's cost guard (EAGLE-1's 4 root candidates at V = 512)
are estimated (docs/theory.md section 11c, T14: ``kl_method`` "mc", else "exact") when ``Settings.tree_mc`` (``--tree-mc``)
asks for it; a tree run whose construction has no likelihood, or whose estimate was not asked for (``MC_SKIPPED``),
gets the reason instead.
"""
from __future__ import annotations

import numpy as np

__all__ = ["round_arrays", "fidelity_entries", "target_scores"]


def round_arrays(gens, T: int) -> tuple[np.ndarray, np.ndarray]:
    """(offset, drafting) (n, T) of chain generations ``gens`` (``real.decode.engine.Generation``) from their
    recorded rounds (``theory.likelihood.path_bound.round_offsets``)."""
    from theory.likelihood.path_bound import round_offsets

    rounds = [(i, r) for i, g in enumerate(gens) for r in g.rounds]
    return round_offsets(np.array([i for i, _ in rounds], np.int64), np.array([r.drafted for _, r in rounds], np.int64),
                         np.array([r.accepted for _, r in rounds], np.int64), len(gens), T)


MC_SKIPPED = ("sampled tree candidates above the exact sum's cost guard are scored by Monte Carlo (docs/theory.md "
              "section 11c, T14), which is not run by default: it adds about 10 minutes on 2 cores to the demo's 5; "
              "coolsd demo --tree-mc runs it, as does coolsd generate --fidelity")


def fidelity_entries(s, runs, results, target, drafts, classes, proc, T: int) -> dict:
    """{run key: {"tv_to_target", "kl_to_target", "kl_from_ar", "tv_bound_image", "bound_check"}} for the chain
    runs, the same without the bound for tree runs (``s.tree_mode()``), {"fidelity_reason": ...} for tree runs without
    an exact likelihood. ``results[key].extra["rounds"]`` holds a chain run's (offset, drafting); ``results["ar"].tokens``
    the plain-AR images."""
    from real.decode.score_tree import check, method
    from theory.likelihood import fidelity

    from ..sweep.fidelity import score_images

    out = {}
    ar_tok = results["ar"].tokens.numpy()
    mode = s.tree_mode()
    tree = []
    V = int(target.vocab_size)
    for sp in [sp for sp in runs if sp.tree_drafted]:   # a loop over tree runs: the constructions scored
        try:
            check(mode, sp.rule, V, proc)
        except NotImplementedError as e:
            out[sp.key] = {"fidelity_reason": str(e)}
            continue
        if method(mode, sp.rule, V) == "mc" and not s.tree_mc:
            out[sp.key] = {"fidelity_reason": MC_SKIPPED}
        else:
            tree.append(sp)
    for m, group in ((None, [sp for sp in runs if not sp.tree_drafted]), (mode, tree)):   # chains, then trees
        for draft in sorted({sp.draft for sp in group}):   # a loop over draft kinds (AR rows need each draft's q)
            mine = [sp for sp in group if sp.draft == draft]
            ar = score_images(target, drafts[draft], classes, ar_tok, {sp.key: sp.rule for sp in mine}, s.L, proc,
                              drafting=m)
            for sp in mine:   # a loop over this draft's runs
                res = results[sp.key]
                sc = score_images(target, drafts[draft], classes, res.tokens.numpy(), {sp.key: sp.rule}, s.L, proc,
                                  rounds=res.extra.get("rounds") if m is None else None, drafting=m)
                out[sp.key] = fidelity.report((sc["log_p_hat"][sp.key], sc["log_p"]),
                                              (ar["log_p_hat"][sp.key], ar["log_p"]), T=T,
                                              bound_per_image=sc["bound"][sp.key] if m is None else None)
                out[sp.key]["kl_method"] = "exact" if m is None else method(m, sp.rule, int(target.vocab_size))
    return out


def target_scores(s, runs_out: dict, tick=None, models=None) -> dict:
    """What the demo measures with the target's own forward passes over the generated codes, apart from the
    predictions so that it can run in a worker of its own (``coolsd.workers.Spawned``; ``run_demo`` with
    ``Settings.workers`` > 1): {"fidelity": ``fidelity_entries``, "fidelity_s": its seconds, "nll": {"ar" or a run's
    key: ``coolsd.studies.demo.quality.nll_with_se`` of its codes}}. ``runs_out`` {"ar" or a run's key: (tokens (n, T)
    int64 tensor, extra)} of the generation; ``models`` ``generation.models_and_runs(s)`` (rebuilt from the settings
    ``s`` when None, as in a worker, with ``s.threads`` torch threads)."""
    import time
    from types import SimpleNamespace

    import torch

    from real.decode.sampling import Processing

    from .generation import digit_classes, models_and_runs
    from .quality import nll_with_se
    from .settings import T_IMAGE

    if models is None:
        torch.set_num_threads(s.threads)
        models = models_and_runs(s)
    target, drafts, runs = models
    classes = digit_classes(s)
    labels = torch.tensor(classes)
    nll = {k: nll_with_se(target, labels, tok) for k, (tok, _) in runs_out.items()}
    t0 = time.perf_counter()
    results = {k: SimpleNamespace(tokens=tok, extra=extra) for k, (tok, extra) in runs_out.items()}
    proc = Processing(temperature=s.temperature, cfg_scale=s.cfg_scale)
    fid = fidelity_entries(s, runs, results, target, drafts, classes, proc, T_IMAGE)
    return {"fidelity": fid, "fidelity_s": time.perf_counter() - t0, "nll": nll}
