"""Per-image random streams: every uniform an image uses depends only on (seed, image index, where it is used).

``engine.generate`` used to draw from one ``torch.Generator`` per batch, so an image's tokens depended on the
batch size and on the other images of its batch. Here a uniform is a hash of a key, counter-based (as Philox
or JAX's PRNG keys are), so draws stay vectorised over the batch and need no state per row:

    u = mix(seed, image, n, purpose, coordinates)   in [0, 1), float64 with 53 random bits

* ``image`` is the image's index in the call (``generate``'s k-th condition is image k);
* ``n`` is the number of tokens the image had committed when the round began: it grows by at least one
  every round, so (image, n) names one round of one image whatever the batch;
* ``purpose`` says which draw of the round it is (``DRAFT + i`` for the i-th chain draft, ``ACCEPT``,
  ``SAMPLE``, ``TREE + d`` for tree level d, ...);
* ``coordinates`` index the draw inside its purpose (draft position, candidate, token), with fixed
  strides, so a row reads the same value at a coordinate whatever the batch's widest row drafted.

Then image k of a run depends only on (seed, k): not on the batch size, the rank, nor the other images of
its batch (tests/test_batch.py checks B = 1, 3, 8). The mixing function is splitmix64's finaliser on int64
tensors (multiplication wraps modulo 2^64 in two's complement; logical right shifts are masked).
"""
from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np
import torch

from real.nn.devpath import host_path, to_device

__all__ = ["Streams", "DRAFT", "ACCEPT", "SAMPLE", "TREE", "JACOBI"]

# purposes (disjoint ranges; a chain draft position or a tree level is added to its base)
SAMPLE = 1          # the one token drawn from a target row (round 0, plain AR, the resampled / bonus token)
ACCEPT = 2          # the acceptance uniforms of a verification, one per draft (node)
DRAFT = 1 << 10     # + i: the i-th chain draft of a round
TREE = 2 << 10      # + d: the candidates drawn at tree level d
JACOBI = 3 << 10    # + j: Jacobi re-drafting / initialisation of window slot j

_M1 = 0xBF58476D1CE4E5B9     # splitmix64's multipliers and increment
_M2 = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15
_STRIDE = 1 << 21           # coordinate strides: up to 2^21 per coordinate (vocabularies, nodes, positions)
_SIGNED = lambda c: c - (1 << 64) if c >= 1 << 63 else c  # noqa: E731  (the same 64 bits as an int64)
_MASK = (1 << 64) - 1
_SMALL_KEYS = 16            # (image, purpose) keys of a call mixed with Python integers up to this many (``_round_keys``)
_BELOW_ONE_F32 = float(np.nextafter(np.float32(1), np.float32(0)))   # the largest float32 below 1
_BELOW_ONE_F32_NP = np.float32(_BELOW_ONE_F32)
_UNIT = 1.0 / (1 << 53)     # a 53-bit integer to [0, 1) (``_unit``)
_SMALL_ENTRIES = 64         # entries of a round's plan hashed in Python integers at most (``begin_round``)
_BASE_ENTRIES = 1 << 13     # entries of a rows plan whose counters are kept whole at most (``rows_plan``: 64 KiB)


def _mix(x):
    """splitmix64's finaliser, a bijection of 64-bit integers with full avalanche, on numpy uint64 (the host path)
    or torch int64 (device tensors: multiplication wraps modulo 2^64 in two's complement; logical right shifts
    are masked, torch's >> being arithmetic on signed integers). A numpy array is mixed IN PLACE (every caller
    passes a fresh temporary: the hash of a round's rows without a new array per step) and returned."""
    if isinstance(x, np.ndarray):
        x ^= x >> np.uint64(30)
        x *= np.uint64(_M1)
        x ^= x >> np.uint64(27)
        x *= np.uint64(_M2)
        x ^= x >> np.uint64(31)
        return x
    shr = lambda v, k: (v >> k) & ((1 << (64 - k)) - 1)  # noqa: E731
    x = (x ^ shr(x, 30)) * _SIGNED(_M1)
    x = (x ^ shr(x, 27)) * _SIGNED(_M2)
    return x ^ shr(x, 31)


