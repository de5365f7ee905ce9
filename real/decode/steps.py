"""The step functions of ``real.decode.engine.generate``: one round of plain AR, chain or static-tree speculative
decoding for a batch of B images, each image with its own committed length n[b].

Shapes: b < B indexes images, r < R = k B model rows (k = 2 with classifier-free guidance: rows
[cond; uncond], ``Run.rows``). Positions are absolute: the target holds the condition prefix (P
positions) then image token j at position P + j; the draft stream is indexed by "elements": an
independent draft's element d_off + j is image token j (d_off = its prefix length), an EAGLE drafter's
element i is the pair (token at target position i + 1, target hidden state at position i), so
d_off = P - 1 and image token j is element P - 1 + j as well (``Run.d_off``).

A round at committed lengths n (docs/theory.md section 1 for chains, section 9 for trees):
  each unfinished image drafts L'_b = min(L, T - n_b - 1) tokens (a tree: depth D'_b = min(D, T - n_b - 1));
  the batch drafts max_b L'_b, ``theory.rules.chain.verify_chain(..., n_drafted=L')`` (``verify_tree(...,
  max_depth=D')``) ignores what a row drafted past its own L'_b, so every image follows exactly the law
  of the batch-1 round; rows that finished (n_b = T) ride along and keep nothing;
  positions past an image's last token (drafts that can never be accepted) are clamped to it.
The draft is first fed the committed tokens it has not seen (``feed_draft``: a ragged block, shorter
rows padded and the padding rolled back at once), so rows that accepted different numbers of drafts
continue in the same forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory.rules.chain import ChainVerdict, verify_chain

from . import rng as R
from .rng import Streams
from .sampling import Processing, draw

__all__ = ["RoundRecord", "Run", "Step", "ChainStep", "verify_chain_on", "on_host", "as_tensors", "prefill_step", "ar_step", "chain_step", "feed_draft", "draft_chain", "sync"]


def sync(device) -> None:
    """Wait for the device's queued work (CUDA) before a clock is read; a no-op elsewhere."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class RoundRecord:
    """One round: ``drafted`` = L', ``accepted`` = tau (tokens produced: tau + 1), wall times in seconds
    (CUDA-synchronised), and with ``record_rows=True`` the processed rows along the drafted path:
    ``p`` (L'+1, V) target rows P(.|h_{i-1}), i = 1..L'+1; ``q`` (L', V) draft rows; ``drafts`` (L',).

    Tree rounds: ``drafted`` = N' nodes drafted, ``depth`` = D' (the truncated tree's depth), ``nodes``
    the accepted tree nodes (tau of them, by depth); rows: ``p`` (N'+1, V) target rows at every node,
    ``q`` (N'+1, V) the draft rows the node's children were drawn from (uniform placeholders at leaves),
    ``drafts`` (N'+1,) node tokens, the root's (the last committed token) at 0."""
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
    parent: np.ndarray | None = None     # dynamic trees: (N'+1,) the round's own tree (node parents, -1 at the root)


@dataclass
class Run:
    """State of one batch's generation (module docstring for the index conventions)."""
    target: object
    draft: object | None
    proc: Processing
    rng: Streams                         # the batch's per-image random streams (real.decode.rng)
    dev: torch.device
    T: int
    n: np.ndarray                        # (B,) committed tokens per image
    out: torch.Tensor                    # (B, T + slack) committed tokens (past n[b]: scratch)
    feat: bool = False                   # the draft is an EAGLE-style feature drafter
    P: int = 0                           # target prefix positions
    d_off: int = 0                       # draft element of image token 0
    hist: torch.Tensor | None = None     # (R, P + T + slack, D) target hidden states by position (feature drafters)
    plans: dict = field(default_factory=dict)
    host: bool = False                   # verify on numpy views of the rows (``on_host``)

    @property
    def B(self) -> int:
        """Images in the batch."""
        return int(self.n.shape[0])

    @property
    def active(self) -> np.ndarray:
        """(B,) bool: the images still short of T committed tokens."""
        return self.n < self.T

    def rows(self, x):
        """Per-image (B, ...) -> per-model-row (R, ...): the CFG pair's rows share everything."""
        k = self.proc.batch
        if k == 1:
            return x
        return np.concatenate([x] * k) if isinstance(x, np.ndarray) else torch.cat([x] * k)   # (not repeat/tile: 5x slower)

    def positions(self, model, offsets: np.ndarray, cap: int) -> np.ndarray:
        """(R, S) absolute positions: each row's cache length + offsets (S,), clamped to ``cap`` (the
        image's last position: what lies past it is never accepted)."""
        return np.minimum(model.cache_lens[:, None] + offsets[None, :], cap)


