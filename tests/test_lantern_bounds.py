"""LANTERN(++) decided from bounds (docs/theory/trees.md section 9b, "The admitted mass where it decides"): the admitted
neighbour mass A lies in [0, thr], so a candidate whose uniform falls outside [p / m, (p + thr) / m] is decided without
reading its neighbours. The decisions are the exact ones, bit for bit: ``Lantern.decide_at`` against ``Lantern.at`` (numpy
and torch rows, zeros, repeated tokens, q = 0, ``want`` and chain masks); LANTERN's level walk with bounds against the
same walk summing every sibling (``every_t``), in both layouts (stamps and fixed point, rank by rank), whose step outputs
agree bit for bit; the walks' verdicts against ``verify_tree``. Controls: a bound without the admitted mass's headroom
changes decisions (chains, the level walk, LANTERN++'s boosted walk), so these comparisons have power. Also: flat
entries of sliced and broadcast rows read without a copy give the copied rows' p~ bit for bit, and the level walk's
stamps, reused across walks of one size, stay valid when the sibling count changes."""
import sys

import numpy as np
import pytest
import torch

from theory import rules
from theory.rules import walks
from theory.rules.lantern_at import entries
from theory.rules.lantern_walk import delta_level
from theory.tree import verify_round, verify_tree
from tree_cases import rows, same, tree_case

LW = sys.modules["theory.rules.lantern_walk"]
LA = sys.modules["theory.rules.lantern_at"]


def _chain_case(seed, V=40, B=6, L=4, dtype=np.float32):
    """Rows p (B, L, V), q (B, L, V) with exact zeros (q = 0 at some drafted tokens), tokens (repeats), uniforms, a
    LANTERN or LANTERN++ rule with neighbours often admitted."""
    rng = np.random.default_rng(seed)
    p = rows(rng, B, L, V, peaked=bool(seed % 2)).astype(dtype)
    q = rows(rng, B, L, V, peaked=False).astype(dtype)
    x = rng.integers(0, V, size=(B, L))
    x[:, -1] = x[:, 0]                                                           # repeated tokens
    q[0, 1, x[0, 1]] = 0.0                                                       # a drafted token q gives no mass
    u = rng.random((B, L))
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    k = int(rng.integers(1, V - 2))
    v = rules.lantern(nb, k, float(rng.choice([0.0, 0.05, 0.3]))) if seed % 2 else \
        rules.lantern_pp(nb, k, float(rng.choice([1.5, 2.0, 5.0])))
    return v.accept, p, q, x, u


def _decided_like_at(acc, p, q, x, u, want=None, chain=False):
    """decide_at's decisions equal u < at's f where they are read; its f equals at's bits where it computed it."""
    ok, f = acc.decide_at(p, q, None, x, u, want=want, chain=chain)
    ref = acc.at(p, q, None, x)
    ok, f, ref, u = (np.asarray(a) for a in (ok, f, ref, u))
    exact = u < ref
    read = np.ones(x.shape, bool) if want is None else np.asarray(want)
    if chain:                    # up to and including each row's first rejection
        rejected = ~exact & read
        read = read & (np.cumsum(rejected, axis=-1) - rejected == 0)
    seen = ~np.isnan(f)
    good = np.array_equal(ok[read], exact[read]) and np.array_equal(f[seen], ref[seen])
    if want is not None:
        good = good and not ok[~np.asarray(want)].any()           # unread entries: False
    return bool(good), int(seen.sum()), int((~seen & read).sum())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decide_at_gives_the_exact_decisions(dtype):
    n_summed = n_bounded = 0
    for seed in range(60):
        acc, p, q, x, u = _chain_case(seed, dtype=dtype)
        want = np.random.default_rng(seed).random(x.shape) < 0.8
        for kw in ({}, {"want": want}, {"chain": True}, {"want": want, "chain": True}):
            good, summed, bounded = _decided_like_at(acc, p, q, x, u, **kw)
            assert good, (seed, kw)
            n_summed, n_bounded = n_summed + summed, n_bounded + bounded
    assert n_summed > 300 and n_bounded > 300        # both branches taken often


