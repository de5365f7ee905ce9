"""The two sides of a round (``real.decode.round``), behind one interface: the host path (``HOST``: n on the host
alone, CPU tensors, rows checked at once, the verdict read as numpy, tokens written through numpy views) and the device
path (``OnDevice``: n kept on the device, the rows' finiteness and the verdict read back together, the round's one
sync). A round asks ``Run.side`` to ``check`` rows, ``read`` the verdict, ``commit`` it and ``write`` tokens; it never
asks which side it has (``real.nn.devpath`` decides, once per batch: ``real.decode.engine.generate``).

Shapes: B images, R = k B model rows, Dr the round's deepest cap, N drafted nodes (``real.decode.round``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["HOST", "OnDevice", "check_finite", "drafted_nodes"]


def check_finite(*rows) -> None:
    """ValueError unless every entry of the probability rows (None ignored) is finite: rows in [0, 1] sum to a finite
    number iff every entry is (on CPU: their max plus their min), so one reduction and one sync decide the usual case;
    the entries are looked at only then."""
    rows = [r for r in rows if r is not None]
    if all(r.is_cpu and not r.requires_grad for r in rows):     # CPU rows: numpy on their views, the
        # largest plus the smallest entry (NaN propagates through both; finite iff no NaN, +inf or -inf: a
        # vectorised max and min cost half of a pairwise sum)
        if len(rows) == 1:                  # (one row tensor, the usual case: no generator)
            a = rows[0].numpy()
            if math.isfinite(float(a.max()) + float(a.min())):
                return
        elif math.isfinite(sum(float(a.max()) + float(a.min()) for a in (r.numpy() for r in rows))):
            return
    elif bool(torch.isfinite(sum(r.sum() for r in rows))):
        return
    if not all(bool(torch.isfinite(r).all()) for r in rows):
        raise ValueError("non-finite probabilities (NaN/inf logits from the model?)")


def _host(x):
    """A device tensor as numpy on the host; anything else as it is."""
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else x


def drafted_nodes(depth, D):
    """(B,) nodes each image drafted within its cap: ``depth`` the proposal's node depths (N+1,) or (B, N+1), root at
    0 (numpy or torch), ``D`` (B,) the images' caps D'_b (the same library)."""
    return ((depth[..., 1:] >= 1) & (depth[..., 1:] <= D[:, None])).sum(-1)


class _Host:
    """The host path's side of a round (``run``: a ``real.decode.round.Run`` whose ``on_device`` is None: n on the host
    alone, CPU tensors): rows checked at
    once, the verdict read as numpy, the commit written through numpy views. ``OnDevice`` is the device path's side;
    a round asks its side (``Run.side``) for the nodes' ``node_positions``, to ``check`` rows, ``read`` the verdict,
    ``commit`` it and ``write`` tokens, and never asks which side it has."""

    def check(self, *rows) -> None:
        """ValueError now unless the rows (None ignored) are finite (``check_finite``)."""
        check_finite(*rows)

    def check_prefill(self, p) -> None:
        """The prefill's rows (B, 1, V): checked now."""
        check_finite(p)

    def check_unchecked(self) -> None:
        """Nothing waits: the host checks every row at once."""

    def read(self, run, prop, v, Db: np.ndarray, Dt) -> tuple:
        """The verdict ``v`` on the host: tau (B,) and the accepted nodes (B, Dr) (-1 past tau; Dr = max Db) int64,
        the nodes each image drafted within its cap ``Db`` (B,), and the proposal's parents (B, N+1) (None: a tree
        shared by the batch, or a chain)."""
        tau = np.asarray(v.accepted).astype(np.int64, copy=False)
        path = np.asarray(v.path).astype(np.int64, copy=False)[:, :int(Db.max())]
        return tau, path, drafted_nodes(_host(prop.depth), Db), _host(prop.parent)

    def node_positions(self, run, prop) -> np.ndarray:
        """(R, N+1) the target positions of the proposal's nodes: each row's cache length (the root's position
        P + n_b - 1) + the node depths, clamped to the image's last position."""
        return run.positions(run.target, prop.depth, run.P + run.T - 1)

    def commit(self, run, prop, v, tau: np.ndarray, path: np.ndarray) -> None:
        """Commit the accepted path's tokens (B, Dr), then the next token at tau_b, on numpy views."""
        B, Dr = path.shape
        kp = np.empty((B, Dr + 1), np.int64)                          # [path; its first node] (B, Dr + 1), >= 0
        np.maximum(path, 0, out=kp[:, :Dr])
        kp[:, Dr] = kp[:, 0]
        tok = prop.tokens.numpy()
        cand = tok[0, kp] if B == 1 else tok[np.arange(B)[:, None], kp]                        # (B, Dr + 1)
        cand[np.arange(B), tau] = np.asarray(v.next_token)
        self.write(run, cand, tau)

    def write(self, run, cand, tau: np.ndarray, tau_dev=None) -> None:
        """Write cand[b, :tau_b + 1] (B, S) (a CPU tensor or numpy) at out[b, n_b:] through the numpy view of the
        committed tokens; n_b += tau_b + 1 for unfinished images (past tau_b + 1: scratch)."""
        c = cand if isinstance(cand, np.ndarray) else cand.numpy()
        out, n, S = run.out.numpy(), run.n, c.shape[1]
        if len(n) == 1:               # one image: a slice (the same entries; past the row's end an error as below)
            n0 = int(n[0])
            out[0, n0:n0 + S] = c[0]
            run.n = np.array([n0 + (int(tau[0]) + 1) * (n0 < run.T)], n.dtype)   # (as below, in Python ints)
            return
        out[np.arange(len(n))[:, None], n[:, None] + np.arange(S)] = c
        run.n = n + (tau + 1) * (n < run.T)           # unfinished images only (0 for finished ones)


