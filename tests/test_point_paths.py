"""The host walks' point-law shortcuts (issue 55) give the dense formulas' bits: a resampling rule's residual at
q = one-hot(c) (``point``: ``theory.rules.resampling.point_residual``) equals the rule called on the one-hot row, and
GSD's sort-free window (``theory.rules.gsd._near``) gives the sorted window's f; hypothesis on random rows with ties,
zeros and masses near 1, each with a planted wrong shortcut that must be caught (the controls)."""
from __future__ import annotations

import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import rules
from theory.core.xp import gather
from theory.rules.resampling import point_residual

gsd_mod = sys.modules["theory.rules.gsd"]     # (theory.rules.gsd the attribute is the rule's constructor)


def _rows(rng, shape, V, ties, zeros, peak):
    r = rng.dirichlet(np.full(V, 0.3), size=shape)
    if zeros:
        r[rng.random(r.shape) < 0.3] = 0
    if ties:
        r[..., : V // 3] = r[..., :1]
    if peak:                                   # one code holds (nearly) all the mass: p(c) - 1 near 0
        r[..., 0] += 1e3
    r[..., -1] += 1e-3
    return (r / r.sum(-1, keepdims=True)).astype(np.float32)


def _resamplers(rng, V):
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    k = int(rng.integers(1, V - 2))
    acc = rules.Lantern(nb, k, lam=2.0)
    return {"residual": rules.Residual(), "optimal": rules.Optimal(),
            "lantern-q": rules.LanternResample(nb, k, "q", accept=acc),
            "lantern-p": rules.LanternResample(nb, k, "p", accept=acc)}, acc


def _point_equals_dense(res, acc, p, c) -> bool:
    """res.point equals the rule at the one-hot row bit for bit, on numpy rows and on torch rows (the device path's
    point law: a scatter into the row, no one-hot arithmetic)."""
    import torch

    q = (np.arange(p.shape[-1]) == c[:, None]).astype(p.dtype)
    f = acc(p, q, 1)
    got = res.point(p, c, gather(f, c))
    want = res(p, q, f, c)
    ok = got.dtype == want.dtype and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    tp, tq, tf, tc = (torch.as_tensor(a) for a in (p, q, f, c))
    got_t = res.point(tp, tc, gather(tf, tc))
    want_t = res(tp, tq, tf, tc)
    return ok and got_t.dtype == want_t.dtype and np.array_equal(got_t.numpy().view(np.uint32),
                                                                 want_t.numpy().view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(4, 40), ties=st.booleans(), zeros=st.booleans(),
       peak=st.booleans())
def test_point_residual_is_the_dense_law_at_a_one_hot_row(seed, V, ties, zeros, peak):
    rng = np.random.default_rng(seed)
    p = _rows(rng, (5,), V, ties, zeros, peak)
    c = rng.integers(0, V, size=5)
    c[0] = 0
    res, acc = _resamplers(rng, V)
    for name, r in res.items():
        assert _point_equals_dense(r, acc, p, c), name
    assert rules.LanternResample(acc.neighbors, acc.k, "p", law="renormalised").point(p, c, None) is None


def test_control_a_wrong_point_residual_is_caught():
    """A planted point law that forgets to renormalise (the generic law's Norm) differs on any row with c's mass > 0."""
    class Unnormalised(rules.Residual):
        def point(self, p, c, f_c):
            return point_residual(p, c, 1.0, p) * (1 - 1e-3)
    rng = np.random.default_rng(0)
    p = _rows(rng, (3,), 12, False, False, False)
    c = np.array([1, 2, 3])
    _, acc = _resamplers(rng, 12)
    assert _point_equals_dense(rules.Residual(), acc, p, c)
    assert not _point_equals_dense(Unnormalised(), acc, p, c)


def _gsd_same(rule, p, q, x) -> bool:
    got = rule.at(p, q, 1, x)
    want = gather(rule(p, q, 1), x)
    return np.array_equal(got.view(np.uint32), want.view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(3, 60), w=st.integers(1, 8), ties=st.booleans(),
       zeros=st.booleans(), close=st.booleans())
def test_gsd_sort_free_window_is_the_sorted_one(seed, V, w, ties, zeros, close):
    rng = np.random.default_rng(seed)
    p = _rows(rng, (2, 3), V, ties, zeros, False)
    q = _rows(rng, (2, 3), V, False, zeros, False)
    x = rng.integers(0, V, size=(2, 3))
    table = rules.gsd_close(rng.normal(size=(V, 2)), 1.0) if close else None
    for thr in (0.01, 0.15, 1.0):
        assert _gsd_same(rules.Grouped(table, w, thr), p, q, x)


def test_control_a_wrong_gsd_window_is_caught(monkeypatch):
    """The window's members in reverse order (the same set, other slots): the group sums change their order and a
    wide threshold's f moves; the check must see it on most of these rows."""
    near = gsd_mod._near

    def reversed_members(p, x, w):
        out = near(p, x, w)
        return None if out is None else (out[0], out[1][..., ::-1].copy())
    rng = np.random.default_rng(3)
    V = 40
    p = _rows(rng, (8, 4), V, False, False, False)
    q = _rows(rng, (8, 4), V, False, False, False)
    x = rng.integers(0, V, size=(8, 4))
    rule = rules.Grouped(None, 7, 1.0)
    assert gsd_mod._near(p, x, 7) is not None and _gsd_same(rule, p, q, x)
    monkeypatch.setattr(gsd_mod, "_near", reversed_members)
    assert not _gsd_same(rule, p, q, x)


def _chain_case(rng, B, L, V):
    p = _rows(rng, (B, L + 1), V, False, True, False)
    q = _rows(rng, (B, L), V, False, True, False)
    c = np.cumsum(q.astype(np.float64), -1)
    tok = np.minimum((c < rng.random((B, L, 1)) * c[..., -1:]).sum(-1), V - 1)   # draws from q
    return p, q, tok, rng.random((B, L)), rng.random(B), rng.integers(0, L + 1, size=B)


def _chain_rules(rng, V):
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    return {"vanilla": rules.vanilla(), "cool-sd": rules.cool_sd(2.0), "typical": rules.typical(),
            "gsd": rules.gsd(rng.normal(size=(V, 2))),
            "lantern++": rules.lantern_pp(nb, min(4, V - 2), 2.0)}


def _lazy_same(v, case) -> bool:
    p, q, tok, ua, us, nd = case
    a = rules.verify_chain(p, q, tok, ua, us, v, n_drafted=nd, check=False)
    b = rules.verify_chain(p, q, tok, ua, us, v, n_drafted=nd, check=False, lazy=True)
    if not (np.array_equal(a.accepted, b.accepted) and np.array_equal(a.next_token, b.next_token)):
        return False
    seen = ~np.isnan(b.f_drafted)
    upto = np.arange(tok.shape[1]) <= np.minimum(b.accepted, nd - 1)[:, None]   # every draft the verdict read
    bounded = hasattr(v.accept, "decide_at")   # (its f may stay unread where its bounds decided)
    return bool((bounded or np.all(seen[upto])) and np.array_equal(a.f_drafted[seen], b.f_drafted[seen]))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(6, 40), L=st.integers(1, 6))
