"""One round of decoding for a batch of B images, whatever the drafting mode (gpt-fast style: one function per round).

``speculative_round`` is the round: the images' draft depths D'_b = min(D, T - n_b - 1) (the one place this
preamble is written), the mode's ``propose`` (``real.protocol.Proposal``), ONE target forward over the proposal's
nodes at their positions under its tree mask, ``theory.tree.verify_round`` (chains and trees alike, the verifier's
own fast walk when it has one), the commit of the accepted path plus the next token (``settle``), and the mode's
``advance``. What differs between the host path and the device path (where n lives, when rows are checked, how the
verdict comes back and is committed) stands behind one small interface, ``Run.side`` (``real.decode.sides``), so the
round itself has no branch on it. ``prefill_round`` (round 0: the target's prefill alone, the draft model started on the same conditions)
and ``ar_round`` (one plain AR step: every image one D'_b = 0 short of drafting) are the rounds without drafts.

Shapes: b < B indexes images, r < R = k B model rows (k = 2 with classifier-free guidance: rows [cond; uncond],
``Run.rows``). Positions are absolute: the target holds the condition prefix (P positions) then image token j at
position P + j; the draft stream is indexed by "elements": an independent draft's element d_off + j is image token j
(d_off = its prefix length), an EAGLE drafter's element i is the pair (token at target position i + 1, target hidden
state at position i), so d_off = P - 1 (``Run.d_off``). The KV caches are addressed by per-row lengths
(``real.nn.kvcache``): a block of S entries lands at each row's length, ``keep`` compacts a tree block to its
accepted path, ``rollback`` drops a chain's rejected tail.

Ragged batches (docs/theory.md sections 1, 9): the batch drafts max_b D'_b levels; ``verify_round(...,
max_depth=D')`` ignores what an image drafted past its own D'_b, so every image follows the law of the batch-1
round; images that finished (n_b = T) ride along and keep nothing; positions past an image's last token (drafts
that can never be accepted) are clamped to it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory.tree import verify_round

from . import rng as R
from .phases import event, phase
from .records import RoundRecord, Step
from .rng import Streams
from .sampling import Processing, draw
from .sides import HOST, OnDevice, check_finite

__all__ = ["RoundRecord", "Run", "OnDevice", "Step", "sync", "prefill_round", "ar_round", "speculative_round", "settle", "commit",
           "check_finite", "store_hidden", "on_host"]


def sync(device) -> None:
    """Wait for the device's queued work (CUDA) before a clock is read; a no-op elsewhere."""
    if (device if isinstance(device, torch.device) else torch.device(device)).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Run:
    """State of one batch's generation (module docstring for the index conventions); ``state`` is the drafting
    mode's own (``Drafting.start``)."""
    target: object
    draft: object | None
    proc: Processing
    rng: Streams                         # the batch's per-image random streams (real.decode.rng)
    T: int
    n: np.ndarray                        # (B,) committed tokens per image
    out: torch.Tensor                    # (B, T + slack) committed tokens (past n[b]: scratch)
    conds: list = field(default_factory=list)
    feat: bool = False                   # the target's hidden states are kept (an EAGLE-style drafter; features=True)
    host: bool = False                   # verify on numpy views of the rows (``on_host``)
    record: bool = False                 # keep the rows of every round (``record_rows``)
    P: int = 0                           # target prefix positions (0: not prefilled yet)
    d_off: int = 0                       # draft element of image token 0
    hist: torch.Tensor | None = None     # (R, P + T + slack, D) target hidden states by position (feature drafters)
    state: object = None
    on_device: OnDevice | None = None    # the device path's own counts (None: the host path, n on the host alone)

    @property
    def dev(self) -> torch.device:
        """The device of the committed tokens (the target's)."""
        return self.out.device

    @property
    def side(self):
        """The path's side of the round (``OnDevice``, or ``HOST`` on the host path): ``check``, ``read``, ``commit``,
        ``write``."""
        return HOST if self.on_device is None else self.on_device

    @property
    def n_dev(self) -> torch.Tensor | None:
        """(B,) int64 n on the device (the device path), None on the host path."""
        return None if self.on_device is None else self.on_device.n

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

    def positions(self, model, offsets, cap: int):
        """(R, S) absolute positions: each row's cache length + offsets ((S,) shared or (B, S) per image), clamped to
        ``cap`` (the image's last position: what lies past it is never accepted). numpy, or torch for torch offsets."""
        if isinstance(offsets, torch.Tensor):
            off = offsets[None] if offsets.ndim == 1 else self.rows(offsets)
            return (torch.as_tensor(model.cache_lens, device=off.device)[:, None] + off).clamp(max=cap)
        off = offsets[None, :] if offsets.ndim == 1 else self.rows(offsets)
        return np.minimum(model.cache_lens[:, None] + off, cap)

    def last_tokens(self) -> torch.Tensor:
        """(B, 1) each image's last committed token (the root of its next round; token 0 before any commit)."""
        if self.n_dev is not None:
            return self.out.gather(1, (self.n_dev - 1).clamp(min=0)[:, None])
        # the host path: read through the numpy view (a copy; one image: a slice of its row, copied)
        if len(self.n) == 1:
            i = max(int(self.n[0]) - 1, 0)
            return torch.from_numpy(self.out.numpy()[:1, i:i + 1].copy())
        return torch.from_numpy(self.out.numpy()[np.arange(self.B), np.maximum(self.n - 1, 0)][:, None])

    def dev_positions(self, base: int, cap: int, width: int = 1) -> torch.Tensor | None:
        """(R, width) positions base + n_b, clamped to ``cap``, computed on the device from ``n_dev`` (the device path:
        no host -> device copy of host positions); None on the host path."""
        if self.on_device is None:
            return None
        return (self.on_device.row_counts(self) + base).clamp(max=cap)[:, None].expand(-1, width)

    def depth_tensor(self, Db: np.ndarray, D: int, tail: int = 0) -> torch.Tensor:
        """``depths(D, tail)`` (= Db) as a device tensor: computed there from ``n_dev`` on the device path."""
        if self.n_dev is None:
            return torch.as_tensor(Db, device=self.dev)
        return (self.T - tail - 1 - self.n_dev).clamp(min=0, max=D)     # (a finished image, n = T: below 0, so 0)

    def depths(self, D: int, tail: int = 0) -> np.ndarray:
        """(B,) int64 D'_b = min(D, T - tail - n_b - 1) for unfinished images (0 at least), 0 for finished ones;
        ``tail``: the last image tokens a mode samples plainly (``Jacobi.plain_tail``)."""
        return np.where(self.active, np.clip(np.minimum(D, self.T - tail - self.n - 1), 0, None), 0)