def test_decide_at_on_torch_rows_and_strided_rows():
    """torch CPU tensors (numpy views, f summed in float64 as ``Lantern.at`` does there) and rows sliced from a wider
    stack (a chain's p[..., :L, :], read without a copy) give the exact decisions."""
    for seed in range(40):
        acc, p, q, x, u = _chain_case(seed)
        wide = np.concatenate([p, p[:, :1]], axis=1)                          # (B, L + 1, V)
        nbt = torch.as_tensor(np.asarray(acc.neighbors))
        acc_t = type(acc)(nbt, acc.k, delta=acc.delta, lam=acc.lam)
        t = [torch.as_tensor(a) for a in (wide, q, x, u)]
        assert _decided_like_at(acc_t, t[0][:, :-1], t[1], t[2], t[3], chain=True)[0], seed
        assert _decided_like_at(acc, wide[:, :-1], q, x, u, chain=True)[0], seed


def test_control_decide_at_without_headroom_is_caught(monkeypatch):
    """Control: an upper bound p(x) (no room for the admitted mass) rejects candidates the neighbours would accept."""
    cases = [_chain_case(seed) for seed in range(40)]
    assert all(_decided_like_at(*c)[0] for c in cases)
    monkeypatch.setattr(LA, "upper", lambda px, thr: px + 0 * np.asarray(thr, px.dtype))
    assert sum(not _decided_like_at(*c)[0] for c in cases) >= 5


def test_flat_entries_of_sliced_and_broadcast_rows_are_the_copied_ones():
    """``entries`` on a row slice and on broadcast rows (no copy) reads the same masses as on their copies, and p~
    at the tokens is the same bit for bit; rows that do not start at multiples of V take the copy."""
    rng = np.random.default_rng(0)
    V = 30
    p = rows(rng, 4, 5, V, peaked=False).astype(np.float32)
    x = rng.integers(0, V, size=(4, 3))
    acc = rules.Lantern(rules.lantern_neighbors(rng.normal(size=(V, 3))), 7, lam=3.0)
    for view in (p[:, :3], p[:, 1:4], p[:, ::2][:, :3], np.broadcast_to(p[:, :1], (4, 3, V))):
        pf, e = entries(view, x, np)
        assert np.shares_memory(pf, p)
        assert np.array_equal(pf[e].reshape(x.shape), np.take_along_axis(view, x[..., None], -1)[..., 0])
        assert acc.aggregated_at(view, x).tobytes() == acc.aggregated_at(np.ascontiguousarray(view), x).tobytes()
    odd = p[:, :3, 1:]                                                           # rows of V - 1 codes at odd starts
    pf, e = entries(odd, x % (V - 1), np)
    assert not np.shares_memory(pf, p)
    assert np.array_equal(pf[e].reshape(x.shape), np.take_along_axis(odd, (x % (V - 1))[..., None], -1)[..., 0])