def _mix_int(x: int) -> int:
    """``_mix`` on one Python integer in [0, 2^64) (the same bijection, modulo 2^64): a few keys mixed without the
    per-call cost of a numpy array's ~10 operations."""
    x = ((x ^ (x >> 30)) * _M1) & _MASK
    x = ((x ^ (x >> 27)) * _M2) & _MASK
    return x ^ (x >> 31)


def _unit(h) -> torch.Tensor:
    """Fresh hashes ``h`` (``_mix``'s: numpy uint64 on the host, consumed in place; torch int64 on a device) to float64
    uniforms in [0, 1): the top 53 bits over 2^53 (torch: the logical shift masked, as in ``_mix``); a torch tensor."""
    if isinstance(h, np.ndarray):
        h >>= np.uint64(11)
        u = h.astype(np.float64)
        u *= 1.0 / (1 << 53)
        return torch.from_numpy(u)
    return ((h >> 11) & ((1 << 53) - 1)).to(torch.float64) * (1.0 / (1 << 53))


def _counters(shape: tuple, device=None):
    """The coordinates of every entry of ``shape`` folded into one integer with fixed strides (broadcastable):
    numpy uint64 (``device`` None: built once per shape, read-only) or torch int64 on ``device``."""
    if device is None and len(shape):
        return _host_counters(tuple(shape))
    return _build_counters(shape, device)


@lru_cache(maxsize=64)
def _host_counters(shape: tuple) -> np.ndarray:
    """``_counters(shape)`` on the host, built once per shape (read-only)."""
    c = np.asarray(_build_counters(shape, None))
    c.setflags(write=False)
    return c


def _build_counters(shape: tuple, device=None):
    """``_counters``'s integers, built."""
    xp_arange = (lambda k: np.arange(k, dtype=np.uint64)) if device is None else \
        (lambda k: torch.arange(k, dtype=torch.int64, device=device))
    ctr = 0
    for d, k in enumerate(shape):      # a loop over at most 3 coordinate axes, each a broadcast arange
        ctr = ctr + xp_arange(k).reshape((k,) + (1,) * (len(shape) - d - 1)) * (_STRIDE ** (len(shape) - 1 - d))
    return ctr


