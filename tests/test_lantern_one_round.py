"""LANTERN(++) at batch 1 on scalars. theory.rules.lantern_walk: a level that one round tries (batch 1, or one round
left of a batch; and up to ``ROUNDS_APART`` rounds of a batch, one after another) is settled on that round's scalars,
sibling by sibling (``_one_round``), with the bits of the stamps-and-fixed-point layout: the same acceptances and the
same residual row, or None alike (hypothesis, float32 and float64, absolute and relative thresholds, exact zeros,
repeated siblings, neighbours admitted or not, uniforms inside and outside the bounds, and at the layouts' thresholds
and an ulp below). The walk at batch 1 gives verify_tree's verdict. Several rounds settled one after another equal the
layouts too (control: another round's uniforms are told apart). theory.rules.lantern_at: ``decide_at`` of one entry
(the host walk at batch 1, ``_decide_one``) gives the general path's decision and f bit for bit, and the exact decision
u < f (hypothesis: uniforms at the bounds and an ulp either side, q(x) = 0, mixed dtypes, ``want``). Controls: an
upper bound without the admitted mass's headroom changes decisions in either shortcut, and the residual rows compared
are not the node's row (the removal sets were zeroed)."""
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import rules
from theory.rules.lantern_at import upper
from theory.rules.lantern_walk import delta_level
from theory.tree import verify_tree
from tree_cases import rows, same, tree_case

LW = sys.modules["theory.rules.lantern_walk"]
LA = sys.modules["theory.rules.lantern_at"]


def _case(seed, V, B, K, dtype, relative):
    """A LANTERN acceptance, rows pr (B, V), candidates c (B, K) (repeats), tried (B, K) prefixes with one round b alone
    trying some, uniforms u (B, K) often inside the bounds."""
    rng = np.random.default_rng(seed)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    k = int(rng.integers(1, V - 1))
    acc = rules.Lantern(nb, k, lam=float(rng.choice([1.0, 1.5, 3.0]))) if relative else \
        rules.Lantern(nb, k, delta=float(rng.choice([0.0, 0.02, 0.1, 0.3, 0.9])))
    p = rows(rng, 1, B, V, peaked=bool(seed % 2))[0].astype(dtype)
    c = rng.integers(0, V, size=(B, K))
    if seed % 3 == 0:                                            # siblings among each other's nearest neighbours
        c[:, 1:] = np.asarray(nb)[c[:, :1], rng.integers(0, 3, size=(B, K - 1))]
    b = int(rng.integers(0, B))
    has = np.zeros((B, K), bool)
    has[b, : int(rng.integers(1, K + 1))] = True
    u = rng.random((B, K)) ** int(rng.choice([1, 2, 4])) * float(rng.choice([0.3, 1.0]))
    return acc, p, c, has, u


def _settle(acc, p, c, has, u, one_round):
    """(each round's first accepted rank (K: none; the step's ok is meaningful up to it), the stopped rounds' residual
    rows) of one level step, or None; ``one_round``: ``_one_round`` or the layouts."""
    B, V = p.shape
    pr = p.copy()
    out = delta_level(acc, B, V, c.shape[1], one_round=one_round)(pr, c, has, u)
    if out is None:
        return None
    ok, clear = out
    stop = has[:, 0] & ~ok.any(-1)
    clear(stop, pr)
    return np.where(ok.any(-1), ok.argmax(-1), c.shape[1]), pr[stop]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([6, 12, 50, 300]), B=st.integers(1, 3), K=st.integers(1, 5),
       dtype=st.sampled_from([np.float32, np.float64]), relative=st.booleans())
def test_one_round_equals_the_layouts_bit_for_bit(seed, V, B, K, dtype, relative):
    acc, p, c, has, u = _case(seed, V, B, K, dtype, relative)
    got, ref = (_settle(acc, p, c, has, u, one) for one in (True, False))
    assert (got is None) == (ref is None)
    if ref is not None:
        assert np.array_equal(got[0], ref[0]) and got[1].tobytes() == ref[1].tobytes()



def _several(seed, V, B, K, dtype, relative):
    """``_case`` with tried prefixes of the ranks in several rounds (at least two): a level of a batch that
    ``ROUNDS_APART`` leaves to ``_one_round``, round after round."""
    acc, p, c, _, u = _case(seed, V, B, K, dtype, relative)
    has = np.arange(K) < np.random.default_rng(seed + 1).integers(0, K + 1, size=B)[:, None]
    has[:2, 0] = True
    return acc, p, c, has, u