@dataclass
class Step:
    """A round that drafted nothing, per image (B,): round 0 (the target's prefill) or one plain AR step. Times are
    the batch's; with record_rows ``p`` (B, 1, V) the target row the token was drawn from and, for AR steps,
    ``drafts`` (B, 1) the last committed token (the root a tree run records). Each kind of round turns itself
    into per-image ``RoundRecord``s (``record``)."""
    drafted: np.ndarray                  # (B,) drafts per image (0 here)
    accepted: np.ndarray                 # (B,) accepted drafts tau
    t_draft: float
    t_target: float
    t_verify: float
    draft_forwards: int = 0
    p: torch.Tensor | None = None
    drafts: torch.Tensor | None = None

    def to_host(self) -> "Step":
        """The recorded rows as numpy on the host (float32), so a recording run holds no rows on the device."""
        for name in ("p", "q", "drafts"):
            x = getattr(self, name, None)
            if isinstance(x, torch.Tensor):
                setattr(self, name, (x.float() if x.is_floating_point() else x).cpu().numpy())
        return self

    def record(self, b: int, share: float, rows: bool, tree_run: bool) -> RoundRecord:
        """Image b's record (times: ``share`` of the batch's); a tree run marks single target steps as depth 0 with
        the root token (-1 at round 0) as its only node token."""
        rec = RoundRecord(0, int(self.accepted[b]), self.t_draft * share, self.t_target * share, self.t_verify * share,
                          depth=0 if tree_run else None, nodes=() if tree_run else None)
        if rows:
            rec.p, rec.q = self.p[b, :1], self.p[b, :0]
            if tree_run:
                rec.drafts = self.drafts[b, :1] if self.drafts is not None else np.full(1, -1, dtype=np.int64)
            else:
                rec.drafts = np.zeros(0, dtype=np.int64)
        return rec


@dataclass
class ChainStep(Step):
    """A chain round: ``drafted`` (B,) L'_b, ``accepted`` tau_b; with record_rows ``p`` (B, S+1, V) target rows
    along the drafted path, ``q`` (B, S, V) draft rows, ``drafts`` (B, S) (S = the batch's widest L')."""
    q: torch.Tensor | None = None

    def record(self, b: int, share: float, rows: bool, tree_run: bool) -> RoundRecord:
        """Image b's record: drafted L'_b, its rows cut to L'_b."""
        ell = int(self.drafted[b])
        rec = RoundRecord(ell, int(self.accepted[b]), self.t_draft * share, self.t_target * share,
                          self.t_verify * share)
        if rows:
            rec.p, rec.q, rec.drafts = self.p[b, :ell + 1], self.q[b, :ell], self.drafts[b, :ell]
        return rec


def holds_tensors(obj, depth: int = 4) -> bool:
    """Whether ``obj`` (a verifier, its rules, their schedules...) keeps a torch tensor among its attributes,
    containers included, up to ``depth`` levels (e.g. LANTERN's neighbour table placed on the model device)."""
    if isinstance(obj, torch.Tensor):
        return True
    if depth == 0 or isinstance(obj, (str, bytes, int, float, np.ndarray)) or obj is None:
        return False
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = obj
    else:
        items = getattr(obj, "__dict__", {}).values()
    return any(holds_tensors(x, depth - 1) for x in items)


