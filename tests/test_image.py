"""theory.markov.image (docs/theory.md section 7): the whole-image recursion against (1) an exact enumeration of the
algorithm for tiny images, (2) a Monte-Carlo simulation written here (vectorised numpy, independent of
sim/), (3) a closed-form renewal recursion for context-free pairs; the accumulated bound against the exact
whole-image TV; the speed-up model; and clear errors on bad input."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bruteforce as bf
from strategies import chain_case, random_tables
from theory.markov import chains, image
from theory import markov, rules

TOL = 1e-10


# --------------------------------------------------------------------------- independent references

def enumerate_image(P, Q, F, G, T, s0):
    """Exact law of the T image tokens and E[rounds], E[drafts], E[sum of round bounds] by enumerating
    every draft / accept / resample outcome of every round (plain Python; tiny V and T only).
    Convention: with n tokens made, a round drafts l = min(L, T - n - 1); l = 0 is one target step."""
    V, L = len(P), F.shape[0]
    law: dict = {}
    stats = {"rounds": 0.0, "drafts": 0.0, "bound": 0.0}
    round_bound = {}

    def b(s, ell):  # the round's TV bound by the brute-force enumeration of tests/bruteforce.py
        if ell == 0:
            return 0.0
        if (s, ell) not in round_bound:
            round_bound[(s, ell)] = bf.bound(P, Q, bf.TableRule(F[:ell], G[:ell]), ell, s)
        return round_bound[(s, ell)]

    def new_round(seq, s, prob):
        n = len(seq)
        if n == T:
            law[seq] = law.get(seq, 0.0) + prob
            return
        ell = min(L, T - n - 1)
        stats["rounds"] += prob
        stats["drafts"] += prob * ell
        stats["bound"] += prob * b(s, ell)
        position(0, ell, seq, s, prob)

    def position(i, ell, seq, s, prob):
        if i == ell:  # every draft accepted (or none drafted): one token from the target
            for y in range(V):
                if P[s][y] > 0:
                    new_round(seq + (y,), y, prob * P[s][y])
            return
        for x in range(V):
            if Q[s][x] == 0:
                continue
            f = F[i][s][x]
            if f > 0:
                position(i + 1, ell, seq + (x,), x, prob * Q[s][x] * f)
            if f < 1:
                for y in range(V):
                    if G[i][s][y] > 0:
                        new_round(seq + (y,), y, prob * Q[s][x] * (1 - f) * G[i][s][y])

    new_round((), s0, 1.0)
    return law, stats


def target_image_law(P, T, s0):
    out = {}
    for seq in itertools.product(range(len(P)), repeat=T):
        pr, prev = 1.0, s0
        for x in seq:
            pr *= P[prev][x]
            prev = x
        if pr > 0:
            out[seq] = pr
    return out


def simulate_images(P, Q, F, G, T, s0, n, seed, bounds):
    """Monte Carlo: n images generated in parallel (vectorised over images, loops over rounds and draft
    positions). Returns per-image (rounds, drafts, accumulated bound) arrays. ``bounds[l, s]`` is the TV
    bound of a round of l drafts from s (computed by the caller with theory.markov)."""
    rng = np.random.default_rng(seed)
    V, L = len(P), F.shape[0]
    cq, cp, cg = np.cumsum(Q, 1), np.cumsum(P, 1), np.cumsum(G, 2)

    def draw(c, u):  # inverse CDF, c (m, V) cumulative sums
        return np.minimum((u[:, None] >= c).sum(1), V - 1)

    s = np.full(n, s0)
    made = np.zeros(n, dtype=int)
    rounds, drafts, acc = np.zeros(n), np.zeros(n), np.zeros(n)
    while np.any(made < T):
        idx = np.flatnonzero(made < T)
        m = idx.size
        ell = np.minimum(L, T - made[idx] - 1)
        rounds[idx] += 1
        drafts[idx] += ell
        cur = s[idx].copy()
        acc[idx] += bounds[ell, cur]
        produced = np.zeros(m, dtype=int)
        going = np.ones(m, dtype=bool)          # still accepting drafts in this round
        for i in range(L):
            act = going & (i < ell)
            x = draw(cq[cur], rng.random(m))
            ok = rng.random(m) < F[i, cur, x]
            y = draw(cg[i, cur], rng.random(m))
            a, r = act & ok, act & ~ok
            produced += act
            nxt = np.where(a, x, np.where(r, y, cur))
            going = np.where(i < ell, a, going)
            cur = nxt
        z = draw(cp[cur], rng.random(m))        # bonus (or the single target step when l = 0)
        produced += going
        cur = np.where(going, z, cur)
        s[idx] = cur
        made[idx] += produced
    assert np.all(made == T)
    return rounds, drafts, acc


def bound_table(P, Q, F, G):
    L, V = F.shape[0], len(P)
    out = np.zeros((L + 1, V))
    for ell in range(1, L + 1):
        for s in range(V):
            out[ell, s] = markov.tv_bound(P, Q, F[:ell], G[:ell], s)
    return out


# --------------------------------------------------------------------------- exact agreement

@settings(max_examples=25, deadline=None)
@given(chain_case(max_V=3, max_L=3), st.integers(1, 5))
def test_recursion_equals_exact_enumeration_and_bounds_the_image_tv(case, T):
    P, Q, L, _, rng = case
    F, G = random_tables(rng, L, len(P))
    s0 = int(rng.integers(len(P)))
    pred = image.image_prediction(P, Q, F, G, T, s0)
    law, stats = enumerate_image(P, Q, F, G, T, s0)
    assert abs(pred.expected_rounds - stats["rounds"]) < TOL
    assert abs(pred.expected_draft_steps - stats["drafts"]) < TOL
    assert abs(pred.accumulated_bound - stats["bound"]) < TOL
    assert abs(pred.boundary_mass[T] - 1) < TOL          # every image ends exactly at T tokens
    # hybrid argument: the whole-image TV is at most the accumulated per-round bound
    assert bf.tv(law, target_image_law(P, T, s0)) <= pred.accumulated_bound + TOL


def test_single_token_and_two_token_images():
    P, Q = chains.random_pair(4, tv=0.5, seed=0)
    F, G = markov.rule_tables(P, Q, 3, rules.cool_sd(2.0))
    one = image.image_prediction(P, Q, F, G, 1, 0)
    assert one.expected_rounds == 1 and one.expected_draft_steps == 0 and one.expected_single_steps == 1
    assert one.accumulated_bound == 0
    two = image.image_prediction(P, Q, F, G, 2, 0)   # one drafted token: 1 round if accepted, else 2
    beta = (Q[0] * F[0, 0]).sum()
    assert abs(two.expected_rounds - (beta * 1 + (1 - beta) * 2)) < TOL
    assert abs(two.accumulated_bound - markov.tv_bound(P, Q, F[:1], G[:1], 0)) < TOL


@pytest.mark.parametrize("tv, L, T", [(0.3, 3, 50), (0.6, 5, 7), (0.1, 1, 20), (0.45, 4, 1024)])
def test_context_free_vanilla_matches_the_renewal_recursion(tv, L, T):
    """Context-free vanilla: a round of l drafts yields j tokens with probability a^(j-1)(1-a) (j <= l)
    and a^l (j = l + 1), a = 1 - TV, whatever the state: r(n) = 1 + sum_j p_j r(n + j)."""
    P, Q = chains.iid_pair(5, tv=tv, seed=1)
    F, G = markov.rule_tables(P, Q, L, rules.vanilla())
    a = 1 - tv
    r = np.zeros(T + 1)
    for n in range(T - 1, -1, -1):
        ell = min(L, T - n - 1)
        p = [a ** (j - 1) * (1 - a) for j in range(1, ell + 1)] + [a**ell]
        r[n] = 1 + sum(pj * r[n + j] for j, pj in enumerate(p, 1))
    pred = image.image_prediction(P, Q, F, G, T, 2)
    assert abs(pred.expected_rounds - r[0]) < 1e-9 * T
    assert abs(pred.accumulated_bound) < 1e-12          # vanilla is lossless (Theorem 1)
    assert abs(pred.tokens_per_call - T / r[0]) < 1e-9


def test_round_kernels_and_bounds_agree_with_the_one_round_engine():
    P, Q = chains.random_pair(5, tv=0.4, seed=2)
    F, G = markov.rule_tables(P, Q, 4, rules.linear_rsd(3.0, 1.0, 4))
    b = image.round_bounds(P, Q, F, G)
    for ell in range(0, 5):
        K = image.round_kernels(P, Q, F, G, ell)
        assert np.allclose(K.sum(axis=(0, 2)), 1, atol=TOL)
        for s in range(5):
            if ell:
                pr = np.concatenate([[1.0], markov.acceptance_probs(P, Q, F[:ell], s)])
                # Pr(round yields j tokens) = Pr(tau = j - 1) = Pr(tau >= j-1) - Pr(tau >= j)
                want = np.append(pr[:-1] - pr[1:], pr[-1])
                assert np.allclose(K[:, s].sum(1), want, atol=TOL)
                assert abs(b[ell, s] - markov.tv_bound(P, Q, F[:ell], G[:ell], s)) < TOL
            else:
                assert np.allclose(K[0], P) and b[0, s] == 0


# --------------------------------------------------------------------------- Monte Carlo

def _state_dependent_chain():
    """State 0: the draft equals the target (always accepted). States 1, 2: the draft is far off and
    puts its mass on token 0, so a rejection there resamples away from 0 while acceptances land on 0:
    the state law at round boundaries is far from the chain's stationary law."""
    P = np.array([[0.6, 0.2, 0.2], [0.1, 0.45, 0.45], [0.1, 0.45, 0.45]])
    Q = np.array([[0.6, 0.2, 0.2], [0.8, 0.1, 0.1], [0.8, 0.1, 0.1]])
    return P, Q


