"""theory.likelihood (T12) and theory.likelihood.fidelity against an independent enumeration of the speculative process,
the simulator's sequence frequencies, and negative controls (docs/theory.md section 11)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from bruteforce import (argmax_g, lantern_g, lantern_g_released, lantern_ptilde, optimal_g_rows, residual_g_rows,
                        scaled_f, typical_f)
from theory.likelihood import fidelity
from theory import rules
from theory.likelihood import log_likelihood, log_target

# --------------------------------------------------------------------------- brute-force process (scalar rules)


def _residual(p, q, f, rejected):
    r = [max(p[x] - q[x], 0.0) for x in range(len(p))]
    t = sum(r)
    return [v / t for v in r] if t > 0 else list(p)


def _min1(num, q):
    return [1.0 if q[x] == 0 else min(1.0, num[x] / q[x]) for x in range(len(q))]


def scalar_rule(name, V, rng):
    """(theory verifier, f(i, p, q) -> list, g(p, q, f, rejected) -> list) with the scalar rule written here."""
    if name == "vanilla":
        return rules.vanilla(), lambda i, p, q: scaled_f(1.0, p, q), _residual
    if name.startswith("cool-sd"):
        norm = name.split(":")[1]
        v = rules.cool_sd(2.5, 0.7, mu=0.3) if norm == "mu" else rules.cool_sd(2.5, 0.7, norm=norm, L=3)
        w = v.accept.schedule
        return v, lambda i, p, q: scaled_f(float(w(i, np)), p, q), optimal_g_rows
    if name == "uniform-rsd":
        return rules.uniform_rsd(1.7), lambda i, p, q: scaled_f(1.7, p, q), optimal_g_rows
    if name == "linear-rsd":
        return (rules.linear_rsd(3.0, 1.2, 3), lambda i, p, q: scaled_f(3.0 + (1.2 - 3.0) * (i - 1) / 2, p, q),
                optimal_g_rows)
    if name == "typical":
        return (rules.typical(0.3, 0.9), lambda i, p, q: typical_f(p, 0.3, 0.9, "release"),
                lambda p, q, f, x: argmax_g(p))
    if name == "typical+G*":
        return (rules.typical(0.3, 0.9, resample="optimal"), lambda i, p, q: typical_f(p, 0.3, 0.9, "release"),
                optimal_g_rows)
    if name == "greedy":
        return rules.greedy(), lambda i, p, q: argmax_g(p), lambda p, q, f, x: argmax_g(p)
    if name == "scaled":
        w = (0.8, 2.0, 1.3)
        return rules.scaled(rules.Explicit(w)), lambda i, p, q: scaled_f(w[i - 1], p, q), optimal_g_rows
    if name == "level":
        a = (0.3, 0.6, 0.1)

        def level_f(i, p, q):
            return [v + a[i - 1] * (1 - v) for v in scaled_f(1.0, p, q)]
        return rules.level(rules.Explicit(a)), level_f, optimal_g_rows
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    k = 1
    if name == "lantern":
        d = 0.35
        return (rules.lantern(nb, k, d), lambda i, p, q: _min1(lantern_ptilde(p, nb, k, delta=d), q),
                lambda p, q, f, x: lantern_g_released(p, q, nb, k, x, "p", delta=d))
    if name == "lantern++":
        lam = 2.5
        return (rules.lantern_pp(nb, k, lam), lambda i, p, q: _min1(lantern_ptilde(p, nb, k, lam=lam), q),
                lambda p, q, f, x: lantern_g_released(p, q, nb, k, x, "q", lam=lam))
    if name == "lantern-renormalised":       # the dense (V, V) effective law (no effective_at)
        return (rules.lantern(nb, k, 0.35, resample="renormalised"),
                lambda i, p, q: _min1(lantern_ptilde(p, nb, k, delta=0.35), q),
                lambda p, q, f, x: lantern_g(p, q, nb, k, x, "p"))
    if name == "lantern++-renormalised":
        return (rules.lantern_pp(nb, k, 2.5, resample="renormalised"),
                lambda i, p, q: _min1(lantern_ptilde(p, nb, k, lam=2.5), q),
                lambda p, q, f, x: lantern_g(p, q, nb, k, x, "q"))
    if name == "lantern+G*":
        return (rules.lantern(nb, k, 0.35, resample="optimal"),
                lambda i, p, q: _min1(lantern_ptilde(p, nb, k, delta=0.35), q), optimal_g_rows)
    raise KeyError(name)


RULES = ["vanilla", "cool-sd:offset", "cool-sd:mu", "cool-sd:mean", "cool-sd:first", "cool-sd:floor1", "uniform-rsd",
         "linear-rsd", "scaled", "level", "typical", "typical+G*", "greedy", "lantern", "lantern++",
         "lantern-renormalised", "lantern++-renormalised", "lantern+G*"]


def process_law(prow, qrow, f_rule, g_rule, L, T, convention="theory", truncate=True):
    """Law of the T emitted tokens (dict tuple -> prob) by enumerating whole rounds: every draft, accept/reject
    outcome and replacement. prow(prefix) -> p row, qrow(prefix, i) -> the draft row of the i-th draft.
    ``truncate=False``: the wrong convention L' = L, the round cut at T (a negative control)."""
    law: dict[tuple, float] = {}
    V = len(prow(()))

    def rounds(prefix, prob):
        n = len(prefix)
        if n >= T:
            key = prefix[:T]
            law[key] = law.get(key, 0.0) + prob
            return
        Lp = min(L, T - n - 1) if truncate else L
        if convention == "eagle" and n == 0:
            Lp = 0
        drafts(prefix, prob, 0, Lp)

    def drafts(cur, prob, i, Lp):
        if prob == 0:
            return
        if len(cur) >= T:            # only with truncate=False: accepted drafts reached T, the round is cut
            rounds(cur, prob)
            return
        p = prow(cur)
        if i == Lp:                  # every draft accepted: the target's token
            for x in range(V):
                if p[x] > 0:
                    rounds(cur + (x,), prob * p[x])
            return
        q = qrow(cur, i + 1)
        f = f_rule(i + 1, list(p), list(q))
        for y in range(V):
            if q[y] == 0:
                continue
            drafts(cur + (y,), prob * q[y] * f[y], i + 1, Lp)
            if f[y] < 1:
                g = g_rule(list(p), list(q), f, y)
                for x in range(V):
                    if g[x] > 0:
                        rounds(cur + (x,), prob * q[y] * (1 - f[y]) * g[x])

    rounds((), 1.0)
    return law