def host_verification(dev, verifier) -> bool:
    """Whether rounds on ``dev`` can be verified on numpy views of their rows: CPU rows and a verifier whose
    rules hold no torch tensors (``theory`` is array-API code). On (B, V) rows numpy's per-operation cost is
    about a third of torch's, and the tree walk is ~70 such operations per candidate."""
    return torch.device(dev).type == "cpu" and verifier is not None and not holds_tensors(verifier)


def on_host(run: "Run", *arrays):
    """The arrays as the round's verifier sees them: numpy views of the same memory with ``run.host`` (no copy),
    else as they are (``host_verification``)."""
    if not run.host:
        return arrays
    return tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in arrays)


def as_tensors(run: "Run", verdict):
    """A verdict computed by ``on_host`` arrays, its fields back as tensors."""
    if not run.host:
        return verdict
    return type(verdict)(*(torch.from_numpy(np.ascontiguousarray(a)) for a in verdict))


def verify_chain_on(run: "Run", p, q, x, u_acc, u_smp, verifier, n_drafted) -> ChainVerdict:
    """``theory.rules.chain.verify_chain`` for the batch (rows p (B, S+1, V), q (B, S, V), drafts x (B, S), uniforms
    (B, S) and (B,), per-row draft lengths (B,)), on numpy views with ``run.host``; the verdict as tensors."""
    p, q, x, u_acc, u_smp, n_drafted = on_host(run, p, q, x, u_acc, u_smp, n_drafted)
    return as_tensors(run, verify_chain(p, q, x, u_acc, u_smp, verifier, n_drafted=n_drafted, check=False))


def check_finite(*rows: torch.Tensor) -> None:
    """ValueError unless every entry of the probability rows is finite: rows in [0, 1] sum to a finite number iff
    every entry is, so one reduction and one sync decide the usual case; the entries are looked at only then."""
    if bool(torch.isfinite(sum(r.sum() for r in rows))):
        return
    if not all(bool(torch.isfinite(r).all()) for r in rows):
        raise ValueError("non-finite probabilities (NaN/inf logits from the model?)")


def commit(run: Run, cand: torch.Tensor, tau: np.ndarray) -> None:
    """Write cand[b, :tau_b + 1] (B, S) at out[b, n_b:]; n_b += tau_b + 1 for unfinished images."""
    act = run.active
    cols = torch.as_tensor(run.n, device=run.dev)[:, None] + torch.arange(cand.shape[1], device=run.dev)
    run.out.scatter_(1, cols, cand)              # past tau_b + 1: scratch, overwritten later
    run.n = run.n + np.where(act, tau + 1, 0)


def store_hidden(run: Run, hidden: torch.Tensor, pos: np.ndarray) -> None:
    """Feature drafters: keep the target's hidden states (R, S, D) at absolute positions pos (R, S)."""
    idx = torch.as_tensor(pos, device=run.dev)[..., None].expand(-1, -1, hidden.shape[-1])
    run.hist.scatter_(1, idx, hidden.to(run.hist.dtype))


# ----------------------------------------------------------------------------- round 0 and plain AR

def prefill_step(run: Run, conds: list, record: bool) -> Step:
    """Round 0 for every mode: the target's prefill alone gives token 0; the draft is started on the
    same conditions (independent draft: its prefill; feature drafter: ``start``)."""
    t0 = time.perf_counter()
    o = run.target.prefill(conds, cfg=run.proc.cfg, return_hidden=run.feat)
    p = run.proc.rows(o.logits[:, -1:])                                   # (B, 1, V)
    run.P = int(run.target.cache_lens[0])
    if run.draft is not None:
        if run.feat:
            run.hist = o.hidden.new_zeros((o.hidden.shape[0], run.P + run.out.shape[1], o.hidden.shape[-1]))
            run.hist[:, :run.P] = o.hidden
            run.draft.start(run.P, o.hidden.shape[0])
            run.d_off = run.P - 1
        else:
            run.draft.prefill(conds, cfg=run.proc.cfg)
            run.d_off = int(run.draft.cache_lens[0])
    sync(run.dev)
    t1 = time.perf_counter()
    check_finite(p)
    x = draw(p[:, 0], run.proc, lambda: run.rng.uniform(run.n, R.SAMPLE))
    commit(run, x[:, None], np.zeros(run.B, np.int64))
    sync(run.dev)
    zeros = np.zeros(run.B, np.int64)
    return Step(zeros, zeros, 0.0, t1 - t0, time.perf_counter() - t1, int(run.draft is not None and not run.feat),
                p=p if record else None)