def _apart(acc, p, c, has, u):
    """``_settle`` with the several rounds settled one after another (``_one_round``: the level counted as one of
    many entries, as at LlamaGen's k; the layouts' side, ``_settle(..., False)``, keeps the stamps at these sizes)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LW, "RANK_BY_RANK", 0)
        return _settle(acc, p, c, has, u, True)


@settings(max_examples=250, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([6, 12, 50, 300]), B=st.integers(2, 6), K=st.integers(1, 5),
       dtype=st.sampled_from([np.float32, np.float64]), relative=st.booleans())
def test_several_rounds_apart_equal_the_layouts_bit_for_bit(seed, V, B, K, dtype, relative):
    """Several rounds trying, each settled on its scalars (``_one_round``), against the layouts: the same first accepted
    rank in every round and the same residual rows, or None alike; with u, and at the layouts' thresholds with each
    rank in turn one ulp below its own."""
    acc, p, c, has, u = _several(seed, V, B, K, dtype, relative)
    assert 2 <= int(has[:, 0].sum()) <= LW.ROUNDS_APART
    t = _thresholds(acc, p, c, has)
    tries = [u] if t is None else [u, np.where(np.isnan(t), 0.5, t)] + [
        np.where(np.isnan(t), 0.5, np.where(np.arange(K) == j, np.nextafter(t, 0.0), t)) for j in range(K)]
    for uu in tries:   # a loop over a handful of uniform sets (test code)
        got, ref = _apart(acc, p, c, has, uu), _settle(acc, p, c, has, uu, False)
        assert (got is None) == (ref is None)
        if ref is not None:
            assert np.array_equal(got[0], ref[0]) and got[1].tobytes() == ref[1].tobytes()


def test_control_several_rounds_read_their_own_uniforms():
    """Control: the comparison above tells rounds apart: given the next round's uniforms, the rounds settled on their
    scalars differ from the layouts in many cases."""
    differ = n = 0
    for seed in range(150):
        acc, p, c, has, u = _several(seed, 50, 4, 4, np.float32, bool(seed % 2))
        ref = _settle(acc, p, c, has, u, False)
        got = _apart(acc, p, c, has, np.roll(u, 1, axis=0))
        if ref is None or got is None:
            continue
        n += 1
        differ += not (np.array_equal(got[0], ref[0]) and got[1].tobytes() == ref[1].tobytes())
    assert n >= 100 and differ >= 0.2 * n

def _thresholds(acc, p, c, has):
    """Each tried sibling's acceptance threshold (B, K) by the layouts summing every sibling's admitted mass
    (``every_t``), uniforms just below 1 (every sibling rejected up to the first whose threshold reaches 1; NaN
    past it)."""
    B, V = p.shape
    step = delta_level(acc, B, V, c.shape[1], every_t=True)
    out = step(p.copy(), c, has, np.where(has, np.nextafter(1.0, 0.0), 0.0))
    if out is None:
        return None
    live, t = step.last
    full = np.full(c.shape, np.nan)
    full[live] = t.reshape(live.size, -1)
    full[~has | (np.cumsum(full >= 1, -1) - (full >= 1) > 0)] = np.nan
    return full


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([12, 50, 300]), K=st.integers(1, 5),
       dtype=st.sampled_from([np.float32, np.float64]), relative=st.booleans())
def test_one_round_at_its_thresholds(seed, V, K, dtype, relative):
    """Uniforms at the layouts' thresholds and one ulp below them: sibling j's threshold off by an ulp (its m_j, the
    mass its earlier siblings took, summed otherwise) would move the first accepted rank."""
    acc, p, c, has, _ = _case(seed, V, 1, K, dtype, relative)
    t = _thresholds(acc, p, c, has)
    if t is None:
        return
    for j in np.flatnonzero(~np.isnan(t[0])):   # a loop over the sibling ranks (test code)
        u = np.where(np.isnan(t), 0.5, t)
        u[0, j] = np.nextafter(t[0, j], 0.0)
        ok = u[0] < t[0]
        want = int(np.argmax(ok)) if ok.any() else K
        for uu, first in ((u, want), (np.where(np.isnan(t), 0.5, t), None)):
            got, ref = (_settle(acc, p, c, has, uu, one) for one in (True, False))
            assert (got is None) == (ref is None)
            if ref is not None:
                assert np.array_equal(got[0], ref[0]) and got[1].tobytes() == ref[1].tobytes()
                assert first is None or ref[0][0] == first


def test_control_one_round_checks_have_power(monkeypatch):
    """The residual rows compared above are the node's rows with removal sets zeroed (not the rows themselves), and an
    upper bound without the admitted mass's headroom in the one-round path alone changes its decisions."""
    cases = [_case(seed, 50, 2, 4, np.float32, bool(seed % 2)) for seed in range(200)]
    zeroed = wrong = 0
    for acc, p, c, has, u in cases:
        ref = _settle(acc, p, c, has, u, False)
        got = _settle(acc, p, c, has, u, True)
        if ref is None:
            continue
        stop = has[:, 0] & (ref[0] == c.shape[1])
        zeroed += ref[1].tobytes() != p[stop].tobytes()
        with monkeypatch.context() as m:
            m.setattr(LW, "upper", lambda pz, thr: pz + 0 * thr)
            bad = _settle(acc, p, c, has, u, True)
        wrong += bad is not None and not np.array_equal(bad[0], got[0])
    assert zeroed >= 50 and wrong >= 5