HOST = _Host()


@dataclass
class OnDevice:
    """The device path's side of a batch (CUDA: no host -> device copy of what the host already knows; the interface
    of ``_Host``): ``n`` (B,) int64 the committed counts on the device, their per-model-row copy (R,) (made once per
    round), ``unchecked``, the prefill's rows whose finiteness is read back with the first round's verdict, and the
    round's finiteness flag (``check``), read back with its verdict (``read``: the round's one sync)."""
    n: torch.Tensor
    unchecked: torch.Tensor | None = None
    _rows: tuple | None = None           # (n, its per-row copy): the copy of this round's n
    _flag: tuple | None = None           # (the round's finiteness flag, the rows it covers)

    def row_counts(self, run) -> torch.Tensor:
        """(R,) the per-model-row copy of ``n`` (one cat per round)."""
        if self._rows is None or self._rows[0] is not self.n:
            self._rows = (self.n, run.rows(self.n))
        return self._rows[1]

    def node_positions(self, run, prop) -> torch.Tensor:
        """(R, N+1) the target positions of the proposal's nodes, computed on the device from ``n``: the root's
        position P + n_b - 1 (its cache length) + the node depths (a chain's: 0..N), clamped to the image's last."""
        d, cap = prop.depth, run.P + run.T - 1
        d = torch.arange(d.shape[-1], device=run.dev) if prop.tree is None else torch.as_tensor(d, device=run.dev)
        return (run.dev_positions(run.P - 1, cap, d.shape[-1]) + (d if d.ndim == 1 else run.rows(d))).clamp(max=cap)

    def check_prefill(self, p) -> None:
        """The prefill's rows (B, 1, V): checked with the first round's verdict (no read-back of their own)."""
        self.unchecked = p

    def check(self, *rows) -> None:
        """One device flag, whether the rows (None ignored) and the prefill's waiting ones are all finite, read back
        with the verdict (``read``: no sync of its own)."""
        rows = tuple(r for r in (*rows, self.unchecked) if r is not None)
        self.unchecked = None
        self._flag = (torch.isfinite(sum(r.sum() for r in rows)), rows)

    def read(self, run, prop, v, Db: np.ndarray, Dt: torch.Tensor) -> tuple:
        """The round's one read-back: what ``_Host.read`` returns, tau and the accepted nodes (B, Dr) read with the
        finiteness flag of ``check`` and, where the proposal holds them as device tensors, the drafted node counts
        (B,) (within the caps ``Dt``, ``Db`` on the device) and a dynamic tree's parents (B, N+1), all packed in one
        copy to the host (what the proposal holds on the host is counted there); ValueError when a checked row is
        not finite (``check_finite`` names the fault)."""
        Dr, (finite, checked) = int(Db.max()), self._flag
        more = {"finite": finite.long().expand(run.B)}
        if isinstance(prop.depth, torch.Tensor):
            more["drafted"] = drafted_nodes(prop.depth, Dt)
        if isinstance(prop.parent, torch.Tensor):            # a dynamic tree's parents
            more["parent"] = prop.parent.long()
        head = torch.cat([torch.as_tensor(v.accepted)[:, None], torch.as_tensor(v.path)[:, :Dr],
                          *(e if e.ndim == 2 else e[:, None] for e in more.values())], 1).cpu().numpy()
        tau, path, got, c = head[:, 0], head[:, 1:Dr + 1], {}, Dr + 1
        for k, e in more.items():            # the read-backs by name, in the order they were packed
            w = e.shape[1] if e.ndim == 2 else 1
            got[k], c = (head[:, c:c + w].copy() if e.ndim == 2 else head[:, c]), c + w
        if not got["finite"].all():
            check_finite(*checked)           # raises (the entries looked at, as on the host path)
        drafted = got["drafted"] if "drafted" in got else drafted_nodes(_host(prop.depth), Db)
        return tau, path, drafted, got["parent"] if "parent" in got else _host(prop.parent)

    def commit(self, run, prop, v, tau: np.ndarray, path: np.ndarray) -> None:
        """Commit the accepted path's tokens, then the next token at tau_b: from the verdict's own device tensors when
        it lies on the run's device (no copy back), else from the host's tau and path."""
        acc = torch.as_tensor(v.accepted)
        own = acc.device == run.dev
        if own:
            tau_t, kp = acc.long(), torch.as_tensor(v.path)[:, :path.shape[1]].long().clamp(min=0)
        else:
            tau_t, kp = torch.as_tensor(tau, device=run.dev), torch.as_tensor(np.maximum(path, 0), device=run.dev)
        cand = prop.tokens.gather(1, kp)
        nxt = torch.as_tensor(v.next_token, device=run.dev)
        cand = torch.cat([cand, cand[:, :1]], 1).scatter(1, tau_t[:, None], nxt[:, None])
        self.write(run, cand, tau, tau_t if own else None)

    def write(self, run, cand: torch.Tensor, tau: np.ndarray, tau_dev: torch.Tensor | None = None) -> None:
        """Write cand[b, :tau_b + 1] (B, S) at out[b, n_b:] from the device's n; n_b += tau_b + 1 for unfinished
        images, on the host and (from ``tau_dev``, tau on the device; None: tau = 0) on the device."""
        n = self.n
        run.out.scatter_(1, n[:, None] + torch.arange(cand.shape[1], device=run.dev), cand)   # past tau_b + 1: scratch
        run.n = run.n + np.where(run.active, tau + 1, 0)
        # n + tau + 1 <= T for an unfinished image (tau <= D'_b), so the clamp keeps T
        self.n = (n + 1 if tau_dev is None else n + tau_dev + 1).clamp(max=run.T)

    def check_unchecked(self) -> None:
        """Check the prefill's rows still waiting for a read-back (no speculative round came to check them)."""
        if self.unchecked is not None:
            check_finite(self.unchecked)
            self.unchecked = None