def ar_step(run: Run, record: bool) -> Step:
    """One target forward over every image's last token, one token sampled per image (finished images
    ride along and are rolled back)."""
    t0 = time.perf_counter()
    last = run.out.gather(1, torch.as_tensor(run.n - 1, device=run.dev)[:, None])     # (B, 1)
    pos = run.positions(run.target, np.zeros(1, np.int64), run.P + run.T - 1)
    o = run.target.forward(run.rows(last), position_ids=pos, return_hidden=run.feat)
    p = run.proc.rows(o.logits)                                                        # (B, 1, V)
    if run.feat:
        store_hidden(run, o.hidden, pos)
    sync(run.dev)
    t1 = time.perf_counter()
    x = draw(p[:, 0], run.proc, lambda: run.rng.uniform(run.n, R.SAMPLE))
    act = run.active
    if not act.all():
        run.target.rollback(run.rows(np.where(act, 0, 1)))
    commit(run, x[:, None], np.zeros(run.B, np.int64))
    sync(run.dev)
    zeros = np.zeros(run.B, np.int64)
    return Step(zeros, zeros, 0.0, t1 - t0, time.perf_counter() - t1, p=p if record else None,
                drafts=last if record else None)


# ----------------------------------------------------------------------------- drafting

def feed_draft(run: Run):
    """Feed the draft every committed element it has not seen, one ragged block for the batch (shorter
    rows padded with their last element, the padding rolled back at once). Returns the draft output
    rows that follow each row's last committed element: logits (R, V) and hidden (R, D) (or None)."""
    draft = run.draft
    seen = draft.cache_lens[:run.B]
    need = np.where(run.active, run.d_off + run.n, seen)
    f = need - seen
    F = int(f.max())
    idx = np.minimum(seen[:, None] + np.arange(F)[None, :], np.maximum(need - 1, 0)[:, None])   # (B, F)
    idx_t = torch.as_tensor(idx, device=run.dev)
    tok = run.out.gather(1, (idx_t - run.d_off).clamp(min=0))               # elements before token 0: id 0
    tok = torch.where(idx_t < run.d_off, torch.zeros_like(tok), tok)
    pos = run.rows(idx)
    if run.feat:
        fidx = torch.as_tensor(pos, device=run.dev)[..., None].expand(-1, -1, run.hist.shape[-1])
        o = draft.forward(run.rows(tok), features=run.hist.gather(1, fidx), position_ids=pos)
    else:
        o = draft.forward(run.rows(tok), position_ids=pos)
    if (f < F).any():
        draft.rollback(run.rows(F - f))
    last = torch.as_tensor(run.rows(np.maximum(f - 1, 0)), device=run.dev)
    r = torch.arange(last.shape[0], device=run.dev)
    return o.logits[r, last], (o.hidden[r, last] if run.feat else None)


def draft_chain(run: Run, logits: torch.Tensor, hid: torch.Tensor | None, Lr: int):
    """Draft Lr tokens per image from the draft's rows that follow the committed tokens (logits (R, V),
    feature drafters: their hidden (R, D)): tokens (B, Lr), rows q (B, Lr, V)."""
    xs, qs = [], []
    cap = run.d_off + run.T - 1
    for i in range(Lr):   # a loop over the L draft positions (each one batched over images)
        q = run.proc.rows(logits)
        x = draw(q, run.proc, lambda: run.rng.uniform(run.n, R.DRAFT + i))
        xs.append(x)
        qs.append(q)
        if i < Lr - 1:
            pos = run.positions(run.draft, np.zeros(1, np.int64), cap)
            if run.feat:
                o = run.draft.forward(run.rows(x)[:, None], features=hid[:, None], position_ids=pos)
                hid = o.hidden[:, -1]
            else:
                o = run.draft.forward(run.rows(x)[:, None], position_ids=pos)
            logits = o.logits[:, -1]
    return torch.stack(xs, 1), torch.stack(qs, 1)