def _row(rng, V, zp):
    a = rng.gamma(rng.choice([0.3, 1.0, 4.0]), size=V)
    a[rng.random(V) < zp] = 0.0
    if a.sum() == 0:
        a[rng.integers(V)] = 1.0
    return a / a.sum()


def context_rows(rng, V, T, L, per_offset, zp):
    """Context-dependent rows: p(prefix), q(prefix, i) random for every prefix (q independent of i unless
    per_offset)."""
    P = {pre: _row(rng, V, zp) for n in range(T + L + 1) for pre in itertools.product(range(V), repeat=n) if n <= T}
    Qt = {(pre, i): _row(rng, V, zp) for pre in P for i in range(1, L + 1)}
    same = {pre: (P[pre] if rng.random() < 0.2 else None) for pre in P}

    def prow(pre):
        return P[pre[:T]]

    def qrow(pre, i):
        pre = pre[:T]
        if same[pre] is not None:
            return same[pre]
        return Qt[(pre, i if per_offset else 1)]
    return prow, qrow


def teacher_rows(prow, qrow, seqs, L, per_offset):
    """Teacher-forced rows for sequences (S, T): p (S, T, V), q (S, T, V) or (S, T, L, V)."""
    S, T = seqs.shape
    p = np.array([[prow(tuple(s[:t])) for t in range(T)] for s in seqs])
    if per_offset:
        q = np.array([[[qrow(tuple(s[:t]), i) for i in range(1, L + 1)] for t in range(T)] for s in seqs])
    else:
        q = np.array([[qrow(tuple(s[:t]), 1) for t in range(T)] for s in seqs])
    return p, q


def all_sequences(V, T):
    return np.array(list(itertools.product(range(V), repeat=T)), dtype=np.int64)


# --------------------------------------------------------------------------- brute force vs the recursion

@settings(max_examples=60, deadline=None)
@given(rule=st.sampled_from(RULES), V=st.integers(2, 3), T=st.integers(1, 4), L=st.integers(1, 3),
       per_offset=st.booleans(), convention=st.sampled_from(["theory", "eagle"]),
       zp=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**32 - 1))
