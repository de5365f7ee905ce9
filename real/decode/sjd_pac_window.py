"""SJD-PAC's window update between rounds (``real.decode.sjd_pac.SJDPAC.advance``; the laws in that module's
docstring): the carried levels' keep tests and draws (``carry``), the fresh levels (``_fresh``), and the row
operations they share (the exponential race ``_draw``, the release's siblings' residual ``_last_sibling_rows``).

The same operations on both paths: on the host path (CPU rows) on numpy views, with the row sums, logarithms and
top-k by torch on views of them (so the bits are the device path's: torch's sums are not numpy's); on the device
path on the device, the indices sent without a sync. Shapes: m carried (image, level) rows of V codes."""
from __future__ import annotations

import numpy as np
import torch

from theory.core.xp import ratio_min1, ratio_min1_floats
from real.nn.devpath import to_device

from . import rng as R

# purposes of the mode's uniforms (disjoint from real.decode.jacobi's JACOBI + 0..4)
_INIT = R.JACOBI + 8           # Exp(1) noise of the K draws of a fresh level (uniform row), per (slot, token)
_KEEP = R.JACOBI + 9           # continuation: keep-the-stale-token uniforms, per slot
_RES = R.JACOBI + 10           # continuation: Exp(1) noise of the residual draws, per (slot, token)
_SIB = R.JACOBI + 11           # sjd-pac-p: Exp(1) noise of the other candidates of a carried level


def carry_index(spec, N1: int, bs, ss, pr, xr, tree, sib) -> tuple:
    """``carry``'s flat row indices (host ints): the rows of p / q (B * (N+1)) its levels read ``f_p``, their
    continuation tokens' ``f_x``, the window's rows (B * S) ``f_s``, and the levels whose siblings' law is needed
    (release: the tree levels whose token may fail; sjd-pac-p: the levels with K - 1 others) ``t_rows``; the host
    path's (m,) arrays of the levels: whether each has a continuation token ``hx``, its negation and 0..m-1."""
    hx = xr >= 0
    return (bs * N1 + pr, bs * N1 + np.maximum(xr, 0), bs * spec.max_depth + ss,
            np.flatnonzero(tree) if spec.release else sib, hx, ~hx, np.arange(len(bs)))


