"""Theorem 1, Theorem 2 (a)-(c), Proposition 1 and the closed forms, checked with hypothesis against the
independent brute-force enumeration in tests/bruteforce.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bruteforce as bf
from strategies import chain_case, random_tables
from theory.markov import chains
from theory import markov, rules

TOL = 1e-10
SETTINGS = settings(max_examples=60, deadline=None)


_brute = bf.theory_by_enumeration      # (E[tau], B, exact TV averaged over start states) by enumeration


def check_against_enumeration(P, Q, F, G, rule, L, init):
    """E[tau] (T8), B (T9) and exact TV (T3) of the tables (F, G) equal the enumeration of the algorithm run
    with ``rule`` (a tests/bruteforce.py rule); TV <= B (Theorem 2(b)), with equality at L = 1. Returns B."""
    e, b, t = _brute(P, Q, rule, L, init)
    assert abs(markov.expected_accepted(P, Q, F, init) - e) < TOL
    assert abs(markov.tv_bound(P, Q, F, G, init) - b) < TOL
    assert abs(markov.exact_tv(P, Q, F, G, init) - t) < TOL
    acc, terms = markov.round_terms(P, Q, F, G, init)    # the one-pass pair (T8, T9)
    assert abs(acc.sum() - e) < TOL and abs(terms.sum() - b) < TOL
    assert t <= b + TOL
    if L == 1:
        assert abs(b - t) < TOL
    return b


@SETTINGS
@given(chain_case(max_V=6, max_L=4))
def test_contract_functions_match_bruteforce_on_random_tables(case):
    P, Q, L, init, rng = case
    F, G = random_tables(rng, L, len(P))
    check_against_enumeration(P, Q, F, G, bf.TableRule(F, G), L, init)   # incl. Theorem 2(b): TV <= B, = at L = 1


@SETTINGS
@given(chain_case(max_V=5, max_L=4))
def test_acceptance_probs_are_tail_probabilities(case):
    P, Q, L, init, rng = case
    F, _ = random_tables(rng, L, len(P))
    pr = markov.acceptance_probs(P, Q, F, init)
    # brute force: Pr(tau >= i) from the E[tau] of truncated rounds, E_i - E_{i-1}
    e_prev = 0.0
    for i in range(1, L + 1):
        e_i, _, _ = _brute(P, Q, bf.TableRule(F[:i], F[:i] * 0 + 1.0 / len(P)), i, init)
        assert abs(pr[i - 1] - (e_i - e_prev)) < TOL
        e_prev = e_i
    assert np.all(np.diff(pr) <= TOL)


@SETTINGS
@given(chain_case(max_V=5, max_L=3))
def test_theorem1_vanilla_is_exact(case):
    P, Q, L, init, _ = case
    v = rules.vanilla()
    F, G = markov.rule_tables(P, Q, L, v)
    assert abs(markov.tv_bound(P, Q, F, G, init)) < TOL
    assert abs(markov.exact_tv(P, Q, F, G, init)) < TOL
    # the algorithm itself (brute force with scalar vanilla rules) reproduces P exactly
    ref = bf.RowRule(lambda i, p, q: bf.scaled_f(1.0, p, q),
                     lambda p, q, f, r: bf.optimal_g_rows(p, q, [1.0] * len(p)))
    _, b, t = _brute(P, Q, ref, L, init)
    assert t < TOL and b < TOL


@SETTINGS
@given(chain_case(max_V=5, max_L=3), st.integers(0, 10**6))
def test_optimal_resampling_minimises_the_bound(case, seed):
    P, Q, L, init, rng = case
    F, G = random_tables(rng, L, len(P))
    Gs = markov.optimal_resampling(P, Q, F)
    # independent G* (T5) by loops
    for i in range(L):
        for s in range(len(P)):
            assert np.allclose(Gs[i, s], bf.optimal_g_rows(P[s], Q[s], F[i, s]), atol=TOL, rtol=0)
    b_star = markov.bound_terms(P, Q, F, Gs, init)
    rng2 = np.random.default_rng(seed)
    for _ in range(5):
        _, Gr = random_tables(rng2, L, len(P))
        assert np.all(markov.bound_terms(P, Q, F, Gr, init) >= b_star - TOL)
    # T6: with G*, D_i = sum [Q f - P]_+
    d = rules.discrepancy(P, Q, F, Gs)
    assert np.allclose(d, np.clip(Q * F - P, 0, None).sum(-1), atol=TOL, rtol=0)


def test_g_star_beats_a_perturbed_g_star_strictly():
    P, Q = chains.random_pair(5, tv=0.4, seed=3)
    F = np.full((2, 5, 5), 1.0)  # accept everything: the residual matters wherever beta < 1... here beta = 1
    F[:, :, ::2] = 0.3           # reject part of the mass so G is used
    Gs = markov.optimal_resampling(P, Q, F)
    Gp = 0.9 * Gs + 0.1 / 5
    assert markov.tv_bound(P, Q, F, Gp, 0) > markov.tv_bound(P, Q, F, Gs, 0) + 1e-4


def _tv_within_bound(P, Q, rule_true, tables_claimed, L, s):
    """The check used above, as a function: does the algorithm's TV stay below the claimed B?"""
    law, _ = bf.algorithm_law(P, Q, rule_true, L, s)
    t = bf.tv(law, bf.target_law(P, L, s))
    return t <= markov.tv_bound(P, Q, *tables_claimed, s) + TOL


