"""SJD-PAC's window update (real.decode.sjd_pac_window, issue 55): the host path runs the carried levels' row
arithmetic on numpy views, with the row sums, logarithms and top-k by torch, so that its bits are the device path's.
The row operations on numpy and on torch rows are the same bits (rows with zeros, emptied one-hot draft rows, p = q),
and the engine's host and device paths commit the same tokens; each comparison with a planted negative control
(numpy's own row sums; a residual without its positive part)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from real.decode import engine
from real.decode import sjd_pac as SP
from real.decode import sjd_pac_window as SW
from real.decode.sampling import Processing
from real.decode.sjd_pac import SJDPAC
from real.protocol import ModelOutput
from test_sjd_pac import MarkovTarget
from theory import rules

torch.set_num_threads(1)


def _rows(seed: int, kids: np.ndarray, V: int, dtype):
    """Stale rows P and draft rows qo (r, V) with zeros, one row with p = q, one one-hot draft row (emptied once its
    first sibling is removed: 0 / 0, as torch gives it); node tokens (r, N+1), the children ``kids`` (r, K) drafted
    from their draft row's largest codes."""
    g = np.random.default_rng(seed)
    r = len(kids)
    P = g.dirichlet(np.full(V, 0.3), r)
    P[P < 0.02] = 0.0
    P /= P.sum(-1, keepdims=True)
    qo = g.dirichlet(np.full(V, 0.5), r)
    qo[0] = P[0]
    qo[1] = np.eye(V)[int(np.argmax(P[1]))]
    tok = g.integers(0, V, (r, 16))
    tok[np.arange(r)[:, None], kids] = np.argsort(-qo, -1, kind="stable")[:, :kids.shape[1]]
    assert qo[1, tok[1, kids[1, 0]]] == 1.0                     # the one-hot row loses its only code
    return P.astype(dtype), qo.astype(dtype), tok


def _both(fn, *arrays):
    """fn on numpy arrays and on torch tensors of the same values: (numpy result, torch result as numpy)."""
    a = fn(*(x.copy() for x in arrays))
    b = fn(*(torch.from_numpy(x.copy()) for x in arrays))
    return a, b.numpy()


def _same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_window_rows_are_the_same_bits_on_numpy_and_torch(dtype, monkeypatch):
    plan = SP._cached_plan(16, 3, 3, 5, "cpu")
    par = np.array([0, 1, 2, 3, 4, 0])                          # parents of 3 children and of one (node 4: (0, 0))
    differs = 0
    for seed in range(12):
        P, qo, tok = _rows(seed, plan.kids_np[par, 0], 40, dtype)
        a, b = _both(lambda P_, q_, t_: SW._last_sibling_rows(plan, par, P_, q_, t_), P, qo, tok)
        assert _same_bits(a, b)
        assert np.isfinite(a).all() and (a >= 0).all()
        e = -np.log(np.random.default_rng(seed).random((len(par), 40)))
        for k in (1, 3):
            x, y = _both(lambda w_, e_: SW._draw(w_, k, e_), a, e)
            assert np.array_equal(x, y)
        own = np.arange(len(par)) % 2 == 0
        x, y = _both(lambda w_, f_, o_: SW._safe(SW._pos_(w_ - f_), P if isinstance(w_, np.ndarray) else
                                                 torch.from_numpy(P.copy()), o_), P, qo, own)
        assert _same_bits(x, y)
        # control: numpy's own row sums (another summation order) give other bits somewhere
        with monkeypatch.context() as m:
            m.setattr(SW, "_row_sums", lambda x_: x_.sum(-1, keepdims=True) if isinstance(x_, np.ndarray)
                      else x_.sum(-1, keepdim=True))
            c, d = _both(lambda P_, q_, t_: SW._last_sibling_rows(plan, par, P_, q_, t_), P, qo, tok)
        differs += not _same_bits(c, d)
    assert differs > 0