def carry(spec, run, prop, p, plan, bs, ss, pr, xr, tree, sib, u_keep, e_res, e_sib, index=None) -> None:
    """``SJDPAC.advance``'s (``spec``'s) carried levels (m,): images ``bs``, levels ``ss``, the nodes whose rows draft them ``pr``,
    their continuation tokens' nodes ``xr`` (-1: none), whether each was a tree level with a token ``tree``, the
    sjd-pac-p levels with K - 1 others ``sib`` (host ints); their keep uniforms ``u_keep`` (m,) and the Exp(1) noise
    -log(u) of their residual draws ``e_res`` (m, V) and of the sjd-pac-p others ``e_sib`` (torch, from
    ``Streams.uniform_rows_many(..., neg_log=)``); ``index``: ``carry_index`` of these (None: computed here). Writes
    the window's levels.

    The same operations on both paths: on the host path (CPU) on numpy views of the rows (no copies to send, the
    keep tests decided there, so the laws are chosen row by row on the host), row sums, logarithms and top-k by
    torch on views of them (the bits of the device path's); on the device path on the device, no sync."""
    win = run.state
    S, K, V = spec.max_depth, spec.tree_width, p.shape[-1]
    dev = run.dev
    host = run.on_device is None
    m = len(bs)
    f_p, f_x, f_s, t_rows, hx, own, ar = index if index is not None else carry_index(spec, p.shape[1], bs, ss, pr, xr,
                                                                                     tree, sib)
    if host:
        toks, i_t = prop.tokens.numpy(), t_rows
        _, q_win, _, c_win = win.host_views()[:4]
        dt = q_win.dtype
        P = p.numpy().reshape(-1, V)[f_p].astype(dt, copy=False)                     # (m, V) stale rows
        qo = prop.q.numpy().reshape(-1, V)[f_p].astype(dt, copy=False)               # their levels' draft rows
        x = toks.reshape(-1)[f_x]                                                    # (m,) their tokens
        px, qx = P[ar, x], qo[ar, x]
        u = u_keep.numpy().astype(dt)
    else:           # every index the update reads, sent at once (index_select on flat views)
        toks, dt = prop.tokens, win.q.dtype
        ix = to_device(np.concatenate([f_p, f_s, t_rows, f_x, xr]), dev)
        i_p, f_s, i_t = ix[:m], ix[m:2 * m], ix[2 * m:2 * m + len(t_rows)]
        P = p.reshape(-1, V).index_select(0, i_p).to(dt)
        qo = prop.q.reshape(-1, V).index_select(0, i_p).to(dt)
        x = toks.reshape(-1).index_select(0, ix[2 * m + len(t_rows):3 * m + len(t_rows)])
        px, qx = P.gather(-1, x[:, None])[:, 0], qo.gather(-1, x[:, None])[:, 0]
        u, hx = u_keep.to(dev, dt), ix[3 * m + len(t_rows):] >= 0
        q_win, c_win, own = win.q.view(-1, V), win.cand.view(-1, K), ~hx
    # the continuation's vanilla test (a few host entries: as Python floats, the same bits)
    keep = _few_keeps(px, qx, u, hx) if host and m <= _FEW else None
    if keep is None:
        keep = hx & (u < ratio_min1(px, qx))
    # [p - q]_+ (the coupling residual); rows without a token draw from their own row, an empty residual (p = q)
    # falls back to the row
    w = _safe(_pos_(P - qo), P, own=own)
    noise = e_res.numpy() if host else e_res.to(dev)
    if spec.release:
        if len(t_rows):             # tree levels whose token failed: the residual after all the siblings
            fail = t_rows[~keep[t_rows]] if host else t_rows
            if len(fail):
                i_f = fail if host else i_t
                last = _last_sibling_rows(plan, pr[fail], _rows(P, i_f), _rows(qo, i_f),
                                          _rows(toks, bs[fail] if host else to_device(bs[fail], dev)))
                if not host:        # the device path chooses by the kept flags there
                    last = torch.where(keep.index_select(0, i_f)[:, None], w.index_select(0, i_f), last)
                _put_rows(w, i_f, last)
        # one draw per level, from the law its verdict needs (the same noise: a kept level's K - 1 others are
        # the first K - 1 of the K it would draw)
        d = _draw(w, K, noise)
        cand = _pick(keep, _first_then(x, d), d) if not host or keep.any() else d
    else:
        y = _pick(keep, x, _draw(w, 1, noise)[:, 0])
        cand = np.repeat(y[:, None], K, 1) if host else y[:, None].expand(-1, K).clone()   # chains read rank 0
        if len(t_rows):
            rest = _zero_at_(_rows(P, i_t), _rows(y, i_t))
            _put_rows(cand[:, 1:], i_t, _draw(rest, K - 1, e_sib.numpy() if host else e_sib.to(dev)))
    _put_rows(c_win, f_s, cand)
    _put_rows(q_win, f_s, P)


_FEW = 16                  # keep tests decided as Python floats up to this many (``_few_keeps``)


def _few_keeps(px: np.ndarray, qx: np.ndarray, u: np.ndarray, hx: np.ndarray) -> np.ndarray | None:
    """``hx & (u < ratio_min1(px, qx))`` (m,) bool on a few host entries of one float dtype, as Python floats
    (``ratio_min1_floats``: the same bits, the comparisons of exact values); None where an entry is not served (the
    array formula then)."""
    if not px.dtype == qx.dtype == u.dtype or px.dtype not in (np.float32, np.float64):
        return None
    f32 = px.dtype == np.float32
    keep = []
    for a, b, v, h in zip(px.tolist(), qx.tolist(), u.tolist(), hx.tolist()):   # (m <= _FEW entries)
        f = ratio_min1_floats(a, b, f32) if h else 0.0
        if f is None:
            return None
        keep.append(h and v < f)
    return np.array(keep, bool)


