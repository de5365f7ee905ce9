"""Teacher-forced rows of already-generated images: the rows the engine would have verified on each image's own
path (chains: ``teacher_forced_rows``; docs/theory.md section 11). The module docstring of ``real.decode.score``
states what each row is; ``real.decode.score`` (chains) and ``real.decode.score_tree`` (trees) both read rows from
here, so neither imports the other. The models are read once at scoring's entry (``scoring_inputs``: ``Forced``, the
batched protocol of ``real.protocol``) and fed through one call, ``Forced.rows`` (tokens in, processed rows out), by
the chain rows here, the tree rows of ``real.decode.score_tree`` and the regrown trees of ``real.decode.regrow``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


from real.nn.layers import inference_weights
from real.protocol import as_batched, as_conds, check_pair
from .sampling import Processing
from .sampling import per_model_rows as _rows

__all__ = ["Rows", "Forced", "teacher_forced_rows", "scoring_inputs", "chain_rows"]


@dataclass
class Rows:
    """Teacher-forced rows of B images: ``p`` (B, T, V); ``q`` (B, T, V) (offset-independent draft),
    (B, T, L, V) (EAGLE: [:, t, i-1] = the i-th draft's row) or None (no draft); ``convention`` for
    ``theory.likelihood.log_likelihood`` ("theory" or "eagle")."""
    p: torch.Tensor
    q: torch.Tensor | None
    convention: str


@dataclass(frozen=True)
class Forced:
    """The models of one scoring call as every scorer drives them, made once at scoring's entry (``scoring_inputs``):
    ``target`` and ``draft`` in the batched protocol (``real.protocol.as_batched``; ``draft`` None without one),
    ``proc`` the processing, ``dev`` the target's device, ``batched`` (every given model keeps per-row cache lengths:
    several images per batch) and ``row_masks`` (every given model also takes per-row tree masks: dynamic trees at
    B > 1). ``rows`` is the one model call of scoring (chains here, static and dynamic trees in
    ``real.decode.score_tree`` and ``real.decode.regrow``)."""
    target: object
    draft: object
    proc: Processing
    dev: torch.device
    batched: bool
    row_masks: bool

    @property
    def features(self) -> bool:
        """The draft is a feature drafter (EAGLE-1: fed the target's hidden states)."""
        return self.draft is not None and bool(getattr(self.draft, "needs_features", False))

    def rows(self, model, x: torch.Tensor, *, conds: list | None = None, hidden: bool = False, **kw):
        """Feed per-image tokens ``x`` (B, S) to ``model`` (``self.target`` or ``self.draft``) as its model rows (k B, S)
        (the CFG pair, ``real.decode.sampling.per_model_rows``): with ``conds`` (B conditions) a prefill of them
        followed by x (``hidden``: the hidden states too), else a block appended to the cache (``kw``: ``features``,
        ``position_ids``, ``attn_mask``, as the model's ``forward`` takes them). Returns (the processed rows (B, S', V)
        float32, ``Processing.rows`` of the model's logits; the model's hidden states (k B, S'', D) or None)."""
        xr = _rows(x, self.proc.batch)
        if conds is not None:
            o = model.prefill(conds, xr, cfg=self.proc.cfg, return_hidden=hidden)
        else:
            o = model.forward(xr, **kw)
        return self.proc.rows(o.logits), o.hidden


def scoring_inputs(target, draft, conds, tokens, processing: Processing = Processing()) -> tuple[Forced, list,
                                                                                             torch.Tensor]:
    """The inputs every scoring entry takes (``real.decode.score.score``, ``score_tree.score_trees``, ``tree_rows``,
    ``teacher_forced_rows``), checked once there and read once: (the models as the scorers call them, ``Forced``;
    ``conds`` as a list of one kind of condition (``real.protocol.as_conds``); ``tokens`` as an int64 (n, T) tensor,
    T >= 1, n = the number of conditions, every token in [0, V) of the target); a draft (when given) over the target's
    vocabulary (``real.protocol.check_pair``); ``processing`` a ``Processing``. ValueError naming what is wrong. The
    entries' inner steps (``chain_rows``, ``score_tree``'s, ``regrow``'s) take these values as they are."""
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
    if not isinstance(processing, Processing):
        raise ValueError(f"processing must be a real.decode.sampling.Processing, got {type(processing).__name__}")
    given = [m for m in (target, draft) if m is not None]
    batched = all(m.batched for m in given)
    forced = Forced(as_batched(target), as_batched(draft), processing,
                    torch.device(getattr(target, "device", "cpu") or "cpu"), batched,
                    batched and all(m.row_masks for m in given))
    return forced, conds, t.long()


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
    m, conds, tok = scoring_inputs(target, draft, conds, tokens, processing)
    if m.features and (isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1):
        raise ValueError(f"an EAGLE drafter's rows depend on the round offset: L must be an int >= 1, got {L!r}")
    B = tok.shape[0]
    for model in (target, draft):
        if model is not None and B > 1 and not model.batched:
            raise ValueError(f"{type(model).__name__} scores one image at a time (its cache has no per-row lengths): "
                             f"got {B} images")
    return chain_rows(m, conds, tok, L)


@torch.no_grad()
def chain_rows(m: Forced, conds: list, tok: torch.Tensor, L: int | None, by_start: bool = False) -> Rows:
    """``teacher_forced_rows`` of inputs its callers checked (``scoring_inputs``; L an int >= 1 for an EAGLE
    drafter; one image at a time for a model without per-row cache lengths): ``m`` the models, ``conds`` a list of B
    conditions, ``tok`` (B, T) int64. ``by_start``: an EAGLE drafter's q indexed by round start instead, as tree rows
    read it (``_by_round_start``; an offset-independent draft's q (B, T, V) serves both)."""
    T = tok.shape[1]
    tok = tok.to(m.dev)
    # the engine's fast paths (real.nn.layers.linear) and inference mode, as in generate; the rows are cloned
    # outside it (ordinary tensors the caller may write to)
    with inference_weights(), torch.inference_mode():
        p, hidden = m.rows(m.target, tok[:, :T - 1], conds=conds, hidden=m.features)          # (B, T, V)
        if m.draft is None:
            q, kind = None, "theory"
        elif not m.features:               # independent / layer-skip draft: offset-independent rows
            q, kind = m.rows(m.draft, tok[:, :T - 1], conds=conds)[0], "theory"
        else:
            q, kind = _eagle_rows(m, hidden, tok, int(L)), "eagle"
    if by_start and q is not None and q.ndim == 4:
        return Rows(p.clone(), _by_round_start(q), kind)       # (a new tensor: no clone needed)
    return Rows(p.clone(), None if q is None else q.clone(), kind)


def _by_round_start(qc: torch.Tensor) -> torch.Tensor:
    """An EAGLE drafter's chain rows qc (B, T, D, V) ([:, t, d]: token t as the (d+1)-th draft) -> tree rows
    (B, T, D, V) by round start, q[:, n, d] = qc[:, n + d, d] (entries past the image: uniform, never read)."""
    B, T, D, V = qc.shape
    q = torch.full_like(qc, 1.0 / V)
    for d in range(D):   # a loop over tree depths
        q[:, :T - d, d] = qc[:, d:, d]
    return q


def _eagle_rows(m: Forced, hidden: torch.Tensor, tok: torch.Tensor, L: int) -> torch.Tensor:
    """q (B, T, L, V) of a feature drafter ``m.draft`` from the target's hidden states (R, P + T - 1, D) along the
    images tok (B, T) (module docstring; element e = (token at target position e + 1, h_e), position e)."""
    B, T = tok.shape
    draft, dev = m.draft, m.dev
    R, V = hidden.shape[0], int(draft.vocab_size)
    P = hidden.shape[1] - (T - 1)
    q = torch.full((B, T, L, V), 1.0 / V, dtype=m.proc.dtype, device=dev)   # never-read entries: uniform rows
    if T <= 2:                              # no round can draft (L' = min(L, T - n - 1) = 0 for n >= 1)
        return q
    E = P + T - 2                           # committed pairs e = 0 .. P + T - 3 (the last predicts token T - 1)
    sizes = [T - 2 - j for j in range(1, L) if T - 2 - j >= 1]             # pass j: starts n = 1 .. T - 2 - j
    draft.start(P, R, extra=sum(sizes))
    ids = torch.cat([torch.zeros(B, P - 1, dtype=torch.long, device=dev), tok[:, :T - 1]], 1)   # prefix pairs: id 0
    rows, h = m.rows(draft, ids, features=hidden[:, :E], position_ids=np.tile(np.arange(E), (R, 1)))
    # offset 1: token t (1 <= t <= T - 2) follows the pair of x_{t-1}, element P + t - 2
    q[:, 1:T - 1, 0] = rows[:, P - 1:E - 1]
    feats = h[:, P - 1:E - 1]                # (R, T - 2, D) f_0 for starts n = 1 .. T - 2
    n = torch.arange(1, T - 1, device=dev)   # round starts
    M = T - 2                                # the cached committed pairs a start may hide: e = P .. P + T - 3
    blocks: list[int] = []
    for j, S in enumerate(sizes, start=1):   # a loop over the L - 1 appended draft offsets (each batched over starts)
        nn = n[:S]
        pos = np.tile(P + nn.cpu().numpy() + j - 2, (R, 1))
        rows, feats = m.rows(draft, tok[:, nn + j - 1], features=feats[:, :S], position_ids=pos,
                             attn_mask=_pass_mask(nn, M, blocks, S, dev))      # x_{n+j-1} (B, S)
        q[:, nn + j, j] = rows                                           # token t = n + j as the (j+1)-th draft
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
