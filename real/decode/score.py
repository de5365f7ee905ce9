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

This module drives models only through ``real.protocol`` (like the engine) and imports none.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from theory.likelihood import check_chain_rule, log_likelihood, log_target

from real.nn.layers import inference_weights
from real.protocol import as_batched, as_conds, check_pair
from .sampling import Processing

__all__ = ["Rows", "teacher_forced_rows", "score", "summary", "TREE_REASON", "JACOBI_REASON"]

TREE_REASON = ("exact likelihood of tree drafting covers static trees (top-k candidates; sampled candidates within "
               "theory.likelihood.tree's cost guard) and the release construction of dynamic trees "
               "(real.decode.score_tree); lossless dynamic trees (stochastic-beam keys) and greedy trees have none")
JACOBI_REASON = ("exact likelihood of Jacobi drafting is not tractable: a draft's q is the target's row from the "
                 "previous iteration, conditioned on window tokens that are not in the output, so the hidden state "
                 "holds up to W - 1 stale tokens (docs/theory.md section 12); score a drafter's chain runs instead")


@dataclass
class Rows:
    """Teacher-forced rows of B images: ``p`` (B, T, V); ``q`` (B, T, V) (offset-independent draft),
    (B, T, L, V) (EAGLE: [:, t, i-1] = the i-th draft's row) or None (no draft); ``convention`` for
    ``theory.likelihood.log_likelihood`` ("theory" or "eagle")."""
    p: torch.Tensor
    q: torch.Tensor | None
    convention: str


