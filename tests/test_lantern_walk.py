"""theory.rules.lantern_walk: LANTERN as released (absolute delta, the dynamic path's resampler) under the point draft
law settles a level at once (docs/theory/trees.md section 9b). Its verdict is verify_tree's (the candidate-by-candidate
walk, residuals renormalised) on random trees with exact zeros, repeated siblings, depth caps and delta = 0, float32 and
float64, and on torch rows (whose device walk is verify_tree_nodes'); its thresholds equal those of the dense p~ at every
code of the renormalised residuals to 1e-12 in float64; controls: a residual without the neighbours removed, and one not
renormalised, are told apart. An emptied residual hands the round to the generic walk. ``prefix_rows`` gives
``_prefix_of``'s bits (the numpy reduction order it relies on is pinned here)."""
import numpy as np
import pytest
import torch

from theory import rules
from theory.rules import Lantern, LanternResample, walks
from theory.rules.lantern_walk import delta_level
from theory.rules.prefix_mass import COLUMNS_LAID_OUT, _prefix_of, prefix_rows
from theory.tree import verify_round, verify_tree
from tree_cases import rows, same, tree_case


def _lantern_case(seed, static, V, dtype=np.float32):
    rng = np.random.default_rng(20_000 + seed)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    v = rules.lantern(nb, int(rng.integers(1, max(3, V // 3))), float(rng.choice([0.0, 0.05, 0.2, 0.6])))
    p, q, tokens, u, us, tree, cap = tree_case(seed, static, V)
    return v, p.astype(dtype), q, tokens, u, us, tree, cap


def _walk(v, p, q, tokens, u, us, tree, cap):
    return v.walk["point"](p, q, tokens, u, us, tree.children, int(tree.depth), cap, "point")


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("V", [12, 50])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lantern_point_walk_equals_verify_tree(static, V, dtype):
    n_acc = n_walked = n_moved = 0
    for seed in range(100):
        v, p, q, tokens, u, us, tree, cap = _lantern_case(seed, static, V, dtype)
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        got = _walk(v, p, q, tokens, u, us, tree, cap)
        if got is not None:
            assert same(ref, got), (seed, ref, got)
            n_walked += 1
        assert same(ref, verify_round(p, q, tokens, u, us, tree, v, law="point", max_depth=cap))
        n_acc += int(ref.accepted.sum())
        van = verify_tree(p, q, tokens, u, us, tree, rules.vanilla(), early_exit=True, max_depth=cap, draft_law="point")
        n_moved += not same(ref, van)            # LANTERN's neighbours changed the verdict somewhere
    assert n_walked >= 90 and n_acc > 100 and n_moved >= 30


@pytest.mark.parametrize("static", [True, False])
def test_lantern_point_walk_on_torch_rows(static):
    """Torch rows take the device path (verify_tree_nodes, the rule's point law per rank): the level walk's verdict."""
    n = 0
    for seed in range(40):
        v, p, q, tokens, u, us, tree, cap = _lantern_case(seed, static, 50)
        got = _walk(v, p, q, tokens, u, us, tree, cap)
        if got is None:
            continue
        t = [torch.as_tensor(a) for a in (p, q, tokens, u, us)]
        vt = rules.lantern(torch.as_tensor(np.asarray(v.accept.neighbors)), v.accept.k, v.accept.delta)
        assert "device" not in vt.walk and _walk(vt, *t, tree, cap) is None          # host walk: numpy rows only
        dev = verify_round(*t, tree, vt, law="point", max_depth=None if cap is None else torch.as_tensor(cap))
        assert same(got, [x.numpy() for x in dev]), seed
        n += 1
    assert n >= 35


def _level(v, p, c, K):
    """One level at every round's root: thresholds of the level step (u just below 1: every sibling tried until one
    reaches 1), and the sequential reference from the dense rows: f_j = min(1, p~_j(c_j)) of the residual r_j, r_{j+1}
    the resampler's law given c_j (the full-row code of section 6)."""
    B, V = p.shape
    step = delta_level(v.accept, B, V, K, every_t=True)
    out = step(p.copy(), c, np.ones((B, K), bool), np.full((B, K), np.nextafter(1.0, 0.0)))
    if out is None:
        return None
    live, t = step.last
    assert np.array_equal(live, np.arange(B))
    return np.minimum(t.reshape(B, K), 1.0)


def _sequential(acc, resample, p, c, renormalise=True):
    B, K = c.shape
    f = np.full((B, K), np.nan)
    for b in range(B):     # the reference: candidate by candidate, dense rows (test code)
        r = p[b]
        for j in range(K):
            f[b, j] = min(1.0, float(acc.aggregated(r)[c[b, j]]))
            if f[b, j] >= 1.0:
                break
            g = resample(r[None], np.eye(len(r))[c[b, j]][None], None, c[b, j:j + 1])[0]
            r = g if renormalise else np.where(g > 0, r, 0.0)      # (the control: left in the row's units)
    return f


def _cases(n, V=40, B=6, K=4):
    for seed in range(n):
        rng = np.random.default_rng(seed)
        nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
        k = int(rng.integers(1, V // 3))
        acc = Lantern(nb, k, delta=float(rng.choice([0.0, 0.02, 0.1, 0.3])))
        p = rows(rng, 1, B, V, peaked=bool(seed % 2))[0]          # (B, V) float64 with exact zeros
        c = rng.integers(0, V, size=(B, K))                       # repeated siblings included
        yield acc, p, c, K


def test_level_thresholds_equal_the_dense_sequential_ones():
    """Each sibling's threshold, up to the first that reaches 1, equals min(1, p~(c_j)) of the dense rows of the
    renormalised residual (LANTERN's released law, p with c and its admitted neighbours zeroed), to 1e-12 in float64:
    zeros, repeated siblings, no neighbour admitted (delta = 0), and neighbourhoods emptied by earlier siblings."""
    n_cmp = n_noadm = 0
    for acc, p, c, K in _cases(60):
        res = LanternResample(acc.neighbors, acc.k, "p", "released", acc)
        got = _level(rules.lantern(acc.neighbors, acc.k, acc.delta), p, c, K)
        if got is None:
            continue
        ref = _sequential(acc, res, p, c)
        m = ~np.isnan(ref)
        np.testing.assert_allclose(got[m], ref[m], rtol=1e-12, atol=1e-15)
        n_cmp += int(m[:, 1:].sum())
        n_noadm += int((~acc.admits(p)[np.arange(len(p))[:, None], c]).sum())
    assert n_cmp > 600 and n_noadm > 100


def test_level_thresholds_control_wrong_residuals_are_told_apart():
    """Controls: the same comparison against a residual that removes only c_j (vanilla's: the admitted neighbours
    kept) and against one left in the row's units (not renormalised) fails on these cases: it has power."""
    kept = wrong_units = 0
    for acc, p, c, K in _cases(60):
        got = _level(rules.lantern(acc.neighbors, acc.k, acc.delta), p, c, K)
        if got is None:
            continue
        only_c = _sequential(acc, lambda r, q, f, x: rules.Residual()(r, q, None, x), p, c)
        units = _sequential(acc, LanternResample(acc.neighbors, acc.k, "p", "released", acc), p, c, renormalise=False)
        for ref, name in ((only_c, "kept"), (units, "units")):
            m = ~np.isnan(ref) & ~np.isnan(got)
            bad = not np.allclose(got[m], ref[m], rtol=1e-12, atol=1e-15)
            kept += bad and name == "kept"
            wrong_units += bad and name == "units"
    assert kept >= 20 and wrong_units >= 20


def test_an_emptied_residual_hands_the_round_to_the_generic_walk():
    """Every code of positive mass zeroed (c and its k+1 neighbours cover the row): the release draws, and later
    siblings meet, the uniform row; the level walk gives way (None) and verify_round still gives verify_tree's verdict."""
    n_none = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        V = 4
        v = rules.lantern(rules.lantern_neighbors(rng.normal(size=(V, 2))), 2, 0.05)
        p, q, tokens, u, us, tree, cap = tree_case(seed, True, V)
        got = _walk(v, p, q, tokens, u, us, tree, cap)
        n_none += got is None
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        assert same(ref, verify_round(p, q, tokens, u, us, tree, v, law="point", max_depth=cap))
        if got is not None:
            assert same(ref, got)
    assert n_none >= 10


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prefix_rows_gives_prefix_of_bits(dtype):
    """``prefix_rows`` (whole sums by a cumulative sum on few entries, by numpy's outer-axis reduction of the transpose
    on many) against ``_prefix_of`` bit for bit: shapes on both sides of COLUMNS_LAID_OUT, widths 1 to 1000, scalar and
    per-entry thresholds, zeros, -0.0, NaN. Control: numpy's pairwise row sum differs from the cumulative sum's last
    value on these masses, so the reduction order matters and is what is pinned."""
    rng = np.random.default_rng(0)
    pairwise_differs = 0
    for m in (1, 2, 3, COLUMNS_LAID_OUT - 1, COLUMNS_LAID_OUT, 40, 200):
        for w in (1, 2, 7, 64, 1000):
            g = (rng.random((m, w)) ** 6 * 3.0 / w).astype(dtype)
            g[rng.random(g.shape) < 0.1] = 0.0
            g[rng.random(g.shape) < 0.02] = -0.0
            if m > 3:
                g[1] = -0.0
                g[2, w // 2] = np.nan
            for thr in (0.5, np.inf, (rng.random(m) * 2.0).astype(dtype)):
                ref = _prefix_of(g, thr, dtype, dtype)[0]
                got = prefix_rows(g, thr, dtype)
                assert got.dtype == ref.dtype and got.tobytes() == ref.tobytes(), (m, w, thr)
            if w >= 64:
                pairwise_differs += not np.array_equal(g.sum(1), np.cumsum(g, 1)[:, -1], equal_nan=True)
    assert pairwise_differs >= 3


def test_level_walk_is_numpy_only_and_pickles():
    import pickle

    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(8, 2)))
    v = rules.lantern(nb, 3, 0.1)
    assert set(pickle.loads(pickle.dumps(v)).walk) == {"point"}
    p, q, tokens, u, us, tree, cap = tree_case(1, True, 8)
    t = [torch.as_tensor(a) for a in (p, q, tokens, u, us)]
    assert v.walk["point"](*t, tree.children, int(tree.depth), None, "point") is None
    assert walks is not None
