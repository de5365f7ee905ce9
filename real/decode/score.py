"""Teacher-forced rows and exact likelihoods of already-generated images (docs/theory.md section 11).

For images x (B, T) that some run produced, ``teacher_forced_rows`` gives the processed rows the engine
would have verified if it had walked each image's own path:

* ``p`` (B, T, V): the target's rows P(. | x_<t), one target prefill over [prefix; x_0 .. x_{T-2}];
* ``q`` for chain drafting:
  - an independent or layer-skip draft (an ``ARModel``): (B, T, V), Q(. | x_<t) from one prefill of the draft
    (its row for token t does not depend on where t falls in a round: the tokens it drafted before t in the
    round are x's own tokens, since they were accepted); the engine drafts from round 0, the theory's
    convention (``theory.likelihood``, ``convention="theory"``);
  - an EAGLE-1 drafter (a ``FeatureDrafter``): (B, T, L, V), q[:, t, i-1] = its row when token t is the i-th
    draft of a round (the round started with n = t - i + 1 tokens). At offset 1 the drafter has seen only
    the pairs (x_j, h_{P+j-1}) of committed tokens, j < n (``real.decode.steps.feed_draft``: one pass over
    the whole image gives these rows for every t); at offset i > 1 it has also appended its own pairs
    (x_{n+k-1}, f_{k-1}) for k = 1..i-1 (``draft_chain``), f_0 its own feature after the committed pairs,
    f_k its output at the k-th appended pair. Pass k = 1..L-1 appends one such pair per round start n
    (n = 1..T-2-k) to the drafter's cache in ONE batched forward, each pair attending to the committed
    pairs before its start (an attention mask over the cached pass-1 block) and to its own chain of earlier
    passes: L drafter forwards in all. Token 0 is the target's (round 0 = the prefill alone), the engine's
    EAGLE convention (``convention="eagle"``).

Processing (CFG pair, temperature, top-k/p) is the engine's own ``Processing`` object applied to the same
logits (``proc.rows``); rows are float32 (``Processing.dtype``). End-of-image truncation L' = min(L, T-n-1)
is the likelihood's (``theory.likelihood.round_masks``): entries of q no round can read stay uniform.

``score`` turns the rows into per-image log P^(x) (``theory.likelihood.log_likelihood``) and log P(x)
(``log_target``), batch by batch. Tree modes (``drafting=``: a ``StaticTree``, ``DynamicTree`` or ``theory.tree.Tree``)
go to ``real.decode.score_tree`` (their rows indexed by round start, T13); what has no exact likelihood (lossless
dynamic trees, greedy trees, sampled static candidates above the cost guard) raises NotImplementedError before any
model call.

This module imports no model: ``score`` reads the models once at its entry (``forced_rows.scoring_inputs``, the
batched protocol of ``real.protocol``, like the engine) and hands them to the row makers, which feed them through
one call (``forced_rows.Forced.rows``).
"""
from __future__ import annotations


import numpy as np
import torch

from theory.likelihood import check_chain_rule, log_likelihood, log_target
from theory.tree import Tree

from .forced_rows import Rows, chain_rows, scoring_inputs, teacher_forced_rows
from .jacobi import JACOBI_REASON
from .sampling import Processing
from .score_tree import scored, tree_scores
from .tree import StaticTree

__all__ = ["Rows", "teacher_forced_rows", "score", "summary", "TREE_REASON", "JACOBI_REASON"]

TREE_REASON = ("the likelihood of tree drafting covers static trees (top-k candidates; sampled candidates: exact "
               "within theory.likelihood.tree's cost guard, a Monte Carlo estimate above it) and the release "
               "construction of dynamic trees "
               "(real.decode.score_tree); lossless dynamic trees (stochastic-beam keys) and greedy trees have none")