def _check_tokens(tokens, n: int, V: int, T: int | None) -> torch.Tensor:
    t = torch.as_tensor(tokens)
    if t.is_floating_point() or t.dtype == torch.bool or t.ndim != 2:
        raise ValueError(f"tokens must be an int (images, T) array, got dtype {t.dtype} shape {tuple(t.shape)}")
    if t.shape[0] != n:
        raise ValueError(f"tokens has {t.shape[0]} images but {n} conditions were given")
    if t.shape[1] < 1 or (T is not None and t.shape[1] != T):
        raise ValueError(f"tokens must have T = {T if T is not None else '>= 1'} columns, got {t.shape[1]}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
        raise ValueError(f"tokens must lie in [0, V = {V}), got values in [{int(t.min())}, {int(t.max())}]")
    return t.long()


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """Per-image (B, ...) -> per-model-row (k B, ...) ([cond; uncond] with CFG), as ``real.decode.steps.Run.rows``."""
    return x if k == 1 else x.repeat(k, *([1] * (x.ndim - 1)))


@torch.no_grad()
def teacher_forced_rows(target, draft, conds, tokens, *, L: int | None = None, processing: Processing = Processing(),
                        tree=None) -> Rows:
    """The rows of B images ``tokens`` (B, T) with conditions ``conds`` (module docstring). ``draft`` None: the
    target's rows only (q None); an ``ARModel``: q (B, T, V); a ``FeatureDrafter``: q (B, T, L, V) (needs L).
    All B images in one batch (``score`` splits larger sets); a model without per-row cache lengths needs B = 1.
    Tree modes: ``real.decode.score_tree.tree_rows`` (``tree`` is refused here: its rows are indexed by round start)."""
    if tree is not None:
        raise ValueError("teacher_forced_rows gives chain rows (indexed by token and offset); tree rows are indexed by "
                         "round start: real.decode.score_tree.tree_rows")
    conds = as_conds(conds)
    if not isinstance(processing, Processing):
        raise ValueError(f"processing must be a real.decode.sampling.Processing, got {type(processing).__name__}")
    feat = draft is not None and bool(getattr(draft, "needs_features", False))
    if draft is not None:
        check_pair(target, draft)
    if feat and (isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1):
        raise ValueError(f"an EAGLE drafter's rows depend on the round offset: L must be an int >= 1, got {L!r}")
    tok = _check_tokens(tokens, len(conds), int(target.vocab_size), None)
    B, T = tok.shape
    for m in (target, draft):
        if m is not None and B > 1 and not m.batched:
            raise ValueError(f"{type(m).__name__} scores one image at a time (its cache has no per-row lengths): "
                             f"got {B} images")
    target, draft = as_batched(target), as_batched(draft)
    proc, k = processing, processing.batch
    dev = torch.device(getattr(target, "device", "cpu") or "cpu")
    tok = tok.to(dev)
    # the engine's fast paths (real.nn.layers.linear) and inference mode, as in generate; the rows are cloned
    # outside it (ordinary tensors the caller may write to)
    with inference_weights(), torch.inference_mode():
        o = target.prefill(conds, _rows(tok[:, :T - 1], k), cfg=proc.cfg, return_hidden=feat)
        p = proc.rows(o.logits)                                                   # (B, T, V)
        if draft is None:
            q, kind = None, "theory"
        elif not feat:                     # independent / layer-skip draft: offset-independent rows
            q, kind = proc.rows(draft.prefill(conds, _rows(tok[:, :T - 1], k), cfg=proc.cfg).logits), "theory"
        else:
            q, kind = _eagle_rows(draft, o.hidden, tok, int(L), proc, dev), "eagle"
    return Rows(p.clone(), None if q is None else q.clone(), kind)


def _eagle_rows(draft, hidden: torch.Tensor, tok: torch.Tensor, L: int, proc: Processing, dev) -> torch.Tensor:
    """q (B, T, L, V) of a feature drafter from the target's hidden states (R, P + T - 1, D) along the images
    tok (B, T) (module docstring; element e = (token at target position e + 1, h_e), position e)."""
    B, T = tok.shape
    k = proc.batch
    R, V = hidden.shape[0], int(draft.vocab_size)
    P = hidden.shape[1] - (T - 1)
    q = torch.full((B, T, L, V), 1.0 / V, dtype=proc.dtype, device=dev)   # never-read entries: uniform rows
    if T <= 2:                              # no round can draft (L' = min(L, T - n - 1) = 0 for n >= 1)
        return q
    E = P + T - 2                           # committed pairs e = 0 .. P + T - 3 (the last predicts token T - 1)
    sizes = [T - 2 - j for j in range(1, L) if T - 2 - j >= 1]             # pass j: starts n = 1 .. T - 2 - j
    draft.start(P, R, extra=sum(sizes))
    ids = torch.cat([torch.zeros(B, P - 1, dtype=torch.long, device=dev), tok[:, :T - 1]], 1)   # prefix pairs: id 0
    o = draft.forward(_rows(ids, k), features=hidden[:, :E], position_ids=np.tile(np.arange(E), (R, 1)))
    # offset 1: token t (1 <= t <= T - 2) follows the pair of x_{t-1}, element P + t - 2
    q[:, 1:T - 1, 0] = proc.rows(o.logits[:, P - 1:E - 1])
    feats = o.hidden[:, P - 1:E - 1]         # (R, T - 2, D) f_0 for starts n = 1 .. T - 2
    n = torch.arange(1, T - 1, device=dev)   # round starts
    M = T - 2                                # the cached committed pairs a start may hide: e = P .. P + T - 3
    blocks: list[int] = []
    for j, S in enumerate(sizes, start=1):   # a loop over the L - 1 appended draft offsets (each batched over starts)
        nn = n[:S]
        x = tok[:, nn + j - 1]                                           # (B, S): x_{n+j-1}
        pos = np.tile(P + nn.cpu().numpy() + j - 2, (R, 1))
        mask = _pass_mask(nn, M, blocks, S, dev)
        o = draft.forward(_rows(x, k), features=feats[:, :S], position_ids=pos, attn_mask=mask)
        q[:, nn + j, j] = proc.rows(o.logits)                            # token t = n + j as the (j+1)-th draft
        feats = o.hidden
        blocks.append(S)
    return q


def _pass_mask(n: torch.Tensor, M: int, blocks: list[int], S: int, dev) -> torch.Tensor:
    """(S, M + sum(blocks) + S) bool for the starts n (S,): pair (n, j) of the current pass sees the committed
    pairs P .. P + n - 2 (columns c < n - 1 of the first M), its own start's pairs in the earlier passes, and
    itself."""
    cols = [torch.arange(M, device=dev)[None, :] < (n[:, None] - 1)]
    for b in blocks:                          # a loop over the earlier passes (at most L - 2)
        cols.append(torch.arange(b, device=dev)[None, :] == torch.arange(S, device=dev)[:, None])
    cols.append(torch.eye(S, dtype=torch.bool, device=dev))
    return torch.cat(cols, 1)


def score(target, draft, conds, tokens, *, verifier=None, L: int | None = None, processing: Processing = Processing(),
          batch_size: int = 64, drafting=None, tree=None) -> dict:
    """Exact per-image log-likelihoods of already-generated ``tokens`` (n, T) under the target and under speculative
    decoding with ``draft``, ``verifier`` and the drafting (the law a ``real.decode.engine.generate`` run samples
    from with the same ``processing``): chains of L drafts, or ``drafting`` a tree mode (``StaticTree``,
    ``DynamicTree``, a ``theory.tree.Tree``; ``tree`` is the same argument under its old name), scored by
    ``real.decode.score_tree``. Returns {"log_p": (n,) float64 log P(x), "log_p_hat": (n,) float64 log P^(x) (None
    without a draft)}; ``batch_size`` images per teacher-forced batch. Bad input (tokens outside V, a verifier without
    a chain rule) is refused with ValueError, a construction without an exact likelihood with NotImplementedError,
    before any model call."""
    from .chain import Chain

    if tree is not None and drafting is not None:
        raise ValueError("give drafting= or tree=, not both")
    drafting = tree if tree is not None else drafting
    if isinstance(drafting, Chain):
        drafting, L = None, drafting.L
    elif isinstance(drafting, (int, np.integer)) and not isinstance(drafting, bool):
        drafting, L = None, int(drafting)
    if drafting is not None:
        from .score_tree import score_trees, tree_mode

        if tree_mode(drafting) is None:
            raise ValueError(f"drafting must be an int L, a Chain or a tree mode (StaticTree, DynamicTree, "
                             f"theory.tree.Tree), got {type(drafting).__name__}")
        if draft is None:
            raise ValueError("tree scoring needs the draft model the trees were drafted with")
        return score_trees(target, draft, conds, tokens, verifier=verifier, drafting=drafting, processing=processing,
                           batch_size=batch_size)
    conds = as_conds(conds)
    tok = _check_tokens(tokens, len(conds), int(target.vocab_size), None)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if draft is not None:
        check_chain_rule(verifier, "score")
        if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
            raise ValueError(f"L must be an int >= 1 (drafts per round), got {L!r}")
        check_pair(target, draft)
    if not all(m.batched for m in (target, draft) if m is not None):
        batch_size = 1
    lp, lph = [], []
    for a in range(0, len(conds), batch_size):   # a loop over batches of images
        rows = teacher_forced_rows(target, draft, conds[a:a + batch_size], tok[a:a + batch_size], L=L,
                                   processing=processing)
        # the recursion on the host, as the engine verifies CPU rows (rules may hold numpy tables: LANTERN's)
        p, x = rows.p.cpu().numpy(), tok[a:a + batch_size].numpy()
        lp.append(log_target(p, x))
        if draft is not None:
            lph.append(log_likelihood(p, rows.q.cpu().numpy(), x, verifier, int(L), convention=rows.convention))
    return {"log_p": np.concatenate(lp), "log_p_hat": np.concatenate(lph) if draft is not None else None}


def summary(target, draft, conds, tokens, *, verifier=None, L: int | None = None,
            processing: Processing = Processing(), batch_size: int = 64, drafting=None, ar_conds=None,
            ar_tokens=None) -> dict:
    """``score`` plus the summaries ``coolsd generate --fidelity`` prints: {"log_p_hat", "log_p" (n,) arrays
    (plain AR, draft None: log_p_hat = log_p), "report": {"nll_per_token", "images", "kl_per_token" (KL(P^||P) per
    token from these images, with its interval: the fidelity axis that scales with length), "tv_to_target",
    "kl_to_target"} (``theory.likelihood.fidelity``; with fewer than 2 images a "reason" instead)}. With plain-AR
    images ``ar_tokens`` (m, T) (conditions ``ar_conds``) also "kl_ar_per_token" (KL(P||P^) per token) and the TV from
    them (``tv_to_target.from_ar``). ``drafting``: as ``score`` (chains of L when None)."""
    from theory.likelihood import fidelity

    s = score(target, draft, conds, tokens, verifier=verifier, L=L, processing=processing, batch_size=batch_size,
              drafting=drafting)
    if s["log_p_hat"] is None:             # plain AR samples the target itself
        s["log_p_hat"] = s["log_p"].copy()
    T = int(torch.as_tensor(tokens).shape[1])
    n = s["log_p"].size
    rep = {"nll_per_token": float(np.mean(-s["log_p"] / T)), "images": int(n)}
    ar = None
    if ar_tokens is not None and draft is not None and len(ar_tokens) >= 2:
        a = score(target, draft, ar_conds, ar_tokens, verifier=verifier, L=L, processing=processing,
                  batch_size=batch_size, drafting=drafting)
        ar = (a["log_p_hat"], a["log_p"])
    if n >= 2:
        full = fidelity.report((s["log_p_hat"], s["log_p"]), ar, T=T)
        rep |= {k: full[k] for k in ("tv_to_target", "kl_to_target")}
        rep["kl_per_token"] = full["kl_to_target"].get("per_token")
        if ar is not None:
            rep["kl_ar_per_token"] = full["kl_from_ar"].get("per_token")
    else:
        rep["reason"] = "TV / KL need at least 2 images for an interval"
    return {**s, "report": rep}