class Streams:
    """The per-image random streams of one batch: ``images`` (B,) int64 are the images' indices in the call.

    ``uniform(n, purpose, shape)`` -> (B, *shape) float64 uniforms in [0, 1): row b keyed by
    (seed, images[b], n[b], purpose), entry c by its coordinates (each < 2^21, at most 3 of them). On a CPU
    device the hashing runs in numpy (uint64; a few microseconds per call), elsewhere in torch on the device.

    A round's draws in one pass: ``begin_round(n)`` hashes, at once, every draw the previous
    round made at its own n (the same purposes and shapes, now at ``n``); a ``uniform`` call of the round that
    asks for one of them gets it from there, any other is hashed on its own. Each uniform is a function of its key
    alone, so the values are the same bits either way; what changes is the count of operations (on a device one hash
    pass of ~17 element-wise kernels per round instead of ~30 per draw: issue 42's ``bench_ops``; on the host one
    numpy pass instead of one per draw). The keys of (image, n, purpose) are mixed on the host, which knows n, and
    sent without a sync (``to_device``); the device mixes in the coordinates."""

    # entries (all rows together) hashed ahead at most: 4M float64 = 32 MiB, ~5x that in the hash's temporaries;
    # beyond (e.g. 64 images drafting 25-node trees over V = 16384), draw by draw as before, bounding the peak memory
    _PLAN_MAX = 1 << 22

    def __init__(self, seed: int, images: np.ndarray, device):
        self.device = torch.device(device)
        with np.errstate(over="ignore"):
            base = _mix(np.asarray([(int(seed) * 2 + 1) * _GOLDEN % (1 << 64)], np.uint64))
            self.keys = _mix(base + np.asarray(images, np.int64).astype(np.uint64) * np.uint64(_GOLDEN))   # (B,)
        self._keys_int = [int(k) for k in self.keys]   # the same keys as Python integers (``_round_keys``)
        self._on_device = not host_path(self.device)  # the device path: keys on the host, coordinates on the device
        self._round_n: np.ndarray | None = None    # the n of the round begun last
        self._asked: list[tuple[int, tuple]] = []  # the (purpose, shape) draws made at that n, in order
        self._ahead: dict = {}                     # (purpose, shape) -> (B, *shape) float64, hashed at begin_round
        self._asked32: set = set()                 # the host draws of that n asked in float32
        self._ahead32: dict = {}                   # their float32 values, rounded once per round (host path)
        self._plan_arrays = None                   # (plan, counters * golden, entry -> purpose slot, purposes)

    def _round_keys(self, n: np.ndarray, purposes) -> np.ndarray:
        """(B, P) uint64 keys of (image, n, purpose) on the host, where n is known (the device then mixes in the
        coordinates only: the same bits, a third of the device operations, no read-back)."""
        if len(self._keys_int) * len(purposes) <= _SMALL_KEYS:    # a few keys: Python integers, the same bits
            return np.array(self._round_keys_int(n, purposes), np.uint64).reshape(len(self._keys_int), len(purposes))
        n = np.asarray(n, np.int64).astype(np.uint64)
        with np.errstate(over="ignore"):
            return _mix(self.keys[:, None] ^ _mix(n[:, None] * np.uint64(_GOLDEN)
                                                   + np.asarray(purposes, np.int64).astype(np.uint64)[None, :]))

    def _round_keys_int(self, n: np.ndarray, purposes) -> list:
        """``_round_keys`` as Python integers, [[key of (image b, n_b, purpose) for each purpose] for each image]
        (``_mix_int``: the same bits)."""
        return [[_mix_int(k ^ _mix_int((nb * _GOLDEN + int(pu)) & _MASK)) for pu in purposes]
                for k, nb in zip(self._keys_int, np.asarray(n, np.int64).tolist())]      # (n >= 0)

    def begin_round(self, n: np.ndarray) -> None:
        """A round starts at committed lengths ``n`` (B,): hash the previous round's draws at ``n`` in one pass (class
        docstring), on the host in numpy or on the device. A small plan on the host (at most ``_SMALL_ENTRIES``
        entries in all, e.g. a tree's acceptance uniforms and its one sample) is mixed in Python integers
        (``_mix_int``, the same bijection, and the same 53-bit float: the same bits) instead of ~15 numpy calls."""
        plan = list(dict.fromkeys(self._asked))
        f32 = self._asked32
        self._round_n, self._asked, self._ahead, self._asked32, self._ahead32 = \
            np.asarray(n, np.int64).copy(), [], {}, set(), {}
        if not plan:
            return
        key = tuple(plan)
        if self._plan_arrays is None or self._plan_arrays[0] != key:     # the same plan round after round: built once
            sizes = [math.prod(s) for _, s in plan]
            if sum(sizes) * len(self.keys) > self._PLAN_MAX:
                return
            purposes = sorted({pu for pu, _ in plan})
            slot = {pu: i for i, pu in enumerate(purposes)}
            which = np.repeat([slot[pu] for pu, _ in plan], sizes)                        # (M,) each entry's purpose
            ctr = np.concatenate([_counters(s).reshape(-1) if s else np.zeros(1, np.uint64) for _, s in plan])
            with np.errstate(over="ignore"):
                ctr_g = ctr * np.uint64(_GOLDEN)                                          # (M,) uint64
            small = None
            if not self._on_device and sum(sizes) * len(self.keys) <= _SMALL_ENTRIES:
                small = list(zip(which.tolist(), ctr_g.tolist()))           # Python ints: (purpose slot, counter)
            if self._on_device:
                ctr_g, which = to_device(ctr_g.view(np.int64), self.device), to_device(which, self.device, torch.int64)
            starts = list(itertools.accumulate([0] + sizes[:-1]))
            self._plan_arrays = (key, ctr_g, which, purposes, small, list(zip(plan, sizes, starts)))
        _, ctr_g, which, purposes, small, spans = self._plan_arrays
        if small is not None:          # a few entries: Python integers, then one numpy array (the same bits as below)
            u = np.array([[(_mix_int((kb[w] + c) & _MASK) >> 11) * _UNIT for w, c in small]
                          for kb in self._round_keys_int(self._round_n, purposes)], np.float64)
            for (key, m, start) in spans:           # torch views of numpy slices (a torch slice costs ~3x more)
                self._ahead[key] = torch.from_numpy(u[:, start:start + m].reshape((-1, *key[1])))
            self._round_f32(u, spans, f32)
            return
        k = self._round_keys(self._round_n, purposes)                                     # (B, purposes) uint64
        if self._on_device:
            u = _unit(_mix(to_device(k.view(np.int64), self.device).index_select(1, which) + ctr_g))    # (B, M)
        else:
            with np.errstate(over="ignore"):
                u = _unit(_mix(k[:, which] + ctr_g))
        for (key, m, start) in spans:
            self._ahead[key] = u[:, start:start + m].reshape((-1, *key[1]))
        if not self._on_device:
            self._round_f32(u.numpy(), spans, f32)

    def _round_f32(self, u: np.ndarray, spans: list, keys: set) -> None:
        """The host path's float32 values of the round's draws that the last round asked in float32 (``keys``): the
        hashed (B, M) float64 uniforms ``u`` rounded and kept below 1 at once (``uniform``'s rounding, elementwise:
        the same bits), torch views by draw."""
        if not keys:
            return
        u32 = u.astype(np.float32)
        np.minimum(u32, _BELOW_ONE_F32_NP, out=u32)
        for (key, m, start) in spans:
            if key in keys:
                self._ahead32[key] = torch.from_numpy(u32[:, start:start + m].reshape((-1, *key[1])))

    def uniform(self, n: np.ndarray, purpose: int, shape: tuple = (), dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """(B, *shape) uniforms in [0, 1) (class docstring); ``n`` (B,) the rows' committed lengths at the round's
        start. ``dtype`` float32 rounds the 53-bit value, and a value that would round up to 1 is kept below it."""
        shape, purpose = tuple(map(int, shape)), int(purpose)
        if len(shape) > 3 or (shape and max(shape) > _STRIDE):
            raise ValueError(f"at most 3 coordinates of at most {_STRIDE} entries each, got shape {shape}")
        ahead = None
        if self._round_n is not None and np.asarray(n, np.int64).tobytes() == self._round_n.tobytes():
            self._asked.append((purpose, shape))
            ahead = self._ahead.pop((purpose, shape), None)        # handed out once (the caller may work in place)
            if dtype == torch.float32 and not self._on_device:
                self._asked32.add((purpose, shape))
                a32 = self._ahead32.pop((purpose, shape), None)   # (rounded at begin_round: the same bits)
                if a32 is not None and ahead is not None:
                    return a32
        if ahead is not None:
            u = ahead
        elif not self._on_device:
            k = self._round_keys(n, [purpose])[:, 0]
            with np.errstate(over="ignore"):
                h = _mix(k.reshape((-1,) + (1,) * len(shape)) + _counters(shape) * np.uint64(_GOLDEN))
            u = _unit(h)
        else:
            k = to_device(self._round_keys(n, [purpose]).view(np.int64)[:, 0], self.device)
            u = _unit(_mix(k.reshape((-1,) + (1,) * len(shape)) + _counters(shape, self.device) * _SIGNED(_GOLDEN)))
        if dtype == torch.float64:
            return u
        if dtype == torch.float32 and not self._on_device:    # the host path: the same rounding and clamp, numpy
            u32 = u.numpy().astype(np.float32)
            return torch.from_numpy(np.minimum(u32, _BELOW_ONE_F32_NP, out=u32))
        return u.to(dtype).clamp_(max=_BELOW_ONE_F32)

    def uniform_rows(self, n: np.ndarray, purpose: int, shape: tuple, b: np.ndarray, s: np.ndarray) -> torch.Tensor:
        """(m, *shape[1:]) float64: rows (b[j], s[j]) of ``uniform(n, purpose, shape)`` (B, *shape), b (m,) batch rows
        and s (m,) first coordinates, host integer arrays; the same bits, hashing only the m rows asked for (a mode
        that needs a few of a (S, V) block's rows). Not recorded for ``begin_round``'s one pass."""
        shape = tuple(int(v) for v in shape)
        if not 2 <= len(shape) <= 3:
            raise ValueError(f"uniform_rows takes 2 or 3 coordinates of at most {_STRIDE} entries, got shape {shape}")
        return self.uniform_rows_many(n, [(purpose, shape, b, s)])[0]

    def uniform_rows_many(self, n: np.ndarray, asks, plan: tuple | None = None, neg_log: tuple = (0, 0)) -> list:
        """``[uniform_rows(n, purpose, shape, b, s) for (purpose, shape, b, s) in asks]``, a shape of 1 to 3
        coordinates (of one: the entries (b[j], s[j]), (m,)); on the host all hashed in one pass (one key mix for
        the purposes, one splitmix over every row asked for: a mode's few draws of a round at the cost of one).
        ``plan``: ``rows_plan(asks)`` when the caller keeps it (the same asks round after round; host only: then
        ``asks`` is not read).
        ``neg_log`` (i, j): asks i..j-1 are returned as Exp(1) noise -log(u) instead (the log by torch, elementwise:
        on the host one log over their adjacent entries in the one array, the same bits as ask by ask).

        A row's counters are (s * stride + rest) * golden + key (mod 2^64), written here as (s * (stride * golden)
        + key) + rest * golden, the same integers: s * stride * golden and rest * golden built once per plan
        (``rows_plan``), the keys added per round (one image and a small plan: (s * stride * golden + rest * golden),
        built once per plan, plus each ask's key repeated over its entries); an ask of no rows costs nothing but its
        empty result."""
        lo, hi = neg_log
        if self._on_device:
            parts = [(int(pu), _row_shape(tuple(sh))[0], np.asarray(b, np.int64), np.asarray(st, np.int64))
                     for pu, sh, b, st in asks]
            keys = self._round_keys(n, [pa[0] for pa in parts])                            # (B, asks) uint64
            out = [self._device_rows(keys[:, j], shape, b, st) for j, (_, shape, b, st) in enumerate(parts)]
            return [x.log_().neg_() if lo <= j < hi else x for j, x in enumerate(out)]
        purposes, parts, total, base, sizes = plan if plan is not None else rows_plan(asks)
        keys = self._round_keys(n, purposes)                                              # (B, asks) uint64
        if len(keys) == 1 and base is not None:   # one image: the plan's counters plus each ask's key (uint64 wraps)
            buf = np.add(base, np.repeat(keys[0], sizes))
        else:
            buf = np.empty(total, np.uint64)                                              # every row, one array
            for j, (end, size, b, lead, rest, _shape) in enumerate(parts):   # (each ask's rows written in the one
                if size:                                                     # array; uint64 wraps without a warning)
                    np.add((lead + keys[b, j])[:, None], rest, out=buf[end - size:end].reshape(len(b), len(rest)))
        u = _unit(_mix(buf)).numpy()
        if hi > lo:                     # -log(u) over the asks' adjacent entries: torch's log, numpy's exact negation
            span = u[parts[lo][0] - parts[lo][1]:parts[hi - 1][0]]
            torch.from_numpy(span).log_()
            np.negative(span, out=span)
        return [torch.from_numpy(u[end - size:end].reshape(shape)) for end, size, _b, _l, _r, shape in parts]

    def _device_rows(self, k: np.ndarray, shape: tuple, b: np.ndarray, s: np.ndarray) -> torch.Tensor:
        """The device path's rows of one ask (``uniform_rows_many``): keys ``k`` (B,) uint64 of its purpose, rows
        (b[j], s[j]) of ``shape``; the keys and first coordinates sent at once, the rest mixed on the device."""
        lead = s.astype(np.uint64) * np.uint64(_STRIDE ** (len(shape) - 1))               # (m,) the first coordinate
        kl = to_device(np.stack([k[b], lead]).view(np.int64), self.device)               # (2, m)
        rest = _counters(shape[1:], self.device).reshape(-1) if len(shape) > 1 else 0
        with np.errstate(over="ignore"):
            ctr = (kl[1][:, None] + rest) * _SIGNED(_GOLDEN)
        return _unit(_mix(kl[0][:, None] + ctr)).reshape((len(b),) + shape[1:])


@lru_cache(maxsize=64)
def _row_shape(shape: tuple) -> tuple:
    """(shape as ints, entries per row past the first coordinate) of an ask of ``uniform_rows_many``, checked once per
    shape: ValueError unless 1 to 3 coordinates of at most 2^21 entries each."""
    shape = tuple(map(int, shape))
    if not 1 <= len(shape) <= 3 or max(shape) > _STRIDE:
        raise ValueError(f"uniform rows take 1 to 3 coordinates of at most {_STRIDE} entries, got {shape}")
    return shape, math.prod(shape[1:])


def rows_plan(asks) -> tuple:
    """What ``Streams.uniform_rows_many`` needs of its ``asks`` (purpose, shape, b, s) on the host, built once where
    the asks repeat: the purposes, the entries in all, per ask (its end and entries in the one array, its rows
    b (m,), s * stride * golden (m,) uint64, the other coordinates' counters * golden (w,), the result's shape), the
    counters of every entry without the keys (s * stride * golden + rest * golden, (entries,) uint64, one image's
    sum; None past ``_BASE_ENTRIES`` entries, so that plans kept per round shape stay small) and each ask's entries
    (asks,). ValueError unless every shape has 1 to 3 coordinates of at most 2^21 entries."""
    purposes, parts, end = [], [], 0
    for purpose, shape, b, s in asks:     # a loop over the few draws asked for (each over all its rows)
        shape, w = _row_shape(tuple(shape))
        b, s = np.asarray(b, np.int64), np.asarray(s, np.int64)
        purposes.append(int(purpose))
        end += len(b) * w
        lead = s.astype(np.uint64) * _golden_lead(len(shape))                             # (m,) s * stride * golden
        parts.append((end, len(b) * w, b, lead, _golden_rest(shape[1:]), (len(b),) + shape[1:]))
    base = None
    if end <= _BASE_ENTRIES:              # (uint64 wraps without a warning)
        base = np.concatenate([(pa[3][:, None] + pa[4]).reshape(-1) for pa in parts] or [np.zeros(0, np.uint64)])
    return purposes, parts, end, base, np.array([pa[1] for pa in parts], np.int64)


@lru_cache(maxsize=8)
def _golden_lead(ndim: int) -> np.uint64:
    """stride^(ndim - 1) * golden mod 2^64: the first coordinate's factor of a row's counters (``uniform_rows_many``)."""
    return np.uint64(_STRIDE ** (ndim - 1) * _GOLDEN % (1 << 64))


@lru_cache(maxsize=64)
def _golden_rest(shape: tuple) -> np.ndarray:
    """(prod(shape),) uint64, read-only: the counters of the coordinates after the first times golden (mod 2^64),
    built once per shape (``uniform_rows_many``); a 0 for no further coordinate."""
    rest = _counters(shape).reshape(-1) if shape else np.zeros(1, np.uint64)
    with np.errstate(over="ignore"):
        g = rest * np.uint64(_GOLDEN)
    g.setflags(write=False)
    return g