def test_lazy_chain_verdict_is_the_full_one(seed, V, L):
    """``verify_chain(lazy=True)`` (f only up to each round's first rejection) gives the full computation's verdict
    and, where it computed f, its bits; every draft the verdict reads was computed (LANTERN's: or decided by its
    bounds, ``Lantern.decide_at``)."""
    rng = np.random.default_rng(seed)
    case = _chain_case(rng, 6, L, V)
    for name, v in _chain_rules(rng, V).items():
        assert _lazy_same(v, case), name


def test_control_a_lazy_chain_on_the_wrong_draft_is_caught(monkeypatch):
    """A planted lazy loop that reads each round's next draft's rows: the verdicts differ and the check says so."""
    chain_mod = sys.modules["theory.rules.chain"]
    real = chain_mod._f_until_rejection

    def shifted(accept, p, q, tokens, u_accept, cap):
        return real(accept, np.roll(p, 1, axis=-2), np.roll(q, 1, axis=-2), tokens, u_accept, cap)
    rng = np.random.default_rng(5)
    case = _chain_case(rng, 40, 4, 12)
    assert _lazy_same(rules.vanilla(), case)
    monkeypatch.setattr(chain_mod, "_f_until_rejection", shifted)
    assert not _lazy_same(rules.vanilla(), case)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(3, 60))
