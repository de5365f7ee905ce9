"""Teacher-forced rows of already-generated images: the rows the engine would have verified on each image's own
path (chains: ``teacher_forced_rows``; docs/theory.md section 11). The module docstring of ``real.decode.score``
states what each row is; ``real.decode.score`` (chains) and ``real.decode.score_tree`` (trees) both read rows from
here, so neither imports the other. Drives models only through ``real.protocol``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


from real.nn.layers import inference_weights
from real.protocol import as_batched, as_conds, check_pair
from .sampling import Processing
from .sampling import per_model_rows as _rows

__all__ = ["Rows", "teacher_forced_rows", "scoring_inputs", "chain_rows"]


@dataclass
class Rows:
    """Teacher-forced rows of B images: ``p`` (B, T, V); ``q`` (B, T, V) (offset-independent draft),
    (B, T, L, V) (EAGLE: [:, t, i-1] = the i-th draft's row) or None (no draft); ``convention`` for
    ``theory.likelihood.log_likelihood`` ("theory" or "eagle")."""
    p: torch.Tensor
    q: torch.Tensor | None
    convention: str


def scoring_inputs(target, draft, conds, tokens) -> tuple[list, torch.Tensor]:
    """The inputs every scoring entry takes (``real.decode.score.score``, ``score_tree.score_trees``, ``tree_rows``,
    ``teacher_forced_rows``), checked once there: (``conds`` as a list of one kind of condition
    (``real.protocol.as_conds``), ``tokens`` as an int64 (n, T) tensor, T >= 1, n = the number of conditions, every
    token in [0, V) of the target); a draft (when given) over the target's vocabulary (``real.protocol.check_pair``).
    ValueError naming what is wrong. The entries' inner steps (``chain_rows``, ``score_tree``'s) take these values as
    they are."""
    conds = as_conds(conds)
    if draft is not None:
        check_pair(target, draft)
    t, n, V = torch.as_tensor(tokens), len(conds), int(target.vocab_size)
    if t.is_floating_point() or t.dtype == torch.bool or t.ndim != 2:
        raise ValueError(f"tokens must be an int (images, T) array, got dtype {t.dtype} shape {tuple(t.shape)}")
    if t.shape[0] != n:
        raise ValueError(f"tokens has {t.shape[0]} images but {n} conditions were given")
    if t.shape[1] < 1:
        raise ValueError(f"tokens must have T = >= 1 columns, got {t.shape[1]}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
        raise ValueError(f"tokens must lie in [0, V = {V}), got values in [{int(t.min())}, {int(t.max())}]")
    return conds, t.long()


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
    conds, tok = scoring_inputs(target, draft, conds, tokens)
    if not isinstance(processing, Processing):
        raise ValueError(f"processing must be a real.decode.sampling.Processing, got {type(processing).__name__}")
    feat = draft is not None and bool(getattr(draft, "needs_features", False))
    if feat and (isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1):
        raise ValueError(f"an EAGLE drafter's rows depend on the round offset: L must be an int >= 1, got {L!r}")
    B = tok.shape[0]
    for m in (target, draft):
        if m is not None and B > 1 and not m.batched:
            raise ValueError(f"{type(m).__name__} scores one image at a time (its cache has no per-row lengths): "
                             f"got {B} images")
    return chain_rows(target, draft, conds, tok, L, processing)


@torch.no_grad()
def chain_rows(target, draft, conds: list, tok: torch.Tensor, L: int | None, processing: Processing) -> Rows:
    """``teacher_forced_rows`` of inputs its callers checked (``scoring_inputs``; L an int >= 1 for an EAGLE
    drafter; one image at a time for a model without per-row cache lengths): ``conds`` a list of B conditions,
    ``tok`` (B, T) int64."""
    B, T = tok.shape
    feat = draft is not None and bool(getattr(draft, "needs_features", False))
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