# ----------------------------------------------------------------------------- chain round

def verify_chain_round(run: Run, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, Lb: np.ndarray, verifier):
    """Verify a chain round's drafts x (B, Lr) drawn from q (B, Lr, V) against the target rows p (B, Lr + 1, V),
    image b's first Lb[b] drafts counting (``verify_chain``'s n_drafted), and roll the target's cache back to
    [last committed token; accepted drafts]. Returns the verdict, tau (B,) numpy (the round's sync) and the
    candidates (B, Lr + 1) whose first tau_b + 1 entries ``commit`` writes."""
    Lr = x.shape[1]
    check_finite(p, q)
    u_acc = run.rng.uniform(run.n, R.ACCEPT, (Lr,), p.dtype)
    u_smp = run.rng.uniform(run.n, R.SAMPLE, (), p.dtype)
    v = verify_chain_on(run, p, q, x, u_acc, u_smp, verifier, torch.as_tensor(Lb, device=run.dev))
    tau = v.accepted.cpu().numpy()                                                     # the round's sync
    cand = torch.cat([x, x[:, :1]], 1).scatter(1, v.accepted[:, None], v.next_token[:, None])
    run.target.rollback(run.rows(np.where(run.active, Lr - tau, Lr + 1)))
    return v, tau, cand


def chain_step(run: Run, L: int, verifier, record: bool, conds: list | None = None) -> Step:
    """One chain round for the batch (module docstring). With ``conds`` this is round 0 of an independent
    draft: both models' prefills, the target's over [prefix; drafts] (target forwards == rounds)."""
    act = run.active
    Lb = np.where(act, np.minimum(L, run.T - run.n - 1), 0)
    Lr = int(Lb.max())
    if Lr == 0:
        return ar_step(run, record) if conds is None else prefill_step(run, conds, record)
    t0 = time.perf_counter()
    if conds is None:
        logits, hid = feed_draft(run)
    else:
        logits, hid = run.draft.prefill(conds, cfg=run.proc.cfg).logits[:, -1], None
        run.d_off = int(run.draft.cache_lens[0])
    x, q = draft_chain(run, logits, hid, Lr)
    sync(run.dev)
    t1 = time.perf_counter()
    if conds is None:
        last = run.out.gather(1, torch.as_tensor(run.n - 1, device=run.dev)[:, None])
        pos = run.positions(run.target, np.arange(Lr + 1), run.P + run.T - 1)
        o = run.target.forward(run.rows(torch.cat([last, x], 1)), position_ids=pos, return_hidden=run.feat)
        if run.feat:
            store_hidden(run, o.hidden, pos)
    else:
        o = run.target.prefill(conds, run.rows(x), cfg=run.proc.cfg)
        run.P = int(run.target.cache_lens[0]) - Lr
    p = run.proc.rows(o.logits)                                                        # (B, Lr + 1, V)
    sync(run.dev)
    t2 = time.perf_counter()
    v, tau, cand = verify_chain_round(run, p, q, x, Lb, verifier)
    own = Lr - 1 if run.feat else np.where(act, Lr - 1 - np.minimum(tau, Lr - 1), Lr - 1)
    if np.any(own):
        run.draft.rollback(run.rows(np.broadcast_to(own, (run.B,)).astype(np.int64)))
    commit(run, cand, tau)
    sync(run.dev)
    return ChainStep(Lb, np.where(act, tau, 0), t1 - t0, t2 - t1, time.perf_counter() - t2, Lr,
                     p=p if record else None, drafts=x if record else None, q=q if record else None)
