"""What a run leaves behind (``real.decode.engine.generate``): per round of a batch a ``Step`` (``real.decode.round``
makes them), per image a ``Generation`` holding one ``RoundRecord`` per round it took part in (``generations`` makes
them from a batch's steps), and the figures over them (``summarize``; ``records_to_arrays`` stacks recorded chain
rounds for ``theory.likelihood.recorded``).

Shapes: B images per batch, T tokens per image, V the vocabulary; chains draft L' <= L tokens a round, trees N' nodes
of depth D' (``RoundRecord``, ``Step``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .phases import phase

__all__ = ["RoundRecord", "Step", "Generation", "generations", "summarize", "records_to_arrays"]


@dataclass
class RoundRecord:
    """One round: ``drafted`` = L', ``accepted`` = tau (tokens produced: tau + 1), wall times in seconds
    (CUDA-synchronised), and with ``record_rows=True`` the processed rows along the drafted path:
    ``p`` (L'+1, V) target rows P(.|h_{i-1}), i = 1..L'+1; ``q`` (L', V) draft rows; ``drafts`` (L',).

    Tree rounds: ``drafted`` = N' nodes drafted, ``depth`` = D' (the truncated tree's depth), ``nodes`` the accepted
    tree nodes (tau of them, by depth); rows: ``p`` (N'+1, V) target rows at every node, ``q`` (N'+1, V) the draft
    rows the node's children were drawn from (uniform placeholders at leaves), ``drafts`` (N'+1,) node tokens, the
    root's (the last committed token) at 0; dynamic trees also ``parent`` (N'+1,) (-1 at the root)."""
    drafted: int
    accepted: int
    t_draft: float
    t_target: float
    t_verify: float
    p: np.ndarray | None = None
    q: np.ndarray | None = None
    drafts: np.ndarray | None = None
    depth: int | None = None
    nodes: tuple | None = None
    parent: np.ndarray | None = None


@dataclass
class Step:
    """One round of the batch, per image (B,): ``drafted`` nodes (chains: L'_b), ``accepted`` tau_b, the batch's times,
    draft forwards, and for the records ``chain`` (None: round 0 or a plain AR step, no drafts; True: the proposal was
    a chain; False: a tree, per image when it has ``parent``),
    ``depth`` (B,) D'_b, ``nodes`` (B, D) accepted nodes (-1 past tau); with record_rows ``p``, ``q``, ``drafts``
    (chains: p (B, S+1, V), q (B, S, V), drafts (B, S); trees: p, q (B, N+1, V), drafts (B, N+1) with the root at 0;
    single steps: p (B, 1, V), drafts (B, 1) the root or None) and ``parent`` (B, N+1) for dynamic trees."""
    drafted: np.ndarray
    accepted: np.ndarray
    t_draft: float
    t_target: float
    t_verify: float
    draft_forwards: int = 0
    chain: bool | None = None
    p: torch.Tensor | None = None
    q: torch.Tensor | None = None
    drafts: torch.Tensor | None = None
    depth: np.ndarray | None = None
    nodes: np.ndarray | None = None
    parent: np.ndarray | None = None

    def to_host(self) -> "Step":
        """The recorded rows as numpy on the host, in the dtype they were computed in (float32 or float64; a half
        dtype, which numpy lacks, as float32), so a recording run holds no rows on the device."""
        for name in ("p", "q", "drafts"):
            x = getattr(self, name)
            if isinstance(x, torch.Tensor):
                half = x.is_floating_point() and x.element_size() < 4
                setattr(self, name, (x.float() if half else x).cpu().numpy())
        return self

    def record(self, b: int, share: float, rows: bool, tree_run: bool) -> RoundRecord:
        """Image b's record (times: ``share`` of the batch's), its rows cut to its own round; a tree run marks single
        steps as depth 0 with the root token (-1 at round 0) as its only node token."""
        tau, times = int(self.accepted[b]), (self.t_draft * share, self.t_target * share, self.t_verify * share)
        if self.chain is None:
            rec = RoundRecord(0, tau, *times, depth=0 if tree_run else None, nodes=() if tree_run else None)
            if rows:
                rec.p, rec.q = self.p[b, :1], self.p[b, :0]
                rec.drafts = (np.zeros(0, np.int64) if not tree_run else self.drafts[b, :1]
                              if self.drafts is not None else np.full(1, -1, dtype=np.int64))
            return rec
        if self.chain:
            ell = int(self.drafted[b])
            rec = RoundRecord(ell, tau, *times)
            if rows:
                rec.p, rec.q, rec.drafts = self.p[b, :ell + 1], self.q[b, :ell], self.drafts[b, :ell]
            return rec
        dyn = self.parent is not None
        m = self.p.shape[1] if dyn and rows else int(self.drafted[b]) + 1
        rec = RoundRecord(int(self.drafted[b]), tau, *times, depth=int(self.depth[b]),
                          nodes=tuple(int(x) for x in self.nodes[b, :tau]), parent=self.parent[b] if dyn else None)
        if rows:
            rec.p, rec.drafts = self.p[b, :m], self.drafts[b, :m]
            rec.q = None if self.q is None else self.q[b, :m]
        return rec


@dataclass
class Generation:
    """One image's generation: ``tokens`` (T,) int64, one record per round, wall-clock ``seconds``, the target's
    and the draft's forward counts, and ``info``."""
    tokens: torch.Tensor                 # (T,) int64 image tokens
    rounds: list[RoundRecord]
    seconds: float
    target_forwards: int
    draft_forwards: int
    info: dict = field(default_factory=dict)
    features: torch.Tensor | None = None  # generate(features=True): (rows, P + T - 1, D) the target's hidden states

    def stats(self) -> dict:
        """``summarize([self])``: this generation's acceptance and speed figures."""
        return summarize([self])


