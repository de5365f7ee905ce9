"""Issue 30: the theory engine validates its tables once per public call (none in the internal cores),
without copying them, and its fast validation paths accept and reject exactly what the float
comparisons do (the -0.0 / NaN / out-of-range edge cases of the bit-pattern shortcut)."""
from __future__ import annotations

import numpy as np
import pytest

from strategies import random_tables
from theory.core import checks
from theory import markov
from theory.rules import discrepancy


def _case(V=6, L=3, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(V), size=V)
    Q = rng.dirichlet(np.ones(V), size=V)
    F, G = random_tables(rng, L, V)
    return P, Q, F, G


def _counting(monkeypatch):
    calls = {"acceptance_tables": 0, "resampling_tables": 0, "stochastic": 0, "tables_block_ok": 0}
    for name in calls:
        real = getattr(checks, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(checks, name, counted)
    return calls


# folded: F and G checked row block by row block inside the pass (markov._round_terms_checked), one
# block check per (position, block of 128 rows): L = 3 positions x 1 block at V = 6; P and Q by stochastic
_FOLDED = {"acceptance_tables": 0, "resampling_tables": 0, "stochastic": 2, "tables_block_ok": 3}


@pytest.mark.parametrize("fn, expected", [
    (lambda P, Q, F, G: markov.round_terms(P, Q, F, G, 0), _FOLDED),
    (lambda P, Q, F, G: markov.tv_bound(P, Q, F, G, 0), _FOLDED),
    (lambda P, Q, F, G: markov.bound_terms(P, Q, F, G, 0), _FOLDED),
    (lambda P, Q, F, G: markov.expected_accepted(P, Q, F, 0), _FOLDED),
    (lambda P, Q, F, G: markov.exact_tv(P, Q, F, G, 0),
     {"acceptance_tables": 1, "resampling_tables": 1, "stochastic": 3, "tables_block_ok": 0}),
])
def test_each_public_call_validates_each_table_once(monkeypatch, fn, expected):
    P, Q, F, G = _case()
    calls = _counting(monkeypatch)
    fn(P, Q, F, G)
    assert calls == expected


def test_folded_validation_is_bit_for_bit_the_whole_row_expression_and_refuses_the_last_block():
    V, L = 300, 2        # three row blocks, the last one partial (300 = 2 x 128 + 44)
    P, Q, F, G = _case(V=V, L=L, seed=5)
    mu = markov.init_distribution(0, V)
    acc, terms = markov.round_terms(P, Q, F, G, 0)
    acc_xp, terms_xp = markov.round_terms_xp(P, Q, F, G, mu)
    assert np.array_equal(acc, acc_xp) and np.array_equal(terms, terms_xp)
    v, acc_ref, terms_ref = mu, [], []          # T8 and T9 on whole rows, no blocks, no buffers
    for i in range(L):
        terms_ref.append(v @ discrepancy(P, Q, F[i], G[i]))
        v = v @ (Q * F[i])
        acc_ref.append(v.sum())
    assert np.array_equal(acc, acc_ref) and np.array_equal(terms, terms_ref)
    assert np.array_equal(markov.acceptance_probs(P, Q, F, 0), acc_xp)
    # negative controls: one bad entry in the last rows of the last position is still refused
    Fb = F.copy()
    Fb[-1, -1, -1] = 1.5
    with pytest.raises(ValueError, match="^acceptance probabilities F must lie in"):
        markov.round_terms(P, Q, Fb, G, 0)
    Gb = G.copy()
    Gb[-1, -1, 0] += 1e-6            # row sum off by 1e-6 > 1e-8
    with pytest.raises(ValueError, match="^G is not row-stochastic: row \\(1, 299\\)"):
        markov.round_terms(P, Q, F, Gb, 0)
    Gz = G.copy()
    j = int(np.argmin(Gz[-1, 200]))
    Gz[-1, 200] /= 1 - Gz[-1, 200, j]
    Gz[-1, 200, j] = -0.0            # refused by the block predicate, accepted by the full check
    assert np.isfinite(markov.round_terms(P, Q, F, Gz, 0)[1]).all()


def test_public_calls_neither_copy_nor_modify_their_inputs():
    P, Q, F, G = _case()
    before = [a.copy() for a in (P, Q, F, G)]
    markov.round_terms(P, Q, F, G, 0)
    markov.exact_tv(P, Q, F, G, 0)
    markov.optimal_resampling(P, Q, F)
    for a, b in zip((P, Q, F, G), before):
        assert np.array_equal(a, b)
    assert checks.acceptance_tables(F, 6, copy=False) is F
    assert checks.acceptance_tables(F, 6) is not F        # the default still copies


def test_in_place_numpy_core_is_bit_for_bit_the_array_api_expression():
    P, Q, F, G = _case(V=7, L=4, seed=3)
    mu = np.full(7, 1 / 7)
    acc, terms = markov.round_terms_xp(P, Q, F, G, mu)
    # the array-API expressions, position by position (no buffers): T8 and T9 written out
    v, acc_ref, terms_ref = mu, [], []
    for i in range(4):
        terms_ref.append(v @ discrepancy(P, Q, F[i], G[i]))
        v = v @ (Q * F[i])
        acc_ref.append(v.sum())
    assert np.array_equal(acc, acc_ref) and np.array_equal(terms, terms_ref)


@pytest.mark.parametrize("value, ok", [(-0.0, True), (0.0, True), (1.0, True), (np.nextafter(1.0, 2.0), False),
                                       (-1e-300, False), (np.nan, False), (np.inf, False), (-np.inf, False)])
def test_fast_range_check_of_F_agrees_with_float_comparisons(value, ok):
    P, Q, F, G = _case()
    F[1, 2, 3] = value
    if ok:
        markov.expected_accepted(P, Q, F, 0)
    else:
        with pytest.raises(ValueError, match="^(F contains NaN|acceptance probabilities F must lie)"):
            markov.expected_accepted(P, Q, F, 0)


@pytest.mark.parametrize("value, ok", [(-0.0, True), (-1e-300, False), (np.nan, False), (np.inf, False)])
def test_fast_sign_check_of_G_agrees_with_float_comparisons(value, ok):
    P, Q, F, G = _case()
    row = G[0, 1]
    j = int(np.argmin(row))
    row[j] = 0.0
    row /= row.sum()
    row[j] = value
    if ok:
        markov.tv_bound(P, Q, F, G, 0)
    else:
        with pytest.raises(ValueError, match="^G (contains NaN|has negative)"):
            markov.tv_bound(P, Q, F, G, 0)


def test_fast_paths_also_hold_for_non_contiguous_and_float32_tables():
    P, Q, F, G = _case()
    Ft = np.ascontiguousarray(F.transpose(0, 2, 1)).transpose(0, 2, 1)   # a non-contiguous view of the same values
    assert not Ft.flags.c_contiguous
    ref = markov.round_terms(P, Q, F, G, 0)
    got = markov.round_terms(P, Q, Ft, G, 0)
    assert np.allclose(ref[0], got[0], rtol=0, atol=1e-14) and np.allclose(ref[1], got[1], rtol=0, atol=1e-14)
    Fbad = Ft.copy(order="K")
    Fbad[0, 0, 0] = 1.5
    with pytest.raises(ValueError, match="^acceptance probabilities F must lie"):
        markov.expected_accepted(P, Q, Fbad, 0)
    F32 = F.astype(np.float32)
    assert np.isfinite(markov.expected_accepted(P, Q, F32, 0))