def _draw(w, k: int, e):
    """k tokens (..., k) drawn without replacement from weights ``w`` (..., V) by the exponential race (the k largest
    w / e, ``e`` Exp(1) noise); past the tokens of positive weight, distinct tokens of zero weight uniformly (where the
    release's ``torch.multinomial`` refuses a row with fewer than k positive entries). Torch tensors, or numpy arrays
    (the host path: the keys divided there, the top-k by torch on a view, numpy indices returned). On the host, when
    the k largest w / e are all positive (every row has k tokens of positive weight that win the race) the keys of
    the zero weights (-e < 0, below them) cannot change the draw, and the where is skipped: the same tokens; one
    token each (k = 1) whose largest key is positive and unique in its row is that key's argmax (numpy's, a few us
    where torch's top-k costs ~15 at V = 512)."""
    key = w / e
    if isinstance(key, np.ndarray):
        if k == 1:
            i = key.argmax(-1)[..., None]                                               # (..., 1)
            top = np.take_along_axis(key, i, -1)
            if (top > 0).all() and np.count_nonzero(key == top) == top.size:
                return i
        top = torch.from_numpy(key).topk(k, dim=-1)
        if bool((top.values.numpy() > 0).all()):
            return top.indices.numpy()
        return torch.from_numpy(np.where(w > 0, key, -e)).topk(k, dim=-1).indices.numpy()
    if key.device.type == "cpu":
        top = key.topk(k, dim=-1)
        if bool((top.values > 0).all()):
            return top.indices
    return torch.where(w > 0, key, -e).topk(k, dim=-1).indices


def _rows(x, i):
    """Rows i of x: numpy (host ints) or torch (an index tensor), a new array."""
    return x[i] if isinstance(x, np.ndarray) else x.index_select(0, i)


def _put_rows(x, i, v) -> None:
    """x[i] = v by rows, in place: numpy (host ints) or torch (an index tensor)."""
    if isinstance(x, np.ndarray):
        x[i] = v
    else:
        x.index_copy_(0, i, v)


def _row_sums(x):
    """(m, 1) row sums of x (m, V), by torch on both paths (numpy rows through a view): the bits of the device's."""
    return torch.from_numpy(x).sum(-1, keepdim=True).numpy() if isinstance(x, np.ndarray) else x.sum(-1, keepdim=True)


def _pos_(x):
    """[x]_+ in place (a fresh difference of masses: no NaN, no -0.0)."""
    return np.maximum(x, 0, out=x) if isinstance(x, np.ndarray) else x.clamp_(min=0)


def _zero_at_(x, c):
    """x (m, V) with 0 at the codes c (m,), in place."""
    if isinstance(x, np.ndarray):
        x[np.arange(len(c)), c] = 0
        return x
    return x.scatter_(-1, c[:, None], 0.0)


def _safe(w, fallback, own=None):
    """Rows ``w`` (m, V), ``fallback``'s where a row has no mass (p = q exactly: the release would draw its padding
    id 0 there) or where ``own`` (m,) bool (None: nowhere). numpy (the host path: the few such rows copied into ``w``
    in place) or torch (one where over the rows)."""
    if isinstance(w, np.ndarray):
        bad = np.add.reduce(w, -1) <= 0       # (only the sign is read: any summation order gives it)
        if own is not None:
            bad |= own
        if bad.any():
            w[bad] = fallback[bad]
        return w
    ok = w.sum(-1, keepdim=True) > 0
    return torch.where(ok if own is None else ok & ~own[:, None], w, fallback)