def score(target, draft, conds, tokens, *, verifier=None, drafting=None, processing: Processing = Processing(),
          batch_size: int = 64) -> dict:
    """Exact per-image log-likelihoods of already-generated ``tokens`` (n, T) under the target and under speculative
    decoding with ``draft``, ``verifier`` and ``drafting`` (the law a ``real.decode.engine.generate`` run samples
    from with the same ``processing``): the drafting is one value, as ``generate`` takes it: an int L or a
    ``Chain`` (chains of L drafts, T8), or a tree mode (``StaticTree``, ``DynamicTree``, a ``theory.tree.Tree``),
    scored by ``real.decode.score_tree``; None only without a draft (plain AR). Returns {"log_p": (n,) float64
    log P(x), "log_p_hat": (n,) float64 log P^(x) (None without a draft)}; ``batch_size`` images per teacher-forced
    batch. Bad input (tokens outside V, a verifier without a chain rule, a drafting that is none of these) is refused
    with ValueError, a construction without an exact likelihood with NotImplementedError, before any model call."""
    m, conds, tok = scoring_inputs(target, draft, conds, tokens, processing)    # the models, once for every path
    L, mode = scored(StaticTree(drafting) if isinstance(drafting, Tree) else drafting, draft)   # (as generate reads it)
    if mode is not None:
        return tree_scores(m, conds, tok, verifier, mode, batch_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if draft is not None:
        check_chain_rule(verifier, "score")
        if L is None or L < 1:
            raise ValueError(f"drafting must be an int L >= 1 (drafts per round), a Chain or a tree mode to score "
                             f"speculative decoding, got {L!r}")
    if not m.batched:
        batch_size = 1
    lp, lph = [], []
    for a in range(0, len(conds), batch_size):   # a loop over batches of images
        rows = chain_rows(m, conds[a:a + batch_size], tok[a:a + batch_size], L)
        # the recursion on the host, as the engine verifies CPU rows (rules may hold numpy tables: LANTERN's)
        p, x = rows.p.cpu().numpy(), tok[a:a + batch_size].numpy()
        lp.append(log_target(p, x))
        if draft is not None:
            lph.append(log_likelihood(p, rows.q.cpu().numpy(), x, verifier, int(L), convention=rows.convention))
    return {"log_p": np.concatenate(lp), "log_p_hat": np.concatenate(lph) if draft is not None else None}


def summary(target, draft, conds, tokens, *, verifier=None, drafting=None, processing: Processing = Processing(),
            batch_size: int = 64, ar_conds=None, ar_tokens=None) -> dict:
    """``score`` plus the summaries ``coolsd generate --fidelity`` prints: {"log_p_hat", "log_p" (n,) arrays
    (plain AR, draft None: log_p_hat = log_p), "report": {"nll_per_token", "images", "kl_per_token" (KL(P^||P) per
    token from these images, with its interval: the fidelity axis that scales with length), "tv_to_target",
    "kl_to_target"} (``theory.likelihood.fidelity``; with fewer than 2 images a "reason" instead)}. With plain-AR
    images ``ar_tokens`` (m, T) (conditions ``ar_conds``) also "kl_ar_per_token" (KL(P||P^) per token) and the TV from
    them (``tv_to_target.from_ar``). ``drafting``: as ``score``."""
    from theory.likelihood import fidelity

    sets = [(conds, tokens)]               # the images, and the plain-AR images when given (scored alike)
    if ar_tokens is not None and draft is not None and len(ar_tokens) >= 2:
        sets.append((ar_conds, ar_tokens))
    s, *a = (score(target, draft, c, x, verifier=verifier, drafting=drafting, processing=processing,
                   batch_size=batch_size) for c, x in sets)
    ar = (a[0]["log_p_hat"], a[0]["log_p"]) if a else None
    if s["log_p_hat"] is None:             # plain AR samples the target itself
        s["log_p_hat"] = s["log_p"].copy()
    T = int(torch.as_tensor(tokens).shape[1])
    n = s["log_p"].size
    rep = {"nll_per_token": float(np.mean(-s["log_p"] / T)), "images": int(n), "kl_method": s.get("kl_method", "exact")}
    if rep["kl_method"] == "mc":           # T14 / T15: the KL intervals below include the Monte Carlo error (11c)
        se = s["log_p_hat_se"]
        fin = se[np.isfinite(se)]          # an infinite SE: a jackknife group emptied a needed row (tree_mc)
        rep["mc"] = {**s["mc"], "se_log_p_hat_max": float(np.max(fin)) if fin.size else None,
                     "se_log_p_hat_rms": float(np.sqrt(np.mean(fin ** 2))) if fin.size else None,
                     "se_infinite": int(se.size - fin.size),
                     "note": "KL: unbiased to second order, its interval includes the Monte Carlo error; TV: "
                             "(1 - P/P^)_+ of an estimate, biased by the Monte Carlo error (docs/theory.md 11c, 11d)"}
    if n >= 2:
        full = fidelity.report((s["log_p_hat"], s["log_p"]), ar, T=T)
        rep |= {k: full[k] for k in ("tv_to_target", "kl_to_target")}
        rep["kl_per_token"] = full["kl_to_target"].get("per_token")
        if ar is not None:
            rep["kl_ar_per_token"] = full["kl_from_ar"].get("per_token")
    else:
        rep["reason"] = "TV / KL need at least 2 images for an interval"
    return {**s, "report": rep}