def test_matches_bruteforce_process(rule, V, T, L, per_offset, convention, zp, seed):
    if rule.startswith("lantern"):
        V = 3                        # k + 1 = 2 neighbours per code
    rng = np.random.default_rng(seed)
    verifier, f_rule, g_rule = scalar_rule(rule, V, rng)
    prow, qrow = context_rows(rng, V, T, L, per_offset, zp)
    law = process_law(prow, qrow, f_rule, g_rule, L, T, convention)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, L, per_offset)
    lp = log_likelihood(p, q, seqs, verifier, L, convention=convention)
    exact = np.array([law.get(tuple(s), 0.0) for s in seqs])
    assert lp.shape == (len(seqs),) and lp.dtype == np.float64
    np.testing.assert_allclose(np.exp(lp), exact, rtol=1e-10, atol=1e-15)
    assert np.all(np.isneginf(lp[exact == 0]))        # impossible sequences: exactly -inf


def test_lantern_wrong_G_is_detected():
    """Negative control: LANTERN with the vanilla residual in place of its rejected-dependent law."""
    rng = np.random.default_rng(3)
    V, T, L = 3, 4, 2
    verifier, f_rule, g_rule = scalar_rule("lantern", V, rng)
    wrong = rules.Verifier(verifier.accept, rules.Residual(), "wrong-G")
    prow, qrow = context_rows(rng, V, T, L, False, 0.0)
    law = process_law(prow, qrow, f_rule, g_rule, L, T)
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, L, False)
    exact = np.array([law[tuple(s)] for s in seqs])
    right = np.exp(log_likelihood(p, q, seqs, verifier, L))
    bad = np.exp(log_likelihood(p, q, seqs, wrong, L))
    assert np.max(np.abs(right - exact)) < 1e-13
    assert 0.5 * np.abs(bad - exact).sum() > 1e-3


@pytest.mark.parametrize("what", ["untruncated", "eagle"])
def test_wrong_round_convention_is_detected(what):
    """Negative control: L' = L (rounds cut at T) or the other convention gives a different law."""
    rng = np.random.default_rng(4)
    V, T, L = 3, 4, 3
    verifier, f_rule, g_rule = scalar_rule("cool-sd:offset", V, rng)
    prow, qrow = context_rows(rng, V, T, L, True, 0.0)
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, L, True)
    mine = np.exp(log_likelihood(p, q, seqs, verifier, L))
    if what == "untruncated":
        other = process_law(prow, qrow, f_rule, g_rule, L, T, truncate=False)
    else:
        other = process_law(prow, qrow, f_rule, g_rule, L, T, convention="eagle")
    other = np.array([other.get(tuple(s), 0.0) for s in seqs])
    assert other.sum() == pytest.approx(1.0)
    assert 0.5 * np.abs(mine - other).sum() > 1e-3


def test_vanilla_is_the_target_on_random_rows():
    rng = np.random.default_rng(5)
    B, T, L, V = 6, 40, 4, 50
    p = rng.dirichlet(np.full(V, 0.3), size=(B, T))
    q = rng.dirichlet(np.full(V, 0.3), size=(B, T, L))
    x = np.array([[rng.choice(V, p=p[b, t]) for t in range(T)] for b in range(B)])
    for conv in ("theory", "eagle"):
        lh = log_likelihood(p, q, x, rules.vanilla(), L, convention=conv)
        np.testing.assert_allclose(lh, log_target(p, x), rtol=1e-12, atol=1e-10)
    lh = log_likelihood(p, q[:, :, 0], x, rules.vanilla(), L)
    np.testing.assert_allclose(lh, log_target(p, x), rtol=1e-12, atol=1e-10)


def test_batch_dims_and_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    T, L, V = 5, 2, 4
    p = rng.dirichlet(np.ones(V), size=(2, 3, T))
    q = rng.dirichlet(np.ones(V), size=(2, 3, T, L))
    x = rng.integers(V, size=(2, 3, T))
    v = rules.cool_sd(3.0)
    lh = log_likelihood(p, q, x, v, L)
    assert lh.shape == (2, 3)
    flat = log_likelihood(p.reshape(6, T, V), q.reshape(6, T, L, V), x.reshape(6, T), v, L)
    np.testing.assert_array_equal(lh.ravel(), flat)
    one = log_likelihood(p[1, 2], q[1, 2], x[1, 2], v, L)
    assert one.shape == () and float(one) == pytest.approx(lh[1, 2], rel=1e-14)
    lt = log_likelihood(torch.as_tensor(p, dtype=torch.float32), torch.as_tensor(q, dtype=torch.float32),
                        torch.as_tensor(x), v, L)
    assert lt.dtype == torch.float64
    np.testing.assert_allclose(lt.numpy(), lh, rtol=1e-5)


