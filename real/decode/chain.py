"""Chain drafting (docs/theory.md section 1) and plain AR as drafting modes (``real.protocol.Drafting``), and the two
steps every model-drafted mode shares: feeding the draft model what was committed (``feed_draft``) and drafting a
chain from its rows (``draft_chain``).

``Chain(L)``: each round drafts L'_b = min(L, T - n_b - 1) tokens per image from the draft model (an independent
small model or layer-skip draft, which drafts from round 0 as the theory's convention; or an EAGLE-1 feature
drafter, whose first round follows the target's prefill), each drawn from its processed row (law "sampled").
``Plain()``: no drafting (depth 0: every round is one plain AR step).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from theory.core import checks
from real.protocol import Proposal
from real.nn.devpath import to_device

from . import rng as R
from .round import static_depth
from .sampling import draw

__all__ = ["Chain", "Plain", "feed_draft", "draft_chain", "DEFAULT_L"]

DEFAULT_L = 4          # drafts per round when none is asked (coolsd generate, coolsd sweep)


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


@dataclass(frozen=True)
class Plain:
    """No drafting: plain autoregressive sampling, one target forward per token (the baseline)."""
    max_depth = 0
    needs_draft = False
    trees = False

    def check(self, target, draft, num_tokens, verifier, processing, batch_size) -> None:
        """Nothing to check: the draft model, if given, is not used."""

    def start(self, run):
        return None

    def from_prefill(self, run) -> bool:
        return False

    def propose(self, run, depth):
        raise AssertionError("plain AR never proposes (depth 0)")

    def advance(self, run, prop, verdict, p, n0) -> None:
        return None

    def params(self) -> dict:
        return {}


@dataclass(frozen=True)
class Chain(ModelDrafting):
    """Chain drafting of ``L`` tokens per round from the draft model (module docstring)."""
    scored_as = "chain"
    L: int = DEFAULT_L

    def __post_init__(self):
        checks.integer("L", self.L, lo=1)

    @property
    def max_depth(self) -> int:
        return int(self.L)

    def check(self, target, draft, num_tokens, verifier, processing, batch_size) -> None:
        """The draft model is needed and L must fit in the image."""
        super().check(target, draft, num_tokens, verifier, processing, batch_size)
        checks.integer("L", self.L, lo=1, hi=num_tokens)

    def from_prefill(self, run) -> bool:
        """An independent draft drafts from round 0 (the theory's convention): the target's prefill verifies them."""
        return not run.feat

    def propose(self, run, depth: np.ndarray) -> Proposal:
        """Draft max_b L'_b tokens per image (rows past an image's own L'_b are cut by the verification's depth cap);
        round 0 of an independent draft (the target not yet prefilled) starts from the draft's own prefill. On the device
        path every round drafts L (``real.decode.round.static_depth``)."""
        Lr = static_depth(run, int(depth.max()), int(self.L), int(self.L) + 1)
        if run.P == 0:
            logits, hid = run.draft.prefill(run.conds, cfg=run.proc.cfg).logits[:, -1], None
            run.d_off = int(run.draft.cache_lens[0])
        else:
            logits, hid = feed_draft(run)
        x, q = draft_chain(run, logits, hid, Lr)
        return Proposal(torch.cat([run.last_tokens(), x], 1), q, "sampled", None, np.arange(Lr + 1), None, Lr)

    def advance(self, run, prop, verdict, p, n0) -> None:
        """Roll the draft's cache back to the committed elements it has seen (a feature drafter all its Lr - 1
        appended pairs; an independent draft those past its accepted drafts)."""
        Lr = prop.tokens.shape[1] - 1
        tau = np.asarray(verdict.accepted)
        own = Lr - 1 if run.feat else np.where(n0 < run.T, Lr - 1 - np.minimum(tau, Lr - 1), Lr - 1)
        if np.any(own):
            run.draft.rollback(run.rows(np.broadcast_to(own, (run.B,)).astype(np.int64)))

    def params(self) -> dict:
        return {"L": int(self.L)}


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