def test_recursion_agrees_with_monte_carlo_within_4_standard_errors():
    P, Q = _state_dependent_chain()
    L, T, n = 3, 40, 20000
    F, G = markov.rule_tables(P, Q, L, rules.cool_sd(1.6))
    pred = image.image_prediction(P, Q, F, G, T, 1)
    rounds, drafts, acc = simulate_images(P, Q, F, G, T, 1, n, seed=0, bounds=bound_table(P, Q, F, G))
    for est, exact in ((rounds, pred.expected_rounds), (drafts, pred.expected_draft_steps),
                       (acc, pred.accumulated_bound)):
        se = est.std(ddof=1) / np.sqrt(n)      # SE of the mean over n independent images
        assert se > 0 and abs(est.mean() - exact) < 4 * se, (est.mean(), exact, se)

    # negative control: the naive renewal model that starts every round from the stationary law of P
    # (ignoring that the state at a round boundary follows the relaxed process) is rejected by the same
    # 4-SE check
    pi = chains.stationary(P)
    r = np.zeros(T + 1)
    for m in range(T - 1, -1, -1):
        ell = min(L, T - m - 1)
        p = image.round_kernels(P, Q, F, G, ell).sum(2) @ pi   # Pr(j tokens) from s ~ pi
        r[m] = 1 + sum(pj * r[m + j] for j, pj in enumerate(p, 1))
    se = rounds.std(ddof=1) / np.sqrt(n)
    assert abs(rounds.mean() - r[0]) > 4 * se, (rounds.mean(), r[0], se)


