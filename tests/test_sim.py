"""The round simulator (sim.rounds): alias tables, mean tau against the exact E[tau], the law of x_{1:L+1}
against an independent brute-force law (tests/bruteforce.py), table path = rule path, the negative
control, LANTERN on a hand-made codebook, determinism and bad input.

Statistical tests use fixed seeds; each states its standard error. The chi-square helper below is
written here with scipy (independent of sim.stats)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sst

import bruteforce as bf
import sim
from sim.alias import alias_draw, alias_table
from strategies import _rows, chain_case
from theory.markov import chains
from theory import markov, rules

Z_MAX = 4.0          # |z| allowed for means (two-sided false alarm ~6e-5 per check)
ALPHA = 1e-3         # chi-square level


# ----------------------------------------------------------------------------------- helpers

def exact_tau_se(P, Q, v, L, init, n):
    """E[tau] and the SE of a mean of n rounds, from Pr(tau >= i) (T8): Var = sum (2i-1) Pr - E^2."""
    F, _ = markov.rule_tables(P, Q, L, v)
    pr = markov.acceptance_probs(P, Q, F, init)
    m = pr.sum()
    var = ((2 * np.arange(1, L + 1) - 1) * pr).sum() - m * m
    return m, math.sqrt(var / n)


def brute_law(P, Q, rule, L, init):
    """Exact law of (start, x_{1:L+1}) as a dense array (V,)*(L+2), by brute-force enumeration."""
    V = len(P)
    mu = np.zeros(V)
    if isinstance(init, int):
        mu[init] = 1
    else:
        mu[:] = init
    out = np.zeros((V,) * (L + 2))
    for s in np.flatnonzero(mu > 0):
        law, _ = bf.algorithm_law(P, Q, rule, L, s)
        for seq, pr in law.items():
            out[(s, *seq)] += mu[s] * pr
    return out


def chisq_p(tokens_with_start, law, min_expected=5.0):
    """Pearson chi-square p-value of observed sequences against a law, pooling cells with expected < 5.
    An observed sequence of probability 0 gives p = 0."""
    V = law.shape[0]
    idx = np.ravel_multi_index(tokens_with_start.T, law.shape)
    counts = np.bincount(idx, minlength=law.size).astype(float)
    p = law.ravel()
    n = counts.sum()
    if counts[p <= 1e-15].sum() > 0:
        return 0.0
    e = n * p
    big = e >= min_expected
    obs = list(counts[big]) + ([counts[~big & (p > 0)].sum()] if (~big & (p > 0)).any() else [])
    exp = list(e[big]) + ([e[~big & (p > 0)].sum()] if (~big & (p > 0)).any() else [])
    obs, exp = np.array(obs), np.array(exp)
    exp *= obs.sum() / exp.sum()
    return float(sst.chisquare(obs, exp).pvalue) if len(obs) > 1 else 1.0


def table_rule(P, Q, L, v):
    F, G = markov.rule_tables(P, Q, L, v)
    return F, G, bf.TableRule(F, G)


def with_start(res):
    return np.column_stack([res.start, res.tokens])


def _neighbors(V, seed=3):
    return rules.lantern_neighbors(np.random.default_rng(seed).normal(size=(V, 2)))


# ----------------------------------------------------------------------------------- alias tables

@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.sampled_from([0.0, 0.3, 0.7]), st.integers(0, 10**6))
def test_alias_tables_reproduce_every_row_exactly(V, zero_prob, seed):
    rng = np.random.default_rng(seed)
    w = _rows(rng, V, 7, zero_prob) * rng.uniform(0.5, 3.0, size=(7, 1))  # unnormalised rows too
    prob, alias = alias_table(w)
    law = np.zeros_like(w)
    for r in range(w.shape[0]):  # independent reconstruction: column j keeps prob[j], else gives alias[j]
        for j in range(V):
            law[r, j] += prob[r, j] / V
            law[r, alias[r, j]] += (1 - prob[r, j]) / V
    assert np.allclose(law, w / w.sum(1, keepdims=True), atol=1e-12, rtol=0)
    # zero-mass tokens are never drawn: over a fine grid of uniforms, no draw lands on them
    u = (np.arange(20_000) + 0.5) / 20_000
    for r in range(w.shape[0]):
        x = alias_draw(prob[r], alias[r], np.zeros(u.size, np.int64), u, V)
        assert np.all(w[r, x] > 0)


def test_alias_table_rejects_bad_rows():
    with pytest.raises(ValueError, match="non-negative with positive sums"):
        alias_table(np.array([[0.5, -0.1, 0.6]]))
    with pytest.raises(ValueError, match="positive sums"):
        alias_table(np.zeros((2, 3)))


# ----------------------------------------------------------------------------------- mean tau

N_TAU = 20_000


@pytest.mark.parametrize("backend", ["numpy", "jax", "rule"])
def test_mean_tau_matches_exact_expectation_for_several_rules(backend):
    if backend == "jax":
        pytest.importorskip("jax")
    V, L = 6, 4
    P, Q = chains.ambiguous_pair(V, spread=0.5, tv=0.4, seed=2)
    nb = _neighbors(V)
    init = np.full(V, 1 / V)
    for j, v in enumerate([rules.vanilla(), rules.cool_sd(2.5), rules.uniform_rsd(1.5), rules.lantern(nb, 2, 0.2),
                           rules.lantern_pp(nb, 2, 2.0), rules.lantern(nb, 2, 0.2, "optimal"), rules.typical()]):
        e, se = exact_tau_se(P, Q, v, L, init, N_TAU)       # se ~ 0.007-0.01 here
        if backend == "rule":
            res = sim.simulate_rule(P, Q, v, L, init, N_TAU, seed=j)
        else:
            F, G = markov.rule_tables(P, Q, L, v)
            res = sim.simulate(P, Q, F, G, init, N_TAU, seed=j, backend=backend)
        assert res.accepted.shape == (N_TAU,) and res.tokens.shape == (N_TAU, L + 1)
        assert abs(res.accepted.mean() - e) <= Z_MAX * se, (v.name, res.accepted.mean(), e, se)


def test_mean_tau_context_free_closed_form():
    """Independent check of E[tau] without the theory engine: alpha (1 - alpha^L) / (1 - alpha)."""
    P, Q = chains.iid_pair(5, tv=0.35, seed=4)
    L, n = 5, 40_000
    alpha = 1 - 0.35
    e = alpha * (1 - alpha**L) / (1 - alpha)
    F, G = markov.rule_tables(P, Q, L, rules.vanilla())
    tau = sim.simulate(P, Q, F, G, 0, n, seed=1).accepted
    se = tau.std() / math.sqrt(n)                          # ~0.008
    assert abs(tau.mean() - e) <= Z_MAX * se
    # tau is geometric-like: Pr(tau >= i) = alpha^i
    for i in range(1, L + 1):
        pr = (tau >= i).mean()
        assert abs(pr - alpha**i) <= Z_MAX * math.sqrt(alpha**i * (1 - alpha**i) / n)


# ----------------------------------------------------------------------------------- laws

N_LAW = 60_000


def test_vanilla_passes_chi_square_against_P_and_biased_resampler_fails():
    """Theorem 1 by simulation; the negative control (vanilla acceptance, G = P) must be detected."""
    V, L = 4, 2
    P, Q = chains.random_pair(V, tv=0.5, seed=1)
    init = np.array([0.1, 0.2, 0.3, 0.4])
    target = brute_law(P, P, bf.TableRule(np.ones((L, V, V)), np.ones((L, V, V)) / V), L, init)  # Q = P, f = 1: the target
    F, G = markov.rule_tables(P, Q, L, rules.vanilla())
    good = sim.simulate(P, Q, F, G, init, N_LAW, seed=5)
    assert chisq_p(with_start(good), target) >= ALPHA
    Gbad = np.broadcast_to(P, (L, V, V))
    biased = sim.simulate(P, Q, F, Gbad, init, N_LAW, seed=5)
    # the biased law, by brute force, is far enough from P for this n: noncentrality n * chi2-distance
    bad_law = brute_law(P, Q, bf.TableRule(F, Gbad), L, init)
    lam = N_LAW * ((bad_law - target) ** 2 / np.where(target > 0, target, 1)).sum()
    assert lam > 200, lam                                  # power ~ 1 at df < 64
    assert chisq_p(with_start(biased), target) < ALPHA
    # ... while it does follow its own (biased) law
    assert chisq_p(with_start(biased), bad_law) >= ALPHA
    # the same on the rule path
    bad_rule = rules.Verifier(rules.Vanilla(), rules.Target(), "neg")
    assert chisq_p(with_start(sim.simulate_rule(P, Q, rules.vanilla(), L, init, N_LAW, seed=6)), target) >= ALPHA
    assert chisq_p(with_start(sim.simulate_rule(P, Q, bad_rule, L, init, N_LAW, seed=6)), target) < ALPHA


@pytest.mark.parametrize("name", ["cool-sd", "uniform-rsd", "lantern", "lantern++", "typical"])
def test_both_paths_follow_the_brute_force_law(name):
    """x_{1:L+1} (with the start state) from the table path and from the rule path (LANTERN's resampler
    seeing the rejected token) against the brute-force law of the algorithm itself."""
    V, L = 4, 2
    P, Q = chains.ambiguous_pair(V, spread=0.8, tv=0.45, seed=7)
    nb = _neighbors(V, 5)
    init = np.full(V, 0.25)
    v = {"cool-sd": rules.cool_sd(2.0), "uniform-rsd": rules.uniform_rsd(1.7), "lantern": rules.lantern(nb, 1, 0.2),
         "lantern++": rules.lantern_pp(nb, 1, 2.0), "typical": rules.typical(0.3, 0.3)}[name]
    if name.startswith("lantern"):
        variant = "p" if name == "lantern" else "q"
        kw = {"delta": 0.2} if name == "lantern" else {"lam": 2.0}
        ref = bf.RowRule(lambda i, p, q: bf.scaled_f(1.0, bf.lantern_ptilde(p, nb, 1, **kw), q),
                         lambda p, q, f, r: bf.lantern_g_released(p, q, nb, 1, r, variant, **kw))
    else:
        F, G = markov.rule_tables(P, Q, L, v)
        ref = bf.TableRule(F, G)
    law = brute_law(P, Q, ref, L, init)
    F, G = markov.rule_tables(P, Q, L, v)
    assert chisq_p(with_start(sim.simulate(P, Q, F, G, init, N_LAW, seed=11)), law) >= ALPHA
    assert chisq_p(with_start(sim.simulate_rule(P, Q, v, L, init, N_LAW, seed=12)), law) >= ALPHA
    # the two paths against each other (two-sample chi-square on the joint law)
    a = np.ravel_multi_index(with_start(sim.simulate(P, Q, F, G, init, N_LAW, seed=13)).T, law.shape)
    b = np.ravel_multi_index(with_start(sim.simulate_rule(P, Q, v, L, init, N_LAW, seed=14)).T, law.shape)
    ca, cb = np.bincount(a, minlength=law.size), np.bincount(b, minlength=law.size)
    keep = (ca + cb) >= 10
    assert sst.chi2_contingency(np.stack([ca[keep], cb[keep]])).pvalue >= ALPHA


def test_jax_backend_follows_the_exact_law():
    pytest.importorskip("jax")
    V, L = 4, 3
    P, Q = chains.random_pair(V, tv=0.4, seed=8)
    v = rules.cool_sd(3.0)
    F, G = markov.rule_tables(P, Q, L, v)
    law = brute_law(P, Q, bf.TableRule(F, G), L, 1)
    res = sim.simulate(P, Q, F, G, 1, N_LAW, seed=3, backend="jax")
    assert np.all(res.start == 1)
    assert chisq_p(with_start(res), law) >= ALPHA


def test_start_state_is_drawn_from_init_and_recorded():
    P, Q = chains.random_pair(5, tv=0.3, seed=0)
    F, G = markov.rule_tables(P, Q, 2, rules.vanilla())
    mu = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    for backend in ("numpy", "jax"):
        if backend == "jax":
            pytest.importorskip("jax")
        s = sim.simulate(P, Q, F, G, mu, 50_000, seed=2, backend=backend).start
        c = np.bincount(s, minlength=5)
        assert c[0] == 0
        assert sst.chisquare(c[1:], 50_000 * mu[1:]).pvalue >= ALPHA
    s = sim.simulate_rule(P, Q, rules.vanilla(), 2, mu, 20_000, seed=2).start
    assert np.bincount(s, minlength=5)[0] == 0 and sst.chisquare(np.bincount(s)[1:], 20_000 * mu[1:]).pvalue >= ALPHA


# ----------------------------------------------------------------------------------- edge cases

def test_edge_cases_f_one_f_zero_and_zero_probabilities():
    V, L, n = 5, 3, 5_000
    P, Q = chains.random_pair(V, tv=0.4, seed=9)
    P[:, 0] = 0.0                                  # token 0 impossible under P
    P /= P.sum(1, keepdims=True)
    G = np.broadcast_to(P, (L, V, V)).copy()
    for backend in ("numpy", "jax"):
        if backend == "jax":
            pytest.importorskip("jax")
        # f = 1: every draft accepted, tokens 1..L are the drafts, x_{L+1} from P
        r = sim.simulate(P, Q, np.ones((L, V, V)), G, 2, n, seed=1, backend=backend)
        assert np.all(r.accepted == L) and np.array_equal(r.tokens[:, :L], r.drafts)
        assert np.all(r.tokens[:, L] != 0)
        # f = 0: tau = 0 always; x_1 from G_1(.|2) = P(.|2), never token 0 and never a later token 0
        r = sim.simulate(P, Q, np.zeros((L, V, V)), G, 2, n, seed=1, backend=backend)
        assert np.all(r.accepted == 0) and np.all(r.tokens != 0)
        assert np.all(r.drafts[:, 1:] == -1) and np.all(r.drafts[:, 0] >= 0)
    # Q = P under vanilla: beta = 1 (G never used), tau = L in every round
    F, Gv = markov.rule_tables(P, P, L, rules.vanilla())
    assert np.all(sim.simulate(P, P, F, Gv, 0, n, seed=0).accepted == L)
    assert np.all(sim.simulate_rule(P, P, rules.vanilla(), L, 0, n, seed=0).accepted == L)


def test_deterministic_chain_is_followed_exactly():
    """P a permutation (each state has one successor): every output token is forced."""
    V, L = 6, 4
    perm = np.array([3, 0, 5, 1, 2, 4])
    P = np.eye(V)[perm]
    Q = np.full((V, V), 1 / V)
    for v in (rules.vanilla(), rules.cool_sd(2.0)):
        F, G = markov.rule_tables(P, Q, L, v)
        for res in (sim.simulate(P, Q, F, G, 2, 2000, seed=1), sim.simulate_rule(P, Q, v, L, 2, 2000, seed=1)):
            expect = [perm[2]]
            for _ in range(L):
                expect.append(perm[expect[-1]])
            assert np.all(res.tokens == np.array(expect))


def test_recorded_drafts_are_consistent_with_tokens():
    P, Q = chains.random_pair(6, tv=0.5, seed=3)
    L = 4
    v = rules.uniform_rsd(1.3)
    F, G = markov.rule_tables(P, Q, L, v)
    for res in (sim.simulate(P, Q, F, G, 0, 3000, seed=4), sim.simulate_rule(P, Q, v, L, 0, 3000, seed=4)):
        pos = np.arange(L)
        acc = pos < res.accepted[:, None]
        assert np.array_equal(res.tokens[:, :L][acc], res.drafts[acc])   # accepted drafts are output
        assert np.all(res.drafts[pos <= res.accepted[:, None]] >= 0)     # drafted up to the rejection
    # the table path drafts lazily: nothing after the rejected position
    res = sim.simulate(P, Q, F, G, 0, 3000, seed=4)
    assert np.all(res.drafts[np.arange(L) > res.accepted[:, None]] == -1)


# ----------------------------------------------------------------------------------- LANTERN by hand

def test_lantern_hand_made_codebook_in_the_simulator():
    """Codes on a line at 0, 1, 2, 4 (neighbours of token 0: 1, 2, 3). Context-free rows (exact binary
    fractions) p = (3/8, 1/4, 1/4, 1/8), q = (1/2, 1/4, 1/8, 1/8), delta = 0.2, k = 1, L = 1:
    only token 0 has q > p; its neighbour 1 has mass 1/4 > delta, so p~(0) = 3/8 and f(0) = 3/4;
    every other token has f = 1. Hence Pr(tau = 1) = 1/2 * 3/4 + 1/2 = 7/8.
    After rejecting 0, our renormalised variant zeroes p on {0} and its k+1 = 2 nearest {1, 2}: the token
    is 3 (the release zeroes only {0} here, no neighbour being admitted: tests/test_baselines.py).
    G* = Norm([p - q f]_+) = Norm((0, 0, 1/8, 0)): the token is 2. With k = 2 the zeroed set is every
    token: the renormalised variant falls back to uniform."""
    nb = rules.lantern_neighbors(np.array([[0.0], [1.0], [2.0], [4.0]]))
    p = np.array([0.375, 0.25, 0.25, 0.125])
    q = np.array([0.5, 0.25, 0.125, 0.125])
    P, Q = np.tile(p, (4, 1)), np.tile(q, (4, 1))
    n = 40_000
    se = math.sqrt(7 / 8 * 1 / 8 / n)                                    # ~0.0017
    for v, token in ((rules.lantern(nb, 1, 0.2, "renormalised"), 3), (rules.lantern(nb, 1, 0.2, resample="optimal"), 2)):
        for res in (sim.simulate_rule(P, Q, v, 1, 0, n, seed=1),
                    sim.simulate(P, Q, *markov.rule_tables(P, Q, 1, v), 0, n, seed=1)):
            assert abs(res.accepted.mean() - 7 / 8) <= Z_MAX * se
            rej = res.accepted == 0
            assert np.all(res.drafts[rej, 0] == 0)                        # only token 0 is ever rejected
            assert np.all(res.tokens[rej, 0] == token)
    res = sim.simulate_rule(P, Q, rules.lantern(nb, 2, 0.2, "renormalised"), 1, 0, n, seed=2)
    x = res.tokens[res.accepted == 0, 0]
    assert sst.chisquare(np.bincount(x, minlength=4)).pvalue >= ALPHA   # uniform fallback
    assert len(set(x.tolist())) == 4


# ----------------------------------------------------------------------------------- determinism

def test_same_seed_same_output_and_different_seed_differs():
    P, Q = chains.random_pair(7, tv=0.4, seed=5)
    L = 3
    v = rules.lantern(_neighbors(7), 2, 0.3)
    F, G = markov.rule_tables(P, Q, L, v)
    mu = np.full(7, 1 / 7)
    runs = {"numpy": lambda s: sim.simulate(P, Q, F, G, mu, 5000, s),
            "rule": lambda s: sim.simulate_rule(P, Q, v, L, mu, 5000, s, chunk=777)}
    try:
        import jax  # noqa: F401

        runs["jax"] = lambda s: sim.simulate(P, Q, F, G, mu, 5000, s, backend="jax")
    except ImportError:
        pass
    for name, run in runs.items():
        a, b, c = run(3), run(3), run(4)
        for field in ("accepted", "tokens", "start", "drafts"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), (name, field)
        assert not np.array_equal(a.tokens, c.tokens), name
    # the rule path's chunking does not change the output (the random stream is consumed round by round)
    a = sim.simulate_rule(P, Q, v, L, mu, 5000, 3, chunk=777)
    b = sim.simulate_rule(P, Q, v, L, mu, 5000, 3, chunk=5000)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.accepted, b.accepted)


def test_jax_output_does_not_depend_on_x64_mode():
    jax = pytest.importorskip("jax")
    P, Q = chains.random_pair(6, tv=0.4, seed=0)
    F, G = markov.rule_tables(P, Q, 3, rules.cool_sd(2.0))
    before = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", False)
        a = sim.simulate(P, Q, F, G, np.full(6, 1 / 6), 3000, 3, backend="jax")
        jax.config.update("jax_enable_x64", True)
        b = sim.simulate(P, Q, F, G, np.full(6, 1 / 6), 3000, 3, backend="jax")
    finally:
        jax.config.update("jax_enable_x64", before)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.accepted, b.accepted)


# ----------------------------------------------------------------------------------- bad input

def _good(V=4, L=2):
    P, Q = chains.random_pair(V, seed=0)
    F, G = markov.rule_tables(P, Q, L, rules.cool_sd(1.5))
    return P, Q, F, G


@pytest.mark.parametrize("n, match", [(0, "n_rounds must be an integer >= 1"), (-3, "n_rounds"),
                                      (2.5, "n_rounds"), (True, "n_rounds"), (None, "n_rounds")])
def test_bad_round_counts(n, match):
    P, Q, F, G = _good()
    with pytest.raises(ValueError, match=match):
        sim.simulate(P, Q, F, G, 0, n, 0)
    with pytest.raises(ValueError, match=match):
        sim.simulate_rule(P, Q, rules.vanilla(), 2, 0, n, 0)


@pytest.mark.parametrize("mutate, match", [
    (lambda P, Q, F, G: (P * 1.1, Q, F, G), "P is not row-stochastic"),
    (lambda P, Q, F, G: (P, Q + 0.05, F, G), "Q is not row-stochastic"),
    (lambda P, Q, F, G: (np.where(P > 0.3, np.nan, P), Q, F, G), "P contains NaN"),
    (lambda P, Q, F, G: (P[:3], Q, F, G), "square"),
    (lambda P, Q, F, G: (P, Q[:, :3], F, G), "same shape"),
    (lambda P, Q, F, G: (P, Q, F[:, :3], G), "F must have shape"),
    (lambda P, Q, F, G: (P, Q, F, G[:1]), "G must have the same shape"),
    (lambda P, Q, F, G: (P, Q, F * 3, G), "F must lie in \\[0, 1\\]"),
    (lambda P, Q, F, G: (P, Q, F, G * 0.5), "G is not row-stochastic"),
])
@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_bad_tables_give_clear_errors(mutate, match, backend):
    P, Q, F, G = mutate(*_good())
    with pytest.raises(ValueError, match=match):
        sim.simulate(P, Q, F, G, 0, 10, 0, backend=backend)


def test_other_bad_input():
    P, Q, F, G = _good()
    with pytest.raises(ValueError, match="init state 7 is out of range"):
        sim.simulate(P, Q, F, G, 7, 10, 0)
    with pytest.raises(ValueError, match="init is not row-stochastic"):
        sim.simulate(P, Q, F, G, np.ones(4), 10, 0)
    with pytest.raises(ValueError, match="backend must be one of"):
        sim.simulate(P, Q, F, G, 0, 10, 0, backend="torch")
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        sim.simulate(P, Q, F, G, 0, 10, -1)
    with pytest.raises(ValueError, match="draft length L must be an integer >= 1"):
        sim.simulate_rule(P, Q, rules.vanilla(), 0, 0, 10, 0)
    with pytest.raises(ValueError, match="P is not row-stochastic"):
        sim.simulate_rule(P * 2, Q, rules.vanilla(), 2, 0, 10, 0)
    with pytest.raises(ValueError, match="same shape"):
        sim.simulate_rule(P, Q[:3, :3], rules.vanilla(), 2, 0, 10, 0)


@settings(max_examples=15, deadline=None)
@given(chain_case(max_V=5, max_L=3), st.integers(0, 2**31))
def test_any_valid_chain_runs_and_respects_support(case, seed):
    """Random chains with zeros and P = Q rows: outputs stay inside the support of the law."""
    P, Q, L, init, rng = case
    v = rules.uniform_rsd(1.5)
    F, G = markov.rule_tables(P, Q, L, v)
    law = brute_law(P, Q, bf.TableRule(F, G), L, init)
    for res in (sim.simulate(P, Q, F, G, init, 500, seed), sim.simulate_rule(P, Q, v, L, init, 500, seed)):
        assert np.all(law[tuple(with_start(res).T)] > 0)
        assert np.all((res.accepted >= 0) & (res.accepted <= L))