# --------------------------------------------------------------------------- the simulator's frequencies

def _chi2_pvalue(counts, probs):
    """Pearson chi-square p-value of counts against probs (cells with expected < 5 pooled)."""
    n = counts.sum()
    e = n * probs
    small = e < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(e[~small], e[small].sum())
    keep = exp > 0
    if np.any(obs[~keep] > 0):
        return 0.0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


@pytest.mark.parametrize("rule", ["cool-sd:offset", "lantern", "typical"])
def test_matches_simulator_frequencies(rule):
    """sim.simulate_sequence_rule's empirical sequence law (S = 60,000: a cell of probability 0.01 has SE
    4e-4) vs exp(log_likelihood); the wrong G / the eagle convention must be rejected at the same S."""
    from sim.sequence import simulate_sequence_rule

    rng = np.random.default_rng(7)
    V, T, L, S = 3, 4, 2, 60_000
    verifier, _, _ = scalar_rule(rule, V, rng)
    P = rng.dirichlet(np.ones(V), size=V)
    Q = rng.dirichlet(np.ones(V), size=V)
    res = simulate_sequence_rule(P, Q, verifier, L, T, S, seed=11, init=0)
    seqs = all_sequences(V, T)
    idx = (res.tokens * V ** np.arange(T - 1, -1, -1)).sum(1)
    counts = np.bincount(idx, minlength=len(seqs)).astype(float)
    prev = np.concatenate([np.zeros((len(seqs), 1), np.int64), seqs[:, :-1]], axis=1)
    p, q = P[prev], Q[prev]
    probs = np.exp(log_likelihood(p, q, seqs, verifier, L))
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert _chi2_pvalue(counts, probs) > 1e-3
    eagle = np.exp(log_likelihood(p, q, seqs, verifier, L, convention="eagle"))
    assert _chi2_pvalue(counts, eagle) < 1e-6
    if rule == "lantern":
        wrong = rules.Verifier(verifier.accept, rules.Residual(), "wrong-G")
        assert _chi2_pvalue(counts, np.exp(log_likelihood(p, q, seqs, wrong, L))) < 1e-6


# --------------------------------------------------------------------------- bad input

def _good():
    rng = np.random.default_rng(0)
    T, L, V = 4, 2, 3
    return (rng.dirichlet(np.ones(V), size=(2, T)), rng.dirichlet(np.ones(V), size=(2, T, L)),
            rng.integers(V, size=(2, T)), rules.vanilla(), L)


@pytest.mark.parametrize("case,match", [
    ("token_high", "tokens must lie in"), ("token_neg", "tokens must lie in"), ("token_float", "integer tokens"),
    ("p_neg", "p has negative"), ("p_nan", "p contains NaN"), ("p_sum", "p rows must sum to 1"),
    ("q_sum", "q rows that are read"), ("q_shape", "q must be"), ("tok_shape", "tokens must be"),
    ("L0", "L must be an int"), ("Lbool", "L must be an int"), ("verifier", "verifier must be a chain rule"),
    ("conv", "convention must be"), ("p_int", "p must be a real floating"),
])
def test_bad_input_one_line(case, match):
    p, q, x, v, L = _good()
    kw = {}
    if case == "token_high":
        x = x.copy(); x[0, 0] = 3
    elif case == "token_neg":
        x = x.copy(); x[1, 2] = -1
    elif case == "token_float":
        x = x.astype(float)
    elif case == "p_neg":
        p = p.copy(); p[0, 0, 0] = -0.1; p[0, 0, 1] += 0.1
    elif case == "p_nan":
        p = p.copy(); p[0, 1, 0] = np.nan
    elif case == "p_sum":
        p = p * 1.01
    elif case == "q_sum":
        q = q.copy(); q[0, 1, 0] *= 0.5
    elif case == "q_shape":
        q = q[:, :, :1]
    elif case == "tok_shape":
        x = x[:, :-1]
    elif case == "L0":
        L = 0
    elif case == "Lbool":
        L = True
    elif case == "verifier":
        v = "vanilla"
    elif case == "conv":
        kw = {"convention": "engine"}
    elif case == "p_int":
        p = (p > 0.5).astype(np.int64)
    with pytest.raises(ValueError, match=match) as e:
        log_likelihood(p, q, x, v, L, **kw)
    assert "\n" not in str(e.value)