def test_negative_control_wrong_resampler_breaks_the_bound_check():
    """Vanilla acceptance with G = P (a plausible bug) is lossy; a B computed for the intended
    residual G^van is 0, so the TV <= B check must fail. A check that cannot fail would pass."""
    P, Q = chains.random_pair(4, tv=0.5, seed=7)
    L = 2
    F, Gvan = markov.rule_tables(P, Q, L, rules.vanilla())
    buggy = bf.TableRule(F, np.broadcast_to(P, (L, 4, 4)))
    assert not _tv_within_bound(P, Q, buggy, (F, Gvan), L, 0)
    assert _tv_within_bound(P, Q, bf.TableRule(F, Gvan), (F, Gvan), L, 0)


@SETTINGS
@given(chain_case(max_V=6, max_L=3), st.floats(1.0, 5.0))
def test_proposition1_relaxed_acceptance_keeps_vanilla_residual(case, w):
    P, Q, L, _, rng = case
    f_van = markov.rule_tables(P, Q, L, rules.vanilla())[0]
    # any f >= f_van: blend towards 1 and relax by a scale w >= 1
    F = np.minimum(1.0, np.maximum(f_van, rng.random(f_van.shape)))
    G_star = markov.optimal_resampling(P, Q, F)
    G_van = rules.Residual()(P, Q, None)
    assert np.allclose(G_star, G_van[None], atol=TOL, rtol=0)
    Fw, Gw = markov.rule_tables(P, Q, L, rules.uniform_rsd(w))
    assert np.allclose(Gw, G_van[None], atol=TOL, rtol=0)


@given(st.integers(2, 8), st.one_of(st.just(0.0), st.floats(1e-3, 0.95)), st.integers(1, 8), st.integers(0, 10**6))
@settings(max_examples=40, deadline=None)
def test_context_free_vanilla_closed_form(V, frac, L, seed):
    p = chains.dirichlet_rows(V, 1.0, seed, n_rows=1)
    tv = frac * (1 - p.min())  # the largest TV reachable from p is 1 - min p
    q = chains.with_row_tv(p, tv, seed)
    P, Q = np.repeat(p, V, 0), np.repeat(q, V, 0)
    F, _ = markov.rule_tables(P, Q, L, rules.vanilla())
    alpha = np.minimum(P[0], Q[0]).sum()
    assert abs(alpha - (1 - tv)) < 1e-9  # the generator hits the requested TV
    if tv < 1e-3:
        return
    closed = alpha * (1 - alpha**L) / (1 - alpha)
    assert abs(markov.expected_accepted(P, Q, F, 0) - closed) < TOL
    assert abs(markov.context_free_vanilla(p[0], q[0], L) - closed) < TOL