# --------------------------------------------------------------------------- speed-up model

def test_speedup_model():
    assert abs(image.round_speedup(3.0, 4, 0.05) - 3.0 / 1.2) < TOL
    assert abs(image.round_speedup(3.0, 4, 0.05, verify_cost=1.5, verify_per_token=0.02)
               - 3.0 / (4 * 0.07 + 1.5 + 0.02)) < TOL
    P, Q = chains.random_pair(6, tv=0.3, seed=4)
    pred = image.predict_image(P, Q, rules.uniform_rsd(1.5), 4, 256, 0)
    # free drafts and verification at the cost of one target step: speed-up = tokens per target call
    assert abs(pred.speedup(0.0) - pred.tokens_per_call) < 1e-12
    sp = [pred.speedup(c) for c in (0.0, 0.05, 0.2, 0.5)]
    assert all(a > b for a, b in zip(sp, sp[1:]))
    # expected time by hand: rounds with drafts cost L' c + 1, single steps cost 1
    c = 0.1
    t = pred.expected_draft_steps * c + pred.expected_rounds
    assert abs(pred.speedup(c) - 256 / t) < 1e-12
    # AR decoding expressed in the model: L = 1 with nothing ever accepted costs 1 + c per token
    P0 = np.array([[1.0, 0.0], [1.0, 0.0]])
    Q0 = np.array([[0.0, 1.0], [0.0, 1.0]])
    ar = image.predict_image(P0, Q0, rules.vanilla(), 1, 10, 0)
    assert ar.expected_rounds == 10 and abs(ar.speedup(0.0) - 1.0) < TOL