def test_unread_q_rows_may_hold_anything():
    """Rows no round reads (token T-1; offsets past the round start; eagle's token 0) are ignored."""
    p, q, x, v, L = _good()
    q2 = q.copy()
    q2[:, -1] = np.nan              # token T-1 is always a target token
    q2[:, 0, 1] = np.nan            # token 0 is never a second draft
    ref = log_likelihood(p, q, x, rules.cool_sd(2.0), L)
    np.testing.assert_array_equal(log_likelihood(p, q2, x, rules.cool_sd(2.0), L), ref)
    q3 = q.copy()
    q3[:, 0] = np.nan               # eagle: token 0 comes from p_0
    np.testing.assert_array_equal(log_likelihood(p, q3, x, rules.cool_sd(2.0), L, convention="eagle"),
                                  log_likelihood(p, q, x, rules.cool_sd(2.0), L, convention="eagle"))


# --------------------------------------------------------------------------- estimators (theory.likelihood.fidelity)

def _exact_pair(rule="cool-sd:offset", V=3, T=3, L=2, seed=8, zp=0.0, P=None):
    """All V^T sequences with their exact P^ (log_likelihood) and P (log_target) on an order-1 chain."""
    rng = np.random.default_rng(seed)
    verifier, _, _ = scalar_rule(rule, V, rng)
    if callable(P):
        P = P(verifier)
    elif P is None:
        P = np.array([_row(rng, V, zp) for _ in range(V)])
    Q = np.array([_row(rng, V, 0.0) for _ in range(V)])
    seqs = all_sequences(V, T)
    prev = np.concatenate([np.zeros((len(seqs), 1), np.int64), seqs[:, :-1]], axis=1)
    return (log_likelihood(P[prev], Q[prev], seqs, verifier, L), log_target(P[prev], seqs), P, Q, verifier, seqs)


def test_estimator_intervals_cover_the_exact_values():
    """400 repetitions of n = 400 images: each 95% interval covers the exact TV / KL in 92-98% of them (binomial
    SE 1.1%); the negative control (intervals a third as wide) must cover far less."""
    lh, lp, *_ = _exact_pair()
    ph, pt = np.exp(lh), np.exp(lp)
    exact = {"tv_sd": 0.5 * np.abs(ph - pt).sum(), "kl_sd": float(np.sum(ph * (lh - lp))),
             "kl_ar": float(np.sum(pt * (lp - lh)))}
    exact["tv_ar"] = exact["tv_sd"]
    assert exact["tv_sd"] > 0.02 and exact["kl_sd"] > 0.01
    rng = np.random.default_rng(9)
    reps, n = 400, 400
    cover = {k: 0 for k in exact}
    narrow = {k: 0 for k in exact}
    est = {k: [] for k in exact}
    for _ in range(reps):   # repetitions of a whole experiment (the estimators are vectorised over images)
        i_sd = rng.choice(len(ph), size=n, p=ph / ph.sum())
        i_ar = rng.choice(len(pt), size=n, p=pt / pt.sum())
        for k, d in (("tv_sd", fidelity.tv_sd(lh[i_sd], lp[i_sd])), ("kl_sd", fidelity.kl_sd(lh[i_sd], lp[i_sd])),
                     ("tv_ar", fidelity.tv_ar(lh[i_ar], lp[i_ar])), ("kl_ar", fidelity.kl_ar(lh[i_ar], lp[i_ar]))):
            cover[k] += d["ci"][0] <= exact[k] <= d["ci"][1]
            narrow[k] += abs(d["measured"] - exact[k]) <= fidelity.Z95 * d["se"] / 3
            est[k].append(d["measured"])
    for k in exact:
        assert 0.92 <= cover[k] / reps <= 0.98, (k, cover[k] / reps)
        assert narrow[k] / reps < 0.6, (k, narrow[k] / reps)
    # the two TV estimators estimate one number from independent samples
    a, b = np.array(est["tv_sd"]), np.array(est["tv_ar"])
    assert abs(a.mean() - b.mean()) < 4 * math.hypot(a.std(), b.std()) / math.sqrt(reps)


