"""Verifier rules: vectorised rules against scalar references, the same code on numpy / JAX / torch,
chain verification, and clear errors on bad input."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bruteforce as bf
from strategies import chain_case
from theory.markov import chains
from theory import markov, rules, verify_chain

TOL = 1e-12


@settings(max_examples=50, deadline=None)
@given(chain_case(max_V=7, max_L=1), st.integers(1, 5), st.floats(0.0, 0.6), st.floats(1.0, 4.0))
def test_rules_match_scalar_references(case, k, delta, lam):
    P, Q, _, _, rng = case
    V = len(P)
    k = max(1, min(k, V - 2)) if V > 2 else 1
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    i = int(rng.integers(1, 6))
    w = float(rng.uniform(0.3, 3))
    for s in range(V):
        p, q = list(P[s]), list(Q[s])
        assert np.allclose(rules.Scaled(rules.Uniform(w))(P[s], Q[s], i), bf.scaled_f(w, p, q), atol=TOL)
        assert np.allclose(rules.Vanilla()(P[s], Q[s], i), bf.scaled_f(1.0, p, q), atol=TOL)
        assert np.allclose(rules.Lantern(nb, k, delta=delta).aggregated(P[s]),
                           bf.lantern_ptilde(p, nb, k, delta=delta), atol=TOL)
        assert np.allclose(rules.Lantern(nb, k, lam=lam).aggregated(P[s]),
                           bf.lantern_ptilde(p, nb, k, lam=lam), atol=TOL)
        assert np.array_equal(rules.Typical(0.09, 0.3, "exact")(P[s], Q[s], i), bf.typical_f(p, 0.09, 0.3))
        assert np.array_equal(rules.Typical(0.09, 0.3)(P[s], Q[s], i), bf.typical_f(p, 0.09, 0.3, "release"))
        assert rules.Greedy()(P[s], Q[s], i).sum() == 1 and rules.Greedy()(P[s], Q[s], i)[np.argmax(p)] == 1
        if V > 2 and k + 1 <= V - 1:
            for kw in ({"delta": delta}, {"lam": lam}):
                acc = rules.Lantern(nb, k, **kw)
                for x in range(V):
                    for variant in "pq":
                        got = rules.LanternResample(nb, k, variant, "renormalised")(P[s], Q[s], None, rejected=np.int64(x))
                        assert np.allclose(got, bf.lantern_g(p, q, nb, k, x, variant), atol=TOL)
                        got = rules.LanternResample(nb, k, variant, accept=acc)(P[s], Q[s], None, rejected=np.int64(x))
                        assert np.allclose(got, bf.lantern_g_released(p, q, nb, k, x, variant, **kw), atol=TOL)


def test_schedules():
    ex = rules.Exponential(2.0, nu=0.7)
    assert math.isclose(ex(1, np), 2.0) and math.isclose(ex(3, np), 2.0 * math.exp(-1.4))
    assert math.isclose(rules.Exponential(2.0, 0.7, mu=0.0)(1, np), 2.0 * math.exp(-0.7))
    lin = rules.Linear(3.0, 1.0, 5)
    assert [lin(i, np) for i in range(1, 6)] == [3.0, 2.5, 2.0, 1.5, 1.0]
    # array positions give the same numbers as scalar positions
    i = np.arange(1, 6, dtype=float)
    assert np.allclose(ex(i, np), [ex(j, np) for j in range(1, 6)])
    assert np.allclose(rules.Explicit([1, 2, 3, 4, 5])(i, np), [1, 2, 3, 4, 5])
    for bad in (lambda: rules.Uniform(0.0), lambda: rules.Exponential(-1.0), lambda: rules.Linear(1.0, -2.0, 3),
                lambda: rules.Explicit([1.0, 0.0]), lambda: rules.Uniform(float("nan"))):
        with pytest.raises(ValueError, match="> 0"):
            bad()
    with pytest.raises(ValueError, match="position 4"):
        rules.Explicit([1.0, 1.0, 1.0])(4, np)


def _verifiers(V, rng):
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    return [rules.vanilla(), rules.cool_sd(2.0), rules.uniform_rsd(1.5), rules.lantern(nb, 2, 0.2),
            rules.lantern_pp(nb, 2, 2.0), rules.typical(), rules.greedy(), rules.lantern(nb, 2, 0.2, "optimal")]


def test_same_rules_on_numpy_jax_and_torch():
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    B, L, V = 64, 4, 8
    P, Q = chains.random_pair(V, 0.4, seed=1)
    prev = rng.integers(V, size=(B, L + 1))
    p = P[prev]
    q = Q[prev[:, :L]]
    toks = rng.integers(V, size=(B, L))
    ua, us = rng.random((B, L)), rng.random(B)
    for v in _verifiers(V, rng):
        ref = verify_chain(p, q, toks, ua, us, v)
        for to in (jnp.asarray, torch.as_tensor):
            out = verify_chain(to(p), to(q), to(toks), to(ua), to(us), v)
            assert np.array_equal(np.asarray(out.accepted), ref.accepted), v.name
            assert np.array_equal(np.asarray(out.next_token), ref.next_token), v.name
        F = v.accept(p[:, :L], q, np.arange(1, L + 1))
        for to in (jnp.asarray, torch.as_tensor):
            assert np.allclose(np.asarray(v.accept(to(p[:, :L]), to(q), to(np.arange(1, L + 1)))), F, atol=1e-12)
            assert np.allclose(np.asarray(v.resample(to(p[:, 0]), to(q[:, 0]), to(F[:, 0]))),
                               v.resample(p[:, 0], q[:, 0], F[:, 0]), atol=1e-12)


def _verify_reference(p, q, toks, ua, us, v):
    """Per-round Python loop following section 1 (reference for the batched routine)."""
    L = toks.shape[-1]
    for i in range(L):
        f = v.accept(p[i], q[i], i + 1)
        if not ua[i] < f[toks[i]]:
            g = v.resample(p[i], q[i], f, rejected=np.int64(toks[i]))
            return i, int(np.searchsorted(np.cumsum(g), us * g.sum(), side="right"))
    return L, int(np.searchsorted(np.cumsum(p[L]), us * p[L].sum(), side="right"))


def test_verify_chain_matches_a_per_round_loop():
    rng = np.random.default_rng(5)
    B, L, V = 300, 5, 6
    P, Q = chains.random_pair(V, 0.5, seed=2)
    prev = rng.integers(V, size=(B, L + 1))
    p, q = P[prev], Q[prev[:, :L]]
    toks = rng.integers(V, size=(B, L))
    ua, us = rng.random((B, L)), rng.random(B)
    for v in _verifiers(V, rng):
        out = verify_chain(p, q, toks, ua, us, v)
        for b in range(B):
            tau, nxt = _verify_reference(p[b], q[b], toks[b], ua[b], us[b], v)
            assert (out.accepted[b], out.next_token[b]) == (tau, nxt), (v.name, b)


def test_verify_chain_never_samples_zero_probability_tokens():
    V = 5
    p = np.zeros((1000, 2, V))
    p[..., 3] = 1.0
    q = np.full((1000, 1, V), 1.0 / V)
    out = verify_chain(p, q, np.zeros((1000, 1), int), np.random.default_rng(0).random((1000, 1)),
                       np.linspace(0, 1, 1000, endpoint=False), rules.vanilla())
    assert np.all(out.next_token == 3) and np.all(out.accepted == 0)


def test_verify_chain_shape_errors():
    with pytest.raises(ValueError, match="L\\+1"):
        verify_chain(np.ones((3, 5)) / 5, np.ones((3, 5)) / 5, np.zeros(3, int), np.zeros(3), np.zeros(()),
                     rules.vanilla())


# ------------------------------------------------------------------------------------- bad input

def _good():
    P, Q = chains.random_pair(4, seed=0)
    F, G = markov.rule_tables(P, Q, 2, rules.cool_sd(1.5))
    return P, Q, F, G


@pytest.mark.parametrize("mutate, match", [
    (lambda P, Q, F, G: (P * 1.1, Q, F, G), "P is not row-stochastic.*tolerance"),
    (lambda P, Q, F, G: (P, np.where(Q > 0.2, np.nan, Q), F, G), "Q contains NaN"),
    (lambda P, Q, F, G: (P - 0.1 * (P == P.max()), Q, F, G), "negative|row-stochastic"),
    (lambda P, Q, F, G: (P[:3, :3], Q, F, G), "square|same shape"),
    (lambda P, Q, F, G: (P, Q[:, :3], F, G), "same shape"),
    (lambda P, Q, F, G: (P, Q, F[:, :3], G), "F must have shape"),
    (lambda P, Q, F, G: (P, Q, F * 2, G), "F must lie in \\[0, 1\\]"),
    (lambda P, Q, F, G: (P, Q, F, G[:1]), "G must have the same shape"),
    (lambda P, Q, F, G: (P, Q, F, G * 0.5), "G is not row-stochastic"),
    (lambda P, Q, F, G: (P, Q, F[:0], G[:0]), "L >= 1"),
])
def test_bad_input_gives_clear_errors(mutate, match):
    P, Q, F, G = mutate(*_good())
    with pytest.raises(ValueError, match=match):
        markov.tv_bound(P, Q, F, G, 0)


def test_bad_init_and_L():
    P, Q, F, G = _good()
    with pytest.raises(ValueError, match="init state 9 is out of range"):
        markov.expected_accepted(P, Q, F, 9)
    with pytest.raises(ValueError, match="init must be"):
        markov.expected_accepted(P, Q, F, np.ones(3) / 3)
    with pytest.raises(ValueError, match="init is not row-stochastic"):
        markov.expected_accepted(P, Q, F, np.ones(4))
    with pytest.raises(ValueError, match="L must be an integer >= 1"):
        markov.rule_tables(P, Q, 0, rules.vanilla())
    with pytest.raises(ValueError, match="exactly one of delta"):
        rules.Lantern(np.zeros((4, 3), int), 2)
    with pytest.raises(ValueError, match="k must be in"):
        rules.Lantern(rules.lantern_neighbors(np.arange(4.0)[:, None]), 5, delta=0.1)
    with pytest.raises(ValueError, match="got the bool"):
        markov.expected_accepted(P, Q, F, True)
    for eps, alpha in ((-1.0, 0.3), (0.09, float("nan")), (float("inf"), 0.3)):
        with pytest.raises(ValueError, match="typical acceptance needs finite eps >= 0 and alpha >= 0"):
            rules.typical(eps, alpha)


def test_lantern_on_a_hand_made_codebook():
    """Section 6 by hand: codes on a line at 0, 1, 2, 4, so token 0's neighbours are 1, 2, 3 in order."""
    nb = rules.lantern_neighbors(np.array([[0.0], [1.0], [2.0], [4.0]]))
    assert nb[0].tolist() == [1, 2, 3] and nb[3].tolist() == [2, 1, 0] and nb[1].tolist()[0] in (0, 2)
    p = np.array([0.375, 0.25, 0.25, 0.125])       # exact binary fractions: ties at the threshold are exact
    q = np.array([0.5, 0.25, 0.125, 0.125])
    # absolute delta = 0.5: cumulative neighbour mass 0.25, 0.5, 0.625 -> admit {1, 2} (0.5 <= 0.5)
    assert rules.Lantern(nb, 3, delta=0.5).aggregated(p)[0] == 0.875
    assert rules.Lantern(nb, 3, delta=0.5)(p, q, 1)[0] == 1.0            # min(1, 0.875 / 0.5)
    assert rules.Lantern(nb, 1, delta=0.5).aggregated(p)[0] == 0.625     # k = 1: only token 1 considered
    # relative lambda = 2: threshold (2 - 1) * 0.375 -> admit {1} only (0.5 > 0.375)
    assert rules.Lantern(nb, 3, lam=2.0).aggregated(p)[0] == 0.625
    assert rules.Lantern(nb, 3, lam=2.0)(p, q, 1)[2] == 1.0
    assert rules.Lantern(nb, 3, delta=0.0).aggregated(p).tolist() == p.tolist()  # delta = 0 is vanilla
    # our renormalised resampler after rejecting token 3 with k = 1: zero {3} and its 2 nearest {2, 1}
    g = rules.LanternResample(nb, 1, "p", "renormalised")(p, q, None, rejected=np.int64(3))
    assert g.tolist() == [1.0, 0.0, 0.0, 0.0]
    # nothing left -> uniform
    g = rules.LanternResample(nb, 2, "p", "renormalised")(np.array([0, 0.5, 0.5, 0]), q, None, rejected=np.int64(3))
    assert g.tolist() == [0.25] * 4


def test_lantern_resample_with_a_scalar_rejected_token_on_every_backend():
    torch = pytest.importorskip("torch")
    nb = rules.lantern_neighbors(np.array([[0.0], [1.0], [2.0], [4.0]]))
    p = np.array([0.375, 0.25, 0.25, 0.125])
    q = np.array([0.5, 0.25, 0.125, 0.125])
    for variant, law in itertools.product("pq", ("released", "renormalised")):
        r = rules.LanternResample(nb, 1, variant, law, rules.Lantern(nb, 1, lam=2.0))
        ref = r(p, q, None, rejected=np.int64(3))
        got = r(torch.as_tensor(p), torch.as_tensor(q), None, rejected=torch.tensor(3))
        assert tuple(got.shape) == (4,) and np.allclose(got.numpy(), ref)