@SETTINGS
@given(chain_case(max_V=6, max_L=5, max_seq=10**7),
       st.lists(st.floats(0.2, 4.0), min_size=5, max_size=5), st.integers(0, 4), st.floats(1.01, 3.0))
def test_expected_accepted_is_monotone_in_every_weight(case, w, pos, factor):
    P, Q, L, init, _ = case
    w = w[:L]
    pos = pos % L
    w2 = list(w)
    w2[pos] *= factor
    e1 = markov.expected_accepted(P, Q, markov.rule_tables(P, Q, L, rules.scaled(rules.Explicit(w)))[0], init)
    e2 = markov.expected_accepted(P, Q, markov.rule_tables(P, Q, L, rules.scaled(rules.Explicit(w2)))[0], init)
    assert e2 >= e1 - TOL


@SETTINGS
@given(chain_case(max_V=5, max_L=3), st.integers(1, 3), st.sampled_from(["lantern", "lantern++"]),
       st.floats(0.0, 0.5), st.floats(1.0, 3.0), st.sampled_from(["lantern", "renormalised"]))
def test_lantern_tables_match_the_algorithm_with_rejected_token_resampling(case, k, kind, delta, lam, resample):
    """LANTERN's resampler depends on the rejected token; the theory uses its effective law (section 6).
    The brute force runs the real algorithm (G given the rejected token) and must agree, for the released
    laws (neighbours removed only when one was admitted) and our renormalised variants."""
    P, Q, L, init, rng = case
    V = len(P)
    k = min(k, V - 2) if V > 2 else None
    if k is None or k < 1:
        return
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    variant = "p" if kind == "lantern" else "q"
    kw = {"delta": delta} if kind == "lantern" else {"lam": lam}
    v = (rules.lantern(nb, k, delta, resample) if kind == "lantern" else rules.lantern_pp(nb, k, lam, resample))
    if resample == "lantern":
        g_ref = lambda p, q, f, r: bf.lantern_g_released(p, q, nb, k, r, variant, **kw)
    else:
        g_ref = lambda p, q, f, r: bf.lantern_g(p, q, nb, k, r, variant)
    ref = bf.RowRule(lambda i, p, q: bf.scaled_f(1.0, bf.lantern_ptilde(p, nb, k, **kw), q), g_ref)
    F, G = markov.rule_tables(P, Q, L, v)
    e, b, t = _brute(P, Q, ref, L, init)
    assert abs(markov.expected_accepted(P, Q, F, init) - e) < TOL
    assert abs(markov.tv_bound(P, Q, F, G, init) - b) < TOL
    assert abs(markov.exact_tv(P, Q, F, G, init) - t) < TOL


def test_sequence_laws_sum_to_one_and_vanilla_equals_target():
    P, Q = chains.random_pair(4, tv=0.3, seed=1)
    F, G = markov.rule_tables(P, Q, 2, rules.cool_sd(2.0))
    ph, pt = markov.sequence_laws(P, Q, F, G, np.full(4, 0.25))
    assert ph.shape == (4, 4, 4) and abs(ph.sum() - 1) < TOL and abs(pt.sum() - 1) < TOL and ph.min() >= -TOL
    F, G = markov.rule_tables(P, Q, 2, rules.vanilla())
    ph, pt = markov.sequence_laws(P, Q, F, G, 2)
    assert np.abs(ph - pt).max() < TOL


def test_exact_tv_refuses_too_many_sequences_and_names_the_size():
    P, Q = chains.random_pair(10, seed=0)
    F, G = markov.rule_tables(P, Q, 6, rules.vanilla())
    with pytest.raises(ValueError, match=r"10\^7.*max_sequences"):
        markov.exact_tv(P, Q, F, G, 0, max_sequences=10**6)
    assert markov.exact_tv(P, Q, F, G, 0, max_sequences=10**7) < TOL