def _pick(keep, a, b):
    """Where ``keep`` (m,) (numpy or torch, as ``a`` and ``b``), ``a``'s entries (m,) or rows (m, k), else ``b``'s."""
    k = keep if a.ndim == 1 else keep[:, None]
    return np.where(k, a, b) if isinstance(keep, np.ndarray) else torch.where(k, a, b)


def _first_then(x, d):
    """(m, k) ``x`` (m,) then the first k - 1 of ``d`` (m, k): a kept level's candidates (numpy or torch)."""
    if isinstance(x, np.ndarray):
        return np.concatenate([x[:, None], d[:, :-1]], 1)
    return torch.cat([x[:, None], d[:, :-1]], 1)


def _last_sibling_rows(plan, par: np.ndarray, P, qo, tokens):
    """The release's residual of a tree level whose stale token failed, the residual after ALL its parent's children,
    Norm([p_{K-1} - q_{K-1}]_+) by the siblings' recursion: (r, V) from the parent nodes ``par`` (r,) (host ints),
    their stale rows P and draft rows qo (r, V), and their images' node tokens (r, N+1); numpy (the host path) or
    torch. The draft rows of the K steps (q without siblings 0..j-1, normalised) do not depend on p: all K are built
    and normalised at once, (r, K, V), row for row the same sums and divisions as step by step (a row whose child j
    is not live freezes its p from step j on, so its later draft rows are not read). A step whose residual rows all
    have mass (read on the host) divides without the where (the same values). Rows left without mass get P
    (``_safe``; on the host not checked when the last step divided every row by a positive sum: they have mass)."""
    kl = plan.kids_np[par]
    kids, live = kl[:, 0], kl[:, 1]                                                     # (r, K) host
    host = isinstance(P, np.ndarray)
    r, K, V = len(par), kids.shape[-1], P.shape[-1]
    jj, ii = _sibling_pairs(K)                   # step j's draft row lacks sibling i < j
    if host:
        tiny = np.float64(1e-300) if P.dtype == np.float64 else np.float32(1e-300)      # float32: 0
        ar = np.arange(r)[:, None]
        cs = tokens[ar, kids]                                                           # (r, K) the siblings' tokens
        Q = np.repeat(qo[:, None], K, 1)                                                     # (r, K, V)
        if len(jj):
            Q[ar, jj, cs[:, ii]] = 0
        s = _row_sums(Q.reshape(r * K, V)).reshape(r, K, 1)
        np.maximum(s, tiny, out=s)
        if _least(s) > 0:                 # (NaN: not above 0, as the elementwise test)
            Qn = Q / s
        else:                             # an emptied row (a one-hot q): 0 / 0, NaN, as torch gives it (no warning)
            with np.errstate(invalid="ignore", divide="ignore"):
                Qn = Q / s
    else:
        cs = tokens.gather(1, torch.as_tensor(kids, device=P.device))                   # (r, K) the siblings' tokens
        Q = qo[:, None].repeat(1, K, 1)
        if len(jj):
            Q.view(r, K * V).scatter_(1, torch.as_tensor(jj * V, device=P.device) + cs[:, ii], 0.0)
        Qn = Q / _row_sums(Q.reshape(r * K, V)).reshape(r, K, 1).clamp_(min=1e-300)
    every = bool(live.all())
    p_j, sure = P, False
    for j in range(K):   # the K siblings in rank order (K <= a few): p's recursion
        nxt = _pos_(p_j - Qn[:, j])
        s = _row_sums(nxt)
        # ``_safe`` of the normalised row, from its sum before the division (positive iff the row's is)
        sure = host and _least(s) > tiny
        if sure:                          # the clamp is the identity: the division alone
            nxt /= s
        elif host:                        # (where's division only where s > 0: no 0 / 0 computed)
            nxt = np.divide(nxt, np.maximum(s, tiny), out=p_j.copy(), where=s > 0)
        else:
            nxt = torch.where(s > 0, nxt / s.clamp(min=1e-300), p_j)
        if every:
            p_j = nxt
        else:
            on = live[:, j] > 0
            sure = sure and bool(on.all())
            p_j = _pick(on, nxt, p_j) if host else torch.where(torch.as_tensor(on, device=P.device)[:, None], nxt, p_j)
    return p_j if sure else _safe(p_j, P)


