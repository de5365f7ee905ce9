"""Chain drafting (docs/theory.md section 1) and plain AR as drafting modes (``real.protocol.Drafting``); the steps
every model-drafted mode shares (``feed_draft``, ``draft_chain``, ``ModelDrafting``) live in ``real.decode.drafting``.

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

from .drafting import ModelDrafting, draft_chain, feed_draft, static_depth

__all__ = ["Chain", "Plain", "feed_draft", "draft_chain", "DEFAULT_L"]

DEFAULT_L = 4          # drafts per round when none is asked (coolsd generate, coolsd sweep)


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
        path every round drafts L (``real.decode.drafting.static_depth``)."""
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