# ----------------------------------------------------------------------------- the verifier's view and checks

def on_host(run: Run, *arrays):
    """The arrays as the round's verifier sees them: numpy views of the same memory with ``run.host`` (no copy),
    else as they are (``real.nn.devpath.host_verification``)."""
    if not run.host:
        return arrays
    return tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in arrays)


# ----------------------------------------------------------------------------- caches and the commit

def commit(run: Run, cand, tau: np.ndarray, tau_dev: torch.Tensor | None = None) -> None:
    """Write cand[b, :tau_b + 1] (B, S) (a tensor, or numpy on the host path) at out[b, n_b:]; n_b += tau_b + 1 for
    unfinished images (and ``n_dev`` on the device path, from ``tau_dev``, tau on the device; None: tau = 0)."""
    run.side.write(run, cand, tau, tau_dev)


def store_hidden(run: Run, hidden: torch.Tensor, pos) -> None:
    """Feature drafters: keep the target's hidden states (R, S, D) at absolute positions pos (R, S)."""
    idx = torch.as_tensor(pos, device=run.dev)[..., None].expand(-1, -1, hidden.shape[-1])
    run.hist.scatter_(1, idx, hidden.to(run.hist.dtype))


def settle(run: Run, prop, hidden, v, Db: np.ndarray, Dt) -> tuple:
    """After the verdict ``v``: read it back (``Run.side.read``: the round's one sync on the device path), keep the
    accepted path in the target's cache (a chain: its rejected tail rolled back; a tree: ``keep`` of [root; path]),
    for feature drafters its hidden states at their positions, and commit path + next token. ``Db`` (B,) the images'
    caps D'_b (``Dt`` the same as ``Run.depth_tensor`` gives them). Returns tau (B,), the accepted nodes (B, Dr)
    (-1 past tau, Dr = max Db), the nodes each image drafted (B,) and the proposal's parents (B, N+1) or None."""
    side, act = run.side, run.active
    tau, path, drafted, parent = side.read(run, prop, v, Db, Dt)
    Dr = path.shape[1]
    keep = np.zeros((run.B, Dr + 1), np.int64)                                       # (B, Dr + 1) [root; path]
    np.maximum(path, 0, out=keep[:, 1:])
    N = prop.tokens.shape[1] - 1
    if prop.tree is None:          # a chain keeps a prefix of its block (also right after a prefill of drafts)
        run.target.rollback(run.rows(np.where(act, N - tau, N + 1)))
    else:
        run.target.keep(run.rows(keep), run.rows((tau + 1) * act))
    if run.feat:
        kidx = torch.as_tensor(run.rows(keep), device=run.dev)[..., None].expand(-1, -1, hidden.shape[-1])
        store_hidden(run, hidden.gather(1, kidx), run.rows(run.P + run.n - 1)[:, None] + np.arange(Dr + 1))
    side.commit(run, prop, v, tau, path)
    return tau, path, drafted, parent