@pytest.mark.parametrize("kwargs, match", [
    ({"cost_ratio": -0.1}, "cost_ratio"), ({"cost_ratio": float("nan")}, "cost_ratio"),
    ({"cost_ratio": 0.1, "verify_cost": 0.0}, "verify_cost"),
    ({"cost_ratio": 0.1, "verify_per_token": -1}, "verify_per_token"),
    ({"cost_ratio": "fast"}, "number")])
def test_speedup_rejects_bad_costs(kwargs, match):
    P, Q = chains.random_pair(3, seed=0)
    pred = image.predict_image(P, Q, rules.vanilla(), 2, 10, 0)
    with pytest.raises(ValueError, match=match):
        pred.speedup(**kwargs)
    with pytest.raises(ValueError, match=match):
        image.round_speedup(2.0, 2, **kwargs)


def test_image_rejects_bad_input():
    P, Q = chains.random_pair(3, seed=0)
    F, G = markov.rule_tables(P, Q, 2, rules.vanilla())
    with pytest.raises(ValueError, match="T must be"):
        image.image_prediction(P, Q, F, G, 0, 0)
    with pytest.raises(ValueError, match="T must be"):
        image.image_prediction(P, Q, F, G, 10.5, 0)
    with pytest.raises(ValueError, match="init"):
        image.image_prediction(P, Q, F, G, 10, 7)
    with pytest.raises(ValueError, match="row-stochastic"):
        image.image_prediction(P * 2, Q, F, G, 10, 0)
    with pytest.raises(ValueError, match=r"\[1, L \+ 1\].*E\[tau\] \+ 1"):
        image.round_speedup(0.5, 4, 0.1)
    with pytest.raises(ValueError, match="ell"):
        image.round_kernels(P, Q, F, G, 3)


@pytest.mark.parametrize("V, T", [(12, 5), (4, 30)])   # V > 2T: per-position products; else stacked kernels
def test_both_recursion_paths_equal_the_explicit_kernel_recursion(V, T):
    P, Q = chains.random_pair(V, tv=0.5, seed=V)
    L = 3
    F, G = markov.rule_tables(P, Q, L, rules.cool_sd(2.5))
    K = {ell: image.round_kernels(P, Q, F, G, ell) for ell in range(L + 1)}
    b = image.round_bounds(P, Q, F, G)
    pi = np.zeros((T + 1, V))
    pi[0, 0] = 1.0
    bound = 0.0
    for n in range(T):
        ell = min(L, T - n - 1)
        bound += pi[n] @ b[ell]
        for j in range(ell + 1):
            pi[n + j + 1] += pi[n] @ K[ell][j]
    pred = image.image_prediction(P, Q, F, G, T, 0)
    assert abs(pred.expected_rounds - pi[:T].sum()) < TOL and abs(pred.accumulated_bound - bound) < TOL
    assert np.allclose(pred.boundary_mass, pi.sum(1), atol=TOL)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.integers(1, 3))
def test_expected_batch_rounds_is_the_max_of_B_draws(rounds, B):
    """E[max of B draws] from the empirical law, against enumerating every B-tuple of the sample."""
    want = float(np.mean([max(t) for t in itertools.product(rounds, repeat=B)]))
    assert image.expected_batch_rounds(rounds, B) == pytest.approx(want, rel=1e-12)


def test_batch_speedup_model():
    # T a / (E[max rounds] r): 49 tokens, rounds 10 or 20 equally likely, B = 2: E[max] = 17.5
    assert image.batch_speedup([10, 20], 2, 49, ar_step=1.0, round_cost=2.0) == pytest.approx(49 / 35)
    with pytest.raises(ValueError, match="round counts"):
        image.expected_batch_rounds([0, 3], 2)
    with pytest.raises(ValueError, match="positive"):
        image.batch_speedup([3], 1, 10, ar_step=0.0, round_cost=1.0)