@pytest.mark.parametrize("static", [True, False])
def test_walk_at_batch_1_equals_verify_tree(static):
    """LANTERN's point-law walk at batch 1 (every level settled by ``_one_round``) gives verify_tree's verdict."""
    n = n_acc = 0
    for seed in range(120):
        rng = np.random.default_rng(50_000 + seed)
        V = 12 if seed % 2 else 50
        v = rules.lantern(rules.lantern_neighbors(rng.normal(size=(V, 3))), int(rng.integers(1, V // 3)),
                          float(rng.choice([0.0, 0.05, 0.2, 0.6])))
        p, q, tokens, u, us, tree, cap = tree_case(seed, static, V, B=1)
        p = p.astype(np.float32 if seed % 3 else np.float64)
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        got = v.walk["point"](p, q, tokens, u, us, tree.children, int(tree.depth), cap, "point")
        if got is not None:
            assert same(ref, got), seed
            n += 1
            n_acc += int(np.asarray(ref.accepted).sum())
    assert n >= 100 and n_acc > 40


def _entry(seed, V, dt_p, dt_q, relative, at_bound, zero_q, want):
    """A LANTERN(++) acceptance, one row p, q (1, V), a token x (1,), a uniform u (1,) near one of its bounds, want."""
    rng = np.random.default_rng(seed)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    k = int(rng.integers(1, V - 1))
    acc = rules.Lantern(nb, k, lam=float(rng.choice([1.0, 1.5, 3.0]))) if relative else \
        rules.Lantern(nb, k, delta=float(rng.choice([0.0, 0.02, 0.1, 0.3])))
    p = rows(rng, 1, 1, V, peaked=bool(seed % 2))[0].astype(dt_p)
    q = rows(rng, 1, 1, V, peaked=False)[0].astype(dt_q)
    x = rng.integers(0, V, size=1)
    if zero_q:
        q[0, x] = 0.0
    px, qx = p[0, x[0]], q[0, x[0]]
    bound = [px / qx, upper(px, acc._threshold(px)) / qx][at_bound % 2] if qx > 0 else rng.random()
    u = np.array([float(bound)])
    u = [u, np.nextafter(u, 0.0), np.nextafter(u, 2.0), rng.random(1)][at_bound // 2]
    return acc, p, q, x, u, None if want is None else np.array([want])


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([6, 40, 300]),
       dts=st.sampled_from([(np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float64)]),
       relative=st.booleans(), at_bound=st.integers(0, 7), zero_q=st.booleans(),
       want=st.sampled_from([None, True, False]))
def test_decide_one_entry_equals_the_general_path(seed, V, dts, relative, at_bound, zero_q, want):
    """One entry's decision and f (``_decide_one``, or the general path where the neighbours are read) equal the general
    path's on two rows holding that entry twice, bit for bit, and the decision is u < f of ``Lantern.at``."""
    acc, p, q, x, u, w = _entry(seed, V, *dts, relative, at_bound, zero_q, want)
    ok, f = acc.decide_at(p, q, None, x, u, want=w)
    two = [np.concatenate([a, a]) for a in (p, q, x, u)] + [None if w is None else np.concatenate([w, w])]
    ok2, f2 = acc.decide_at(*two[:2], None, *two[2:4], want=two[4])
    assert ok.shape == x.shape and f.dtype == f2.dtype
    assert np.array_equal(ok, ok2[:1]) and f.tobytes() == f2[:1].tobytes()
    exact = u < acc.at(p, q, None, x)
    assert np.array_equal(ok, exact & (True if w is None else w))


def test_control_decide_one_without_headroom_is_caught(monkeypatch):
    """Control: ``_decide_one`` with an upper bound of p(x) / q(x) (no room for the admitted mass) rejects entries the
    neighbours accept: decisions differ from u < f of ``Lantern.at``."""
    cases = [_entry(seed, 40, np.float32, np.float32, bool(seed % 2), seed % 8, False, None) for seed in range(200)]
    for acc, p, q, x, u, w in cases:
        assert np.array_equal(acc.decide_at(p, q, None, x, u)[0], u < acc.at(p, q, None, x))
    monkeypatch.setattr(LA, "upper", lambda px, thr: px + 0 * thr)
    wrong = sum(not np.array_equal(acc.decide_at(p, q, None, x, u)[0], u < acc.at(p, q, None, x))
                for acc, p, q, x, u, w in cases)
    assert wrong >= 10