# ----------------------------------------------------------------------------- the rounds

def _start_draft(run: Run, conds: list, hidden) -> None:
    """Start the draft model on the conditions after the target's prefill: a feature drafter on the target's prefix
    (its hidden states kept by position), an independent draft by its own prefill."""
    if run.feat:
        run.hist = hidden.new_zeros((hidden.shape[0], run.P + run.out.shape[1], hidden.shape[-1]))
        run.hist[:, :run.P] = hidden
        if run.draft is not None:
            run.draft.start(run.P, hidden.shape[0])
        run.d_off = run.P - 1
    else:
        run.draft.prefill(conds, cfg=run.proc.cfg)
        run.d_off = int(run.draft.cache_lens[0])


def prefill_round(run: Run, mode) -> Step:
    """Round 0: the target's prefill alone gives token 0; the draft model (if any) is started on the same conditions;
    then the mode's state (``Drafting.start``)."""
    event("round")
    t0 = time.perf_counter()
    with phase("target"):
        o = run.target.prefill(run.conds, cfg=run.proc.cfg, return_hidden=run.feat)
        p = run.proc.rows(o.logits[:, -1:])                                   # (B, 1, V)
        run.P = int(run.target.cache_lens[0])
    if run.draft is not None or run.feat:     # (no draft with feat: plain AR keeping the features, engine.generate)
        with phase("draft"):
            _start_draft(run, run.conds, o.hidden)
    sync(run.dev)
    t1 = time.perf_counter()
    with phase("verify"):
        run.side.check_prefill(p)      # (the device path: with the first round's verdict, no read-back here)
        x = draw(p[:, 0], run.proc, lambda: run.rng.uniform(run.n, R.SAMPLE))
    commit(run, x[:, None], np.zeros(run.B, np.int64))
    run.state = mode.start(run)
    sync(run.dev)
    zeros = np.zeros(run.B, np.int64)
    return Step(zeros, zeros, 0.0, t1 - t0, time.perf_counter() - t1, int(run.draft is not None and not run.feat),
                p=p if run.record else None)


def ar_round(run: Run) -> Step:
    """One target forward over every image's last token, one token sampled per image (finished images ride along and
    are rolled back)."""
    event("round")
    t0 = time.perf_counter()
    last = run.last_tokens()                                                          # (B, 1)
    pos = run.dev_positions(run.P - 1, run.P + run.T - 1)       # the root's position (its cache length)
    pos = run.positions(run.target, np.zeros(1, np.int64), run.P + run.T - 1) if pos is None else pos
    with phase("target"):
        o = run.target.forward(run.rows(last), position_ids=pos, return_hidden=run.feat)
        p = run.proc.rows(o.logits)                                                        # (B, 1, V)
    if run.feat:
        store_hidden(run, o.hidden, pos)
    sync(run.dev)
    t1 = time.perf_counter()
    with phase("verify"):
        run.side.check_unchecked()             # the prefill's rows (no speculative round came to check them)
        x = draw(p[:, 0], run.proc, lambda: run.rng.uniform(run.n, R.SAMPLE))
    act = run.active
    if not act.all():
        run.target.rollback(run.rows(np.where(act, 0, 1)))
    commit(run, x[:, None], np.zeros(run.B, np.int64))
    sync(run.dev)
    zeros = np.zeros(run.B, np.int64)
    return Step(zeros, zeros, 0.0, t1 - t0, time.perf_counter() - t1, p=p if run.record else None,
                drafts=last if run.record else None)