def _level_cases(n, V=40, B=6, K=4):
    for seed in range(n):
        rng = np.random.default_rng(seed)
        nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
        acc = rules.Lantern(nb, int(rng.integers(1, V // 3)), delta=float(rng.choice([0.0, 0.02, 0.1, 0.3])))
        p = rows(rng, 1, B, V, peaked=bool(seed % 2))[0]
        c = rng.integers(0, V, size=(B, K))
        has = np.arange(K) < rng.integers(0, K + 1, size=B)[:, None]           # prefixes of the ranks
        u = rng.random((B, K)) ** 2 * 0.5                                        # often inside the bounds
        yield acc, p, c, has, u


def _step(acc, p, c, has, u, every_t, rank_by_rank, monkeypatch):
    monkeypatch.setattr(LW, "RANK_BY_RANK", 0 if rank_by_rank else 1 << 40)
    monkeypatch.setattr(LW, "ROUNDS_APART", 1)                     # (the layouts, not round by round)
    B, V = p.shape
    step = delta_level(acc, B, V, c.shape[1], every_t=every_t)
    pr = p.copy()
    out = step(pr, c, has, u)
    if out is None:
        return None
    ok, clear = out
    stop = has[:, 0] & ~ok.any(-1)
    clear(stop, pr)
    return ok, pr[stop], getattr(step, "last", None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_level_bounds_and_layouts_give_the_same_bits(dtype, monkeypatch):
    """The level step with bounds (A_j summed where it decides) and summing every sibling, stamps and rank by rank:
    the same acceptances and the same residual rows, bit for bit; the thresholds of the two layouts' every_t steps are
    equal bit for bit where both are meaningful (up to each round's first acceptance)."""
    n = 0
    for acc, p, c, has, u in _level_cases(80):
        p = p.astype(dtype)
        got = {(e, r): _step(acc, p, c, has, u, e, r, monkeypatch) for e in (False, True) for r in (False, True)}
        if any(g is None for g in got.values()):
            assert all(g is None for g in got.values())
            continue
        ref = got[(True, False)]
        K = c.shape[1]
        first = lambda ok: np.where(ok.any(-1), ok.argmax(-1), K)              # noqa: E731 (the round's first accepted)
        for g in got.values():
            assert np.array_equal(first(g[0]), first(ref[0])) and g[1].tobytes() == ref[1].tobytes()
        (la, ta), (lb, tb) = got[(True, False)][2], got[(True, True)][2]
        upto = (np.arange(K) <= np.where(ref[0].any(-1), ref[0].argmax(-1), K)[:, None]) & has
        assert np.array_equal(la, lb)
        assert ta.reshape(-1, K)[upto[la]].tobytes() == tb.reshape(-1, K)[upto[la]].tobytes()
        n += 1
    assert n > 60


@pytest.mark.parametrize("static", [True, False])
def test_rank_by_rank_walk_equals_verify_tree(static, monkeypatch):
    monkeypatch.setattr(LW, "RANK_BY_RANK", 0)
    monkeypatch.setattr(LW, "ROUNDS_APART", 1)                     # (the layouts, not round by round)
    n = 0
    for seed in range(60):
        rng = np.random.default_rng(30_000 + seed)
        V = 12 if seed % 2 else 50
        v = rules.lantern(rules.lantern_neighbors(rng.normal(size=(V, 3))), int(rng.integers(1, V // 3)),
                          float(rng.choice([0.0, 0.05, 0.2])))
        p, q, tokens, u, us, tree, cap = tree_case(seed, static, V)
        p = p.astype(np.float32)
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        got = v.walk["point"](p, q, tokens, u, us, tree.children, int(tree.depth), cap, "point")
        if got is not None:
            assert same(ref, got), seed
            n += 1
    assert n >= 50


@pytest.mark.parametrize("rank_by_rank", [False, True])
def test_control_level_bound_without_headroom_is_caught(rank_by_rank, monkeypatch):
    """Control: the level walk's upper bound without the admitted mass (p'(c_j) / m_j) rejects siblings whose
    neighbours would accept them: verdicts differ from verify_tree."""
    monkeypatch.setattr(LW, "RANK_BY_RANK", 0 if rank_by_rank else 1 << 40)
    monkeypatch.setattr(LW, "ROUNDS_APART", 1)                     # (the layouts, not round by round)
    monkeypatch.setattr(LW, "upper", lambda pz, thr: pz + 0 * thr)
    wrong = 0
    for seed in range(60):
        rng = np.random.default_rng(30_000 + seed)
        V = 12 if seed % 2 else 50
        v = rules.lantern(rules.lantern_neighbors(rng.normal(size=(V, 3))), int(rng.integers(1, V // 3)), 0.2)
        p, q, tokens, u, us, tree, cap = tree_case(seed, True, V)
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        got = v.walk["point"](p, q, tokens, u, us, tree.children, int(tree.depth), cap, "point")
        wrong += got is not None and not same(ref, got)
    assert wrong >= 5


def test_control_boost_bound_without_headroom_is_caught():
    """Control: LANTERN++'s boosted walk with a bound of half its threshold decides some candidates the boost would
    have accepted: verdicts differ from verify_tree; with the rule's own bound they do not."""
    wrong = 0
    for seed in range(80):
        rng = np.random.default_rng(10_000 + seed)
        V = 6 if seed % 2 else 50
        v = rules.lantern_pp(rules.lantern_neighbors(rng.normal(size=(V, 3))), int(rng.integers(1, V - 1)), 5.0)
        p, q, tokens, u, us, tree, cap = tree_case(seed, True, V)
        p = p.astype(np.float32)
        acc = v.accept
        half = rules.Verifier(acc, v.resample, "half", {}, walk=walks.boosted_walks(
            acc.sibling_mass, None, lambda pc, left: 0.5 * acc.sibling_cap(pc, left)))
        own = rules.Verifier(acc, v.resample, "own", {}, walk=walks.boosted_walks(acc.sibling_mass, None,
                                                                                   acc.sibling_cap))
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        assert same(ref, verify_round(p, q, tokens, u, us, tree, own, law="point", max_depth=cap))
        wrong += not same(ref, verify_round(p, q, tokens, u, us, tree, half, law="point", max_depth=cap))
    assert wrong >= 5


def test_level_stamps_reused_across_sibling_counts():
    """Walks of one size share their stamps: after walks with K = 5 siblings, walks with fewer (per-round trees) still
    give verify_tree's verdict (each pass's stamps lie above every stamp written before)."""
    V, n = 50, 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        v = rules.lantern(rules.lantern_neighbors(rng.normal(size=(V, 3))), 8, 0.2)
        for static in (True, False):                     # EAGLE-25 (K = 4) then a random tree (other K)
            p, q, tokens, u, us, tree, cap = tree_case(seed, static, V)
            ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
            got = v.walk["point"](p, q, tokens, u, us, tree.children, int(tree.depth), cap, "point")
            if got is not None:
                assert same(ref, got), (seed, static)
                n += 1
    assert n >= 60


def _host_walk_cases(n):
    for seed in range(n):
        rng = np.random.default_rng(40_000 + seed)
        V = 12 if seed % 2 else 50
        nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
        k = int(rng.integers(1, V // 2))
        v = rules.lantern_pp(nb, k, 3.0) if seed % 3 else rules.lantern(nb, k, 0.2)
        p, q, tokens, u, us, tree, cap = tree_case(seed, bool(seed % 4), V)
        yield v, p.astype(np.float32), q.astype(np.float32), tokens, u, us, tree, cap


@pytest.mark.parametrize("law", ["without_replacement", "point"])
def test_host_walk_decides_lantern_from_bounds(law):
    """The host walk (one candidate per round per step), candidates drawn without replacement or deterministic (the
    point law: LANTERN's released laws read no f there either): LANTERN(++) decided by ``Lantern.decide_at`` gives
    verify_tree's verdict (f read in full at every candidate)."""
    n = 0
    for v, p, q, tokens, u, us, tree, cap in _host_walk_cases(60):
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law=law)
        got = walks.host_walk(v.accept, v.resample, p, q, tokens, u, us, tree.children, int(tree.depth), cap, law)
        assert same(ref, got), v.name
        n += int(np.asarray(ref.accepted).sum())
    assert n > 50


@pytest.mark.parametrize("law", ["without_replacement", "point"])
def test_control_host_walk_without_headroom_is_caught(monkeypatch, law):
    monkeypatch.setattr(LA, "upper", lambda px, thr: px + 0 * np.asarray(thr, px.dtype))
    wrong = 0
    for v, p, q, tokens, u, us, tree, cap in _host_walk_cases(60):
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law=law)
        got = walks.host_walk(v.accept, v.resample, p, q, tokens, u, us, tree.children, int(tree.depth), cap, law)
        wrong += not same(ref, got)
    assert wrong >= 5


def test_entries_of_one_row_and_one_token_are_the_general_layouts():
    """``entries`` on one C-ordered row (1, V) and one token (1,) (the host walk at batch 1: its short path) gives the
    general layout's flat row and entry, for every code; a non-contiguous row takes the general path and agrees too."""
    rng = np.random.default_rng(7)
    for dt in (np.float32, np.float64):
        p = rng.random((1, 37)).astype(dt)
        for x in range(37):
            tok = np.array([x])
            pf, e = entries(p, tok, np)
            assert pf.base is not None and np.shares_memory(pf, p) and e.dtype == np.int64
            assert e.tolist() == [x] and pf[e][0] == p[0, x]
        wide = rng.random((1, 74)).astype(dt)[:, ::2]       # strided: not C-ordered, the general path
        assert not wide.flags.c_contiguous
        pf, e = entries(wide, np.array([5]), np)
        assert pf[e][0] == wide[0, 5]