def test_neighbor_matrix_marks_exactly_the_listed_codes(seed, V):
    """N[y, z] (``neighbor_matrix``, LANTERN's effective law reads x in N(y) from its column x) == z in nb[y]."""
    from theory.rules.neighbors import neighbor_matrix
    rng = np.random.default_rng(seed)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))[:, : int(rng.integers(1, V))]
    want = (nb[:, :, None] == np.arange(V)).any(1)
    assert np.array_equal(neighbor_matrix(nb, V), want)
    assert not np.array_equal(neighbor_matrix(nb[:, :-1], V), want)   # the control: the last rank dropped
    assert neighbor_matrix(nb, 5000) is None or V > 4096       # (a wider vocabulary keeps the comparison)


def _torch_chain(rng, V, L, B, accept_all):
    """LANTERN++ and a numpy / torch CPU chain case; ``accept_all``: every draft's uniform 0 (accepted whatever f)."""
    import torch

    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    v_np, v_t = rules.lantern_pp(nb, 6, 2.0), rules.lantern_pp(torch.as_tensor(nb), 6, 2.0)
    p, q, tok, ua, us, nd = _chain_case(rng, B, L, V)
    if accept_all:
        ua = np.zeros_like(ua)
    return v_np, v_t, (p, q, tok, ua, us, nd), tuple(torch.as_tensor(a) for a in (p, q, tok, ua, us, nd))


def _count_resample(monkeypatch, v):
    calls = []
    real = type(v.resample).__call__
    monkeypatch.setattr(type(v.resample), "__call__", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    return calls


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(10, 40), accept_all=st.booleans())
def test_lantern_on_torch_cpu_rows_gives_the_device_verdict(seed, V, accept_all):
    """LANTERN++ decides torch CPU rows on their numpy views (``decide_at``), so ``verify_chain(lazy=True)`` reads the
    verdict there too and, when every round accepted all its drafts, builds no residual: its verdict (tau, the next
    token, f) equals the device path's (the torch-on-numpy switch off: torch calls throughout, no read-back) bit for
    bit, with and without rejections, ragged rounds included."""
    import pytest

    pm = sys.modules["theory.rules.prefix_mass"]
    rng = np.random.default_rng(seed)
    _, v_t, _, t = _torch_chain(rng, V, 4, 5, accept_all)
    got = {}
    for on in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pm, "TORCH_CPU_ON_NUMPY", on)
            got[on] = rules.verify_chain(*t[:5], v_t, n_drafted=t[5], check=False, lazy=True)
    a, b = got[True], got[False]
    assert np.array_equal(a.accepted.numpy(), b.accepted.numpy()) and np.array_equal(a.next_token, b.next_token)
    seen = ~np.isnan(a.f_drafted.numpy())
    assert np.array_equal(a.f_drafted.numpy()[seen], b.f_drafted.numpy()[seen])


def test_torch_cpu_rounds_that_accepted_everything_build_no_residual(monkeypatch):
    """On torch CPU rows LANTERN++ decided on the host, a batch whose rounds all accepted every draft calls no resampler;
    one rejection anywhere builds it (the device path's row for every round). Control: with the torch-on-numpy
    switch off (rows that stay on the device, CUDA's case) the residual is built although every draft was accepted."""
    pm = sys.modules["theory.rules.prefix_mass"]
    for seed in range(100):    # a case whose rounds accept every draft (f > 0 at each: u = 0 accepts it)
        v_np, v_t, a, t = _torch_chain(np.random.default_rng(seed), 24, 4, 5, accept_all=True)
        x = rules.verify_chain(*a[:5], v_np, n_drafted=a[5], check=False, lazy=True)
        if np.array_equal(x.accepted, a[5]) and a[5][0] > 0:
            break
    assert np.array_equal(x.accepted, a[5])
    calls = _count_resample(monkeypatch, v_t)
    rules.verify_chain(*t[:5], v_t, n_drafted=t[5], check=False, lazy=True)
    assert calls == []
    ua = t[3].clone()
    ua[0, 0] = 1.0 - 1e-9                                   # round 0 rejects its first draft (f < 1 there)
    y = rules.verify_chain(t[0], t[1], t[2], ua, t[4], v_t, n_drafted=t[5], check=False, lazy=True)
    assert int(y.accepted[0]) == 0 and calls == [1]
    calls.clear()
    monkeypatch.setattr(pm, "TORCH_CPU_ON_NUMPY", False)
    rules.verify_chain(*t[:5], v_t, n_drafted=t[5], check=False, lazy=True)
    assert calls == [1]