def _target_block(run: Run, prop):
    """The target's one forward over the proposal's nodes at their positions under its mask; the prefill of the
    drafts themselves when the target was not prefilled yet (a chain drafted from round 0: the prefix's last entry
    plays the root)."""
    if run.P == 0:
        o = run.target.prefill(run.conds, run.rows(prop.tokens[:, 1:]), cfg=run.proc.cfg, return_hidden=run.feat)
        run.P = int(run.target.cache_lens[0]) - (prop.tokens.shape[1] - 1)
        return o
    pos = run.side.node_positions(run, prop)                       # (R, N+1) the root's position + node depths
    mask = prop.mask
    if mask is not None and mask.ndim == 3:         # one image: the (S, K) mask every model takes; else one per row
        mask = mask[0] if run.B == 1 else run.rows(mask)
    return run.target.forward(run.rows(prop.tokens), position_ids=pos, attn_mask=mask, return_hidden=run.feat)


def _clock(run: Run) -> float:
    """The wall clock once the device's queued work is done (``sync``)."""
    sync(run.dev)
    return time.perf_counter()


def speculative_round(run: Run, mode, verifier) -> Step:
    """One round of ``mode`` for the batch (module docstring): draft, one target forward, verify, commit (``settle``),
    advance; the path's side (``Run.side``) checks the rows and reads the verdict back."""
    tail = getattr(mode, "plain_tail", 0)
    Db = run.depths(mode.max_depth, tail)
    Dr = int(Db.max())
    if Dr == 0:
        return ar_round(run)
    event("round")
    run.rng.begin_round(run.n)           # the device path: the round's uniforms hashed in one pass (real.decode.rng)
    n0, act = run.n.copy(), run.active
    t0 = time.perf_counter()
    with phase("draft"):
        prop = mode.propose(run, Db)
    t1 = _clock(run)
    with phase("target"):
        o = _target_block(run, prop)
        p = run.proc.rows(o.logits)                                                        # (B, N+1, V)
    t2 = _clock(run)
    with phase("verify"):
        run.side.check(p, None if prop.q_checked else prop.q)     # (rows a mode knows finite are not summed again)
        N = prop.tokens.shape[1] - 1
        u_acc = run.rng.uniform(run.n, R.ACCEPT, (N + 1,), p.dtype)
        u_smp = run.rng.uniform(run.n, R.SAMPLE, (), p.dtype)
        Dt = Db if run.host and run.on_device is None else run.depth_tensor(Db, mode.max_depth, tail)   # (host: as is)
        P_, Q_, X_, UA, US, D_ = on_host(run, p, prop.q, prop.tokens, u_acc, u_smp, Dt)
        if prop.verify is None:          # the walk, or a mode's own verdict (real.protocol.Proposal.verify)
            v = verify_round(P_, Q_, X_, UA, US, prop.tree, verifier, law=prop.law, max_depth=D_)
        else:
            v = prop.verify(P_, Q_, X_, UA, US, verifier, D_)
    tau, path, drafted, parent = settle(run, prop, o.hidden, v, Db, Dt)
    v = v._replace(accepted=tau, path=path)                                            # the verdict on the host
    t3 = time.perf_counter()
    mode.advance(run, prop, v, p, n0)
    t4 = _clock(run)
    chain = prop.tree is None
    rows = dict(p=p, q=prop.q, drafts=prop.tokens[:, 1:] if chain else prop.tokens) if run.record else {}
    return Step(np.where(act, drafted, 0), np.where(act, tau, 0), t1 - t0 + t4 - t3, t2 - t1, t3 - t2,
                prop.draft_forwards, chain, depth=Db, nodes=path, parent=parent, **rows)