def test_vanilla_estimates_are_zero():
    lh, lp, *_ = _exact_pair("vanilla")
    r = fidelity.report((lh, lp), (lh, lp), T=3, bound_per_image=np.zeros(len(lh)))
    import json
    assert json.loads(json.dumps(r)) == r                       # plain JSON (no inf, no numpy scalars)
    assert r["bound_check"] == {"within": True, "refuted": False, "vacuous": False}
    assert r["tv_to_target"]["measured"] < 1e-12 and r["tv_to_target"]["from_ar"] < 1e-12
    assert abs(r["kl_to_target"]["measured"]) < 1e-12 and abs(r["kl_from_ar"]["measured"]) < 1e-12


def test_infinite_kl_is_flagged_not_averaged():
    """LANTERN emits tokens the target gives probability 0 (neighbour mass admits them): KL(P^||P) is infinite,
    reported as None with a count; TV counts those images as 1."""
    def target(v):      # code 2 has p = 0 and its nearest neighbour mass 0.3 <= delta = 0.35: p~(2) = 0.3
        row = np.zeros(3)
        n1 = int(v.accept.neighbors[2][0])
        row[n1], row[1 - n1] = 0.3, 0.7
        return np.tile(row, (3, 1))

    lh, lp, *_ = _exact_pair("lantern", P=target)
    zero = np.isneginf(lp) & np.isfinite(lh)
    assert zero.any()
    rng = np.random.default_rng(2)
    ph = np.exp(lh)
    i = rng.choice(len(ph), size=3000, p=ph / ph.sum())
    kl = fidelity.kl_sd(lh[i], lp[i], T=3)
    assert kl["measured"] is None and kl["ci"] is None and kl["n_infinite"] == int(zero[i].sum()) > 0
    assert "infinite" in kl["reason"]
    tv = fidelity.tv_sd(lh[i], lp[i])
    assert tv["n_target_zero"] == kl["n_infinite"]
    terms = np.where(zero[i], 1.0, np.maximum(0.0, 1 - np.exp(lp[i] - lh[i])))
    assert tv["measured"] == pytest.approx(terms.mean(), rel=1e-12)
    # images from P that P^ cannot emit: KL(P||P^) infinite; a sample the law itself cannot emit: impossible
    out = fidelity.kl_ar(np.array([-1.0, -np.inf, -2.0]), np.array([-1.5, -1.0, -2.0]))
    assert out["measured"] is None and out["n_infinite"] == 1
    bad = fidelity.kl_sd(np.array([-1.0, -np.inf]), np.array([-1.0, -1.0]))
    assert bad["measured"] is None and bad["n_impossible"] == 1
    r = fidelity.report((lh[i], lp[i]), T=3)
    assert r["kl_to_target"]["measured"] is None and r["tv_to_target"]["measured"] == tv["measured"]


def test_tv_is_within_the_summed_round_bounds():
    """Hybrid argument (docs/theory.md section 11): exact TV(P^, P) over whole sequences <= E[sum over the
    rounds of the T11 term], the expectation estimated from the simulator's recorded bounds (S = 20,000;
    4 SE of slack). Can fail: the bound is not vacuous here (< 1) and the TV is not 0."""
    from sim.sequence import simulate_sequence_rule

    for rule in ("cool-sd:offset", "lantern", "typical"):
        lh, lp, P, Q, verifier, seqs = _exact_pair(rule, V=3, T=4, L=2, seed=12)
        tv = 0.5 * np.abs(np.exp(lh) - np.exp(lp)).sum()
        res = simulate_sequence_rule(P, Q, verifier, 2, 4, 20_000, seed=13, init=0, record_bound=True)
        per = np.nansum(res.bound, axis=1)
        b = fidelity.bound_summary(per)
        assert 0 < tv and b["measured"] < 1 and not b["vacuous"]
        assert tv <= b["measured"] + 4 * b["se"], (rule, tv, b)
        chk = fidelity.bound_check({"measured": tv, "ci": [tv, tv]}, b)
        assert chk["within"] and not chk["refuted"] and not chk["vacuous"]
        # the whole pipeline on the simulator's own sequences: teacher-forced rows -> log P^, log P -> TV, KL
        x = res.tokens
        prev = np.concatenate([np.zeros((len(x), 1), np.int64), x[:, :-1]], axis=1)
        est = fidelity.tv_sd(log_likelihood(P[prev], Q[prev], x, verifier, 2), log_target(P[prev], x))
        assert abs(est["measured"] - tv) < 4 * est["se"], (rule, est, tv)


