"""What every model-drafted mode shares, one floor below the modes (``chain``, ``tree``, ``dynamic_tree`` stand side by
side on it): ``ModelDrafting`` (a draft model over the target's vocabulary is needed), ``feed_draft`` (feed the draft
model what was committed: its rows after each row's last committed element), ``draft_chain`` (draft a chain from those
rows: tokens (B, Lr), rows q (B, Lr, V)) and ``static_depth`` (how deep a round drafts: one shape from round to round on the device path). The modes read the
round through its ``real.decode.round.Run`` alone; none imports the round. (``top_m``: ``real.decode.candidates``.)"""
from __future__ import annotations

import numpy as np
import torch

from real.nn.devpath import to_device

from . import rng as R
from .sampling import draw

__all__ = ["ModelDrafting", "feed_draft", "draft_chain", "static_depth"]


class ModelDrafting:
    """What the model-drafted modes share: they need a draft model over the target's vocabulary."""
    needs_draft = True
    trees = False
    scored_as = None       # how real.decode.score reads the mode: "chain", "static-tree", "grown-tree" or None

    def check(self, target, draft, num_tokens, verifier, processing, batch_size) -> None:
        """ValueError unless a draft model is given (the engine checks the pair's vocabularies)."""
        if draft is None:
            raise ValueError(f"{type(self).__name__} drafting needs a draft model (draft=None: plain AR, or a "
                             "drafter-free mode such as real.decode.jacobi.Jacobi)")

    def start(self, run):
        return None

    def from_prefill(self, run) -> bool:
        """Round 0 is the target's prefill alone (the EAGLE convention of docs/theory.md section 11)."""
        return False

    def advance(self, run, prop, verdict, p, n0) -> None:
        return None


def feed_draft(run):
    """Feed the draft every committed element it has not seen, one ragged block for the batch (shorter rows padded with
    their last element, the padding rolled back at once). Returns the draft output rows that follow each row's last
    committed element: logits (R, V) and hidden (R, D) (or None)."""
    draft = run.draft
    seen = draft.cache_lens[:run.B]
    need = np.where(run.active, run.d_off + run.n, seen)
    f = need - seen
    F = int(f.max())
    idx = np.minimum(seen[:, None] + np.arange(F)[None, :], np.maximum(need - 1, 0)[:, None])   # (B, F)
    dev_path = run.n_dev is not None      # the device path: host indices sent without a sync, positions on device
    lastf = run.rows(np.maximum(f - 1, 0))
    if dev_path:                          # one non-blocking copy of [idx (B F); last (R)], split by views
        both = to_device(np.concatenate([idx.ravel(), lastf]), run.dev)
        idx_t, last = both[:idx.size].view(idx.shape), both[idx.size:]
    else:
        idx_t = torch.as_tensor(idx, device=run.dev)
    tok = run.out.gather(1, (idx_t - run.d_off).clamp(min=0))               # elements before token 0: id 0
    tok = torch.where(idx_t < run.d_off, torch.zeros_like(tok), tok)
    pos = run.rows(idx_t if dev_path else idx)
    if run.feat:
        fidx = torch.as_tensor(pos, device=run.dev)[..., None].expand(-1, -1, run.hist.shape[-1])
        o = draft.forward(run.rows(tok), features=run.hist.gather(1, fidx), position_ids=pos)
    else:
        o = draft.forward(run.rows(tok), position_ids=pos)
    if (f < F).any():
        draft.rollback(run.rows(F - f))
    if not dev_path:
        last = torch.as_tensor(lastf, device=run.dev)
    r = torch.arange(last.shape[0], device=run.dev)
    return o.logits[r, last], (o.hidden[r, last] if run.feat else None)


def draft_chain(run, logits: torch.Tensor, hid: torch.Tensor | None, Lr: int):
    """Draft Lr tokens per image from the draft's rows that follow the committed tokens (logits (R, V), feature
    drafters: their hidden (R, D)): tokens (B, Lr), rows q (B, Lr, V)."""
    xs, qs = [], []
    cap = run.d_off + run.T - 1
    greedy = run.proc.greedy
    for i in range(Lr):   # a loop over the L draft positions (each one batched over images)
        if greedy:        # temperature 0: the guided logits' first argmax; the one-hot rows are made once, below
            x = run.proc.rows(logits, combined=True).argmax(-1)
        else:
            q = run.proc.rows(logits)
            x = draw(q, run.proc, lambda: run.rng.uniform(run.n, R.DRAFT + i))
            qs.append(q)
        xs.append(x)
        if i < Lr - 1:   # the draft's cache length d_off + n_b + i (on the device path from n on the device)
            pos = run.dev_positions(run.d_off + i, cap)
            pos = run.positions(run.draft, np.zeros(1, np.int64), cap) if pos is None else pos
            if run.feat:
                o = run.draft.forward(run.rows(x)[:, None], features=hid[:, None], position_ids=pos)
                hid = o.hidden[:, -1]
            else:
                o = run.draft.forward(run.rows(x)[:, None], position_ids=pos)
            logits = o.logits[:, -1]
    x = torch.stack(xs, 1)
    if greedy:            # process_logits' rows at temperature 0: one-hot at the drawn (first-argmax) tokens
        V = logits.shape[-1]
        return x, torch.zeros((*x.shape, V), dtype=run.proc.dtype, device=x.device).scatter_(-1, x[..., None], 1.0)
    return x, torch.stack(qs, 1)


def static_depth(run, Dr: int, D: int, block: int) -> int:
    """How deep a mode drafts this round (``run``: the round's ``real.decode.round.Run``): on the device path its
    full depth D every round, so the target's block and the draft's levels keep one shape from round to round (a
    compiled step then sees one block length; with ``real.nn.kvcache.static_keys`` the keys it attends over keep one
    length too) while the images' own caps D'_b bound what verification accepts (``verify_round(max_depth=...)``)
    and positions past an image's last token are clamped, provided both models have room for a ``block`` of entries
    past the image (``extra_slots``); else, and on the host path (no work past the image), Dr, the batch's deepest
    D'_b."""
    if run.n_dev is None or Dr == 0:
        return Dr
    for m in (run.target, run.draft):
        room = None if m is None else getattr(m, "extra_slots", None)
        if room is not None and block > int(room):
            return Dr
    return D