def generations(run, steps: list[Step], actives: list[np.ndarray], info: dict, record: bool,
                tree_run: bool) -> list[Generation]:
    """Per-image ``Generation``s from a batch's rounds (``Step.record`` makes each round's records, tree-shaped for a
    tree mode; the batch's times are shared equally among the images that took part)."""
    B = run.B
    with phase("output"):
        tokens = run.out[:, :run.T].cpu()
    recs: list[list[RoundRecord]] = [[] for _ in range(B)]
    for s, act in zip(steps, actives):   # a loop over rounds and images, once per batch
        s = s.to_host() if record else s
        share = 1.0 / max(1, int(act.sum()))
        for b in np.flatnonzero(act):
            recs[b].append(s.record(int(b), share, record, tree_run))
    secs = info["batch_seconds"] / B
    feats = None
    if run.feat and run.draft is None:     # generate(features=True): [prefix; x_0 .. x_{T-2}] per image row
        h = run.hist[:, :run.P + run.T - 1].float().cpu()
        R = h.shape[0]
        feats = [h[[b, b + B]] if R == 2 * B else h[b:b + 1] for b in range(B)]
    out = []
    for b in range(B):
        fwd = sum(s.draft_forwards for s, a in zip(steps, actives) if a[b])
        with torch.inference_mode(False):
            tok = tokens[b].clone()            # an ordinary tensor the caller may write to
            f = None if feats is None else feats[b].clone()
        out.append(Generation(tok, recs[b], secs, len(recs[b]), fwd, dict(info), f))
    return out


def summarize(gens: list[Generation]) -> dict:
    """Aggregate figures over generations: tokens per target call (= tokens per round, mean of tau + 1)
    with its standard error over rounds, accepted drafts tau, acceptance rate (accepted / drafted depth:
    the fraction of draft levels accepted; for chains the depth is L'), drafted tokens (tree nodes) per
    round, time split."""
    taus = np.array([r.accepted for g in gens for r in g.rounds], dtype=np.float64)
    drafted = np.array([r.drafted for g in gens for r in g.rounds], dtype=np.float64)
    depth = np.array([r.drafted if r.depth is None else r.depth for g in gens for r in g.rounds], dtype=np.float64)
    R = len(taus)
    tokens = int(sum(g.tokens.numel() for g in gens))
    secs = float(sum(g.seconds for g in gens))
    td = float(sum(r.t_draft for g in gens for r in g.rounds))
    tt = float(sum(r.t_target for g in gens for r in g.rounds))
    tv = float(sum(r.t_verify for g in gens for r in g.rounds))
    se = float(taus.std(ddof=1) / math.sqrt(R)) if R > 1 else float("nan")
    return {
        "tokens": tokens, "rounds": R, "images": len(gens),
        "target_forwards": int(sum(g.target_forwards for g in gens)),
        "draft_forwards": int(sum(g.draft_forwards for g in gens)),
        "tokens_per_target_call": tokens / R, "tokens_per_target_call_se": se,
        "accepted_mean": float(taus.mean()), "accepted_se": se,
        "drafted_mean": float(drafted.mean()), "depth_mean": float(depth.mean()),
        "acceptance_rate": float(taus.sum() / depth.sum()) if depth.sum() else float("nan"),
        "seconds": secs, "tokens_per_second": tokens / secs if secs > 0 else float("nan"),
        "time_draft_s": td, "time_target_s": tt, "time_verify_s": tv,
        "verify_share": tv / (td + tt + tv) if (td + tt + tv) > 0 else float("nan"),
    }


def records_to_arrays(records: list[RoundRecord], L: int):
    """Stack recorded rounds for ``theory.likelihood.recorded.predict_rounds``: p (R, L+1, V), q (R, L, V),
    drafts (R, L), n_drafted (R,) (rows in their recorded dtype). Rounds with L' < L are padded with uniform rows (f = 1, D = 0 there,
    and ``n_drafted`` masks them anyway) and token 0; L' = 0 rounds are dropped (nothing to predict)."""
    if any(r.depth is not None for r in records):
        raise ValueError("records_to_arrays stacks chain rounds; these are static-tree rounds (tree_generate)")
    recs = [r for r in records if r.drafted > 0]
    if not recs:
        raise ValueError("no drafted rounds recorded")
    if any(r.p is None for r in recs):
        raise ValueError("rounds were recorded without rows: run with record_rows=True")
    V, dt = recs[0].p.shape[-1], np.result_type(recs[0].p, np.float32)     # the rows' own dtype (float32 at least)
    R = len(recs)
    p = np.full((R, L + 1, V), 1.0 / V, dtype=dt)
    q = np.full((R, L, V), 1.0 / V, dtype=dt)
    d = np.zeros((R, L), dtype=np.int64)
    nd = np.array([r.drafted for r in recs], dtype=np.int64)
    for j, r in enumerate(recs):  # copying R recorded rounds into padded arrays, not a hot path
        k = r.drafted
        p[j, :k + 1], q[j, :k], d[j, :k] = r.p, r.q, r.drafts
    return p, q, d, nd