def test_bound_summary_flags_a_vacuous_bound():
    assert fidelity.bound_summary(np.array([1.5, 2.5]))["vacuous"]


@pytest.mark.parametrize("args,match", [
    ((np.zeros(3), np.zeros(2)), "same shape"), ((np.zeros(1), np.zeros(1)), "at least 2"),
    ((np.array([0.0, np.nan]), np.zeros(2)), "no NaN"), ((np.array([0.0, np.inf]), np.zeros(2)), "no NaN"),
])
def test_estimator_bad_input(args, match):
    for fn in (fidelity.kl_sd, fidelity.tv_sd, fidelity.tv_ar, fidelity.kl_ar):
        with pytest.raises(ValueError, match=match):
            fn(*args)


@pytest.mark.parametrize("variant", ["lantern", "lantern++"])
def test_lantern_effective_at_token_equals_the_dense_law(variant):
    """LanternResample.effective_at (O(V k), used by log_likelihood) == the dense (V, V) effective law gathered,
    on random rows with zeros and on peaked rows where the "p" law's Z(y) cancels (recomputed exactly)."""
    from theory.core.xp import gather

    rng = np.random.default_rng(15)
    V, k, n = 12, 3, 400
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    v = rules.lantern(nb, k, 0.3) if variant == "lantern" else rules.lantern_pp(nb, k, 3.0)
    p = rng.dirichlet(np.full(V, 0.4), size=n)
    p[rng.random(p.shape) < 0.3] = 0
    p[:, 0] += 1e-3
    p /= p.sum(1, keepdims=True)
    peak = np.full((n // 2, V), 1e-12)               # nearly all mass on code nb[y][1] for y = 0: Z(0) ~ 1e-11
    peak[:, int(nb[0][1])] = 1.0
    p = np.concatenate([p, peak / peak.sum(1, keepdims=True)])
    q = rng.dirichlet(np.full(V, 0.4), size=len(p))
    q[: n // 4, 0] += 5.0                             # often draft (and reject) code 0
    q /= q.sum(1, keepdims=True)
    f = v.accept(p, q, 1)
    x = rng.integers(V, size=len(p))
    dense = gather(v.resample(p, q, f), x)
    fast = v.resample.effective_at(p, q, f, x)
    np.testing.assert_allclose(fast, dense, rtol=1e-9, atol=1e-300)
    torch = pytest.importorskip("torch")
    vt = rules.lantern(torch.as_tensor(nb), k, 0.3) if variant == "lantern" else rules.lantern_pp(torch.as_tensor(nb), k, 3.0)
    tt = vt.resample.effective_at(*(torch.as_tensor(a) for a in (p, q, f, x)))
    np.testing.assert_allclose(tt.numpy(), dense, rtol=1e-9, atol=1e-300)
    assert rules.lantern(nb, k, 0.3, resample="renormalised").resample.effective_at(p, q, f, x) is None


def test_unnormalised_rows_follow_the_engines_draws():
    """Rows within float32 rounding of 1 (accepted by validation): every draw of the engine normalises its
    row (inverse CDF) and the rules are ratio-based, so scaling all rows by 1 + 1e-7 must leave log P^ and
    log P unchanged; reading q f and p as if the rows summed to 1 would move log P^ by ~T x 1e-7."""
    rng = np.random.default_rng(16)
    B, T, L, V = 4, 12, 3, 20
    p = rng.dirichlet(np.full(V, 0.5), size=(B, T))
    q = rng.dirichlet(np.full(V, 0.5), size=(B, T, L))
    x = rng.integers(V, size=(B, T))
    for v in (rules.vanilla(), rules.cool_sd(2.0)):
        ref = log_likelihood(p, q, x, v, L)
        # both rows scaled alike: f = min(1, w p/q) unchanged, every normalised draw unchanged
        np.testing.assert_allclose(log_likelihood(p * (1 + 1e-7), q * (1 + 1e-7), x, v, L), ref, rtol=1e-12)
    np.testing.assert_allclose(log_target(p * (1 - 1e-7), x), log_target(p, x), rtol=1e-12)


@pytest.mark.parametrize("name", __import__("theory.rules.methods", fromlist=["names"]).names())
def test_every_registered_method(name):
    """Every method in the registry (and any added later), with its default parameters: the recursion against the
    enumeration of the process driven by the verifier's own rules (G(.|rejected) given the rejected draft)."""
    from theory.rules import methods

    rng = np.random.default_rng(17)
    V, T, L = 3, 4, 2
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    m = methods.get(name)
    kw = {"k": 1} if m.needs_neighbors else {}
    test_values = {"weights": "2.0,1.3"}       # parameters without a default (a method added later adds its own)
    kw.update({p.name: test_values[p.name] for p in m.params if p.default is None and not p.optional})
    emb = rng.normal(size=(V, 2)) if getattr(m, "needs_embeddings", False) else None   # GSD's codebook vectors
    v = methods.build(name, L, neighbors=nb, embeddings=emb, **kw)
    f_rule = lambda i, p, q: v.accept(np.array(p), np.array(q), i).tolist()                      # noqa: E731
    g_rule = lambda p, q, f, x: v.resample(np.array(p), np.array(q), np.array(f), np.array(x)).tolist()  # noqa: E731
    for per_offset, conv in ((False, "theory"), (True, "eagle")):
        prow, qrow = context_rows(rng, V, T, L, per_offset, 0.2)
        law = process_law(prow, qrow, f_rule, g_rule, L, T, conv)
        seqs = all_sequences(V, T)
        p, q = teacher_rows(prow, qrow, seqs, L, per_offset)
        exact = np.array([law.get(tuple(s), 0.0) for s in seqs])
        np.testing.assert_allclose(np.exp(log_likelihood(p, q, seqs, v, L, convention=conv)), exact,
                                   rtol=1e-10, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 9))
def test_optimal_effective_at_token_is_the_normalised_residual(seed, V):
    """G*.effective_at (a division at x, the residual's sum) == the brute-force G*(x) = [p - q f]_+(x) / sum, with
    p(x) / sum p where the residual is empty (f = 1 and q = p), on numpy and torch with p (n, 1, V) shared by the L
    offsets of q, f (n, L, V)."""
    rng = np.random.default_rng(seed)
    n, L = 5, 3
    p = rng.dirichlet(np.full(V, 0.5), size=(n, 1))
    p[rng.random(p.shape) < 0.3] = 0.0
    p[..., 0] += 1e-3
    p /= p.sum(-1, keepdims=True)
    q = rng.dirichlet(np.full(V, 0.5), size=(n, L))
    f = rng.random((n, L, V))
    q[0], f[0] = p[0], 1.0                                     # an empty residual: the fallback
    x = rng.integers(V, size=(n, 1))
    want = np.zeros((n, L))
    for i in range(n):
        for j in range(L):
            want[i, j] = optimal_g_rows(list(p[i, 0]), list(q[i, j]), list(f[i, j]))[int(x[i, 0])]
    got = rules.Optimal().effective_at(p, q, f, x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    torch = pytest.importorskip("torch")
    got_t = rules.Optimal().effective_at(*(torch.as_tensor(a) for a in (p, q, f, x))).numpy()
    np.testing.assert_allclose(got_t, want, rtol=1e-12, atol=1e-300)


def test_control_optimal_effective_at_reads_the_acceptance():
    """Negative control for the test above: on fixed rows the brute-force vanilla residual (f ignored) gives other
    values at x than G*, and the test's comparison sees it."""
    rng = np.random.default_rng(4)
    V, L = 8, 3
    p = rng.dirichlet(np.ones(V), size=(6, 1))
    q = rng.dirichlet(np.ones(V), size=(6, L))
    f = rng.uniform(0.2, 0.8, size=(6, L, V))
    x = rng.integers(V, size=(6, 1))
    got = rules.Optimal().effective_at(p, q, f, x)
    van = np.array([[residual_g_rows(list(p[i, 0]), list(q[i, j]))[int(x[i, 0])] for j in range(L)] for i in range(6)])
    opt = np.array([[optimal_g_rows(list(p[i, 0]), list(q[i, j]), list(f[i, j]))[int(x[i, 0])] for j in range(L)]
                    for i in range(6)])
    np.testing.assert_allclose(got, opt, rtol=1e-12)
    assert not np.allclose(got, van, rtol=1e-3)