def _least(s: np.ndarray):
    """The least entry of host sums ``s`` (NaN where one is NaN, as ``min``): one entry read as a Python float."""
    return s.item() if s.size == 1 else s.min()


_PAIRS: dict = {}


def _sibling_pairs(K: int):
    """(jj, ii) int64 host arrays of every pair of sibling ranks i < j < K, j first (``_last_sibling_rows``)."""
    if K not in _PAIRS:
        pairs = [(j, i) for j in range(1, K) for i in range(j)]          # K <= a few: built once per K
        _PAIRS[K] = (np.array([j for j, _ in pairs], np.int64), np.array([i for _, i in pairs], np.int64))
    return _PAIRS[K]


def _fresh_levels(first_free: np.ndarray, S: int, read: int | None):
    """The fresh levels (bs, ss) (m,) of a window of S levels: i >= first_free (B,) (host ints); ``draw`` (m,) bool:
    those whose tokens are drawn, i < ``read`` (``_fresh``; None: all); their rows in the window's flat (B * S) rows
    ``flat`` (m,), and the drawn ones' ``drawn``."""
    bs, ss = np.nonzero(np.arange(S)[None, :] >= np.asarray(first_free)[:, None])
    draw = (ss < read) if read is not None else np.ones(len(ss), bool)
    flat = bs * S + ss
    return bs, ss, draw, flat, flat[draw]


_NONE = np.zeros(0, np.int64)


def _next_depth(run, S: int) -> int:
    """The next round's deepest depth D'_max = max_b D'_b (``run.depths(S).max()``: min(S, T - n_b - 1) over the
    unfinished images, 0 when none is left)."""
    if len(run.n) == 1:                 # one image: its n as a Python int
        n0 = int(run.n[0])
        return min(S, run.T - 1 - n0) if n0 < run.T else 0
    n = run.n[run.n < run.T]
    return min(S, run.T - 1 - int(n.min())) if len(n) else 0


def _fresh(run, win, first_free: np.ndarray, read: int | None = None, e=None, levels=None) -> None:
    """Levels i >= first_free (B,) (host ints) get the uniform draft row and K distinct uniform image tokens (as
    released), keyed by the images' committed lengths; only those levels' uniforms are hashed, and only the tokens
    of levels i < ``read`` (the next round's deepest depth D'_max: its tree reads no deeper level's candidates, and
    D'_max never grows as the images fill, so a level skipped here is never read; None: all). ``e``: those levels'
    uniforms (``_fresh_levels``' drawn rows, hashed by the caller with its others), else hashed here; ``levels``:
    ``_fresh_levels(first_free, S, read)`` when the caller has it. The host path writes through numpy views."""
    B, S, K = win.cand.shape
    bs, ss, draw, flat, drawn = levels if levels is not None else _fresh_levels(first_free, S, read)
    if len(bs) == 0:
        return
    V = win.q.shape[-1]
    host = run.on_device is None
    if host:
        win.host_views()[1][flat] = 1.0 / V
    else:
        ix = to_device(np.concatenate([flat, drawn]), run.dev)
        win.q.view(-1, V).index_fill_(0, ix[:len(flat)], 1.0 / V)
    if not len(drawn):
        return
    if e is None:
        e = run.rng.uniform_rows(run.n, _INIT, (S, V), bs[draw], ss[draw])
    # K distinct tokens, uniformly without replacement
    if host:
        win.host_views()[3][drawn] = e.topk(K, dim=-1).indices.numpy()
    else:
        win.cand.view(-1, K).index_copy_(0, ix[len(flat):], e.to(run.dev).topk(K, dim=-1).indices)