def _step_by_step(plan, par, P, qo, tok, remove=True):
    """The siblings' recursion one sibling at a time, from ``_last_sibling_rows``' docstring (numpy or torch rows):
    at step j, q_j = Norm(q without siblings 0..j-1) (row sums clamped at 1e-300, as there), p_{j+1} =
    Norm([p_j - q_j]_+) (p_j where that is empty), only where child j is live. ``remove=False``: the control."""
    kids, live = plan.kids_np[par, 0], plan.kids_np[par, 1]
    host = isinstance(P, np.ndarray)
    cs = tok[np.arange(len(par))[:, None], kids] if host else tok.gather(1, torch.as_tensor(kids))
    p_j, q_left = P, qo.copy() if host else qo.clone()
    tiny = np.float64(1e-300) if P.dtype in (np.float64, torch.float64) else np.float32(1e-300)
    for j in range(kids.shape[1]):
        s = SW._row_sums(q_left)
        s = np.maximum(s, tiny) if host else s.clamp(min=1e-300)
        with np.errstate(invalid="ignore", divide="ignore"):
            q_j = q_left / s
        nxt = SW._pos_(p_j - q_j)
        t = SW._row_sums(nxt)
        if host:
            nxt = np.divide(nxt, np.maximum(t, tiny), out=p_j.copy(), where=t > 0)
        else:
            nxt = torch.where(t > 0, nxt / t.clamp(min=1e-300), p_j)
        on = live[:, j] > 0
        p_j = np.where(on[:, None], nxt, p_j) if host else torch.where(torch.as_tensor(on)[:, None], nxt, p_j)
        if remove:
            z = SW._zero_at_(q_left.copy() if host else q_left.clone(), cs[:, j])
            q_left = np.where(on[:, None], z, q_left) if host else torch.where(torch.as_tensor(on)[:, None], z, q_left)
    return p_j


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_last_sibling_rows_equal_the_step_by_step_recursion(dtype):
    """``_last_sibling_rows`` (every step's draft row built and normalised at once) against the recursion one sibling
    at a time, bit for bit on numpy and torch, parents of 3 children, of one (node 4), and of none (a leaf, node 13),
    a one-hot q row emptied by its sibling; control: without removing the siblings from q, other rows."""
    plan = SP._cached_plan(16, 3, 3, 5, "cpu")
    par = np.array([0, 1, 2, 3, 4, 0, 13])
    differs = 0
    for seed in range(8):
        P, qo, tok = _rows(seed, plan.kids_np[par, 0], 40, dtype)
        for lib in (lambda x: x.copy(), lambda x: torch.from_numpy(x.copy())):
            got = SW._last_sibling_rows(plan, par, lib(P), lib(qo), lib(tok))
            want = _step_by_step(plan, par, lib(P), lib(qo), lib(tok))
            got, want = np.asarray(got), np.asarray(want)
            assert _same_bits(got, want)
            differs += not _same_bits(got, np.asarray(_step_by_step(plan, par, lib(P), lib(qo), lib(tok), False)))
    assert differs == 16


class _Sticky(MarkovTarget):
    """A batched target whose logits at position j are a fixed row plus a function of the token there: rows repeat
    from round to round, so continued tokens are kept, tree levels fail and pass (the cache bookkeeping is
    ``MarkovTarget``'s)."""

    def __init__(self, V: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.R, self.E = V, torch.randn(64, V, generator=g) * 3, torch.randn(V, V, generator=g)
        self._lens, self._last = np.zeros(1, np.int64), 0

    def prefill(self, conds, tokens=None, *, cfg=False, return_hidden=False):
        self._lens, self._last = np.ones(len(conds), np.int64), 0
        return ModelOutput(self.R[:1].expand(len(conds), 1, -1).clone())

    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden=False):
        self._lens, self._last = self._lens + tokens.shape[1], tokens.shape[1]
        pos = torch.as_tensor(np.asarray(position_ids)).long().clamp(max=63)
        return ModelOutput(self.R[pos] + self.E[tokens.long()])


def _tokens(release, proc, device_path):
    gens = engine.generate(_Sticky(24), None, list(range(4)), num_tokens=30, verifier=rules.vanilla(),
                           drafting=SJDPAC(10, 2, 3, release=release), seed=5, batch_size=2, processing=proc,
                           device_path=device_path)
    return torch.stack([g.tokens for g in gens]), max(r.accepted for g in gens for r in g.rounds)


@pytest.mark.parametrize("release", [True, False])
def test_host_and_device_paths_commit_the_same_tokens(release, monkeypatch):
    for proc in (Processing(top_k=3), Processing()):
        host, deepest = _tokens(release, proc, False)
        assert deepest >= 3                                      # continued levels accepted: the carry is exercised
        device = _tokens(release, proc, True)[0]
        assert torch.equal(host, device)
    # control: the host path's residual without its positive part commits other tokens
    monkeypatch.setattr(SW, "_pos_", lambda x: x if isinstance(x, np.ndarray) else x.clamp_(min=0))
    assert not torch.equal(_tokens(release, Processing(), False)[0], device)
