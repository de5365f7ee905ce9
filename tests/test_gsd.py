"""GSD (theory.rules.gsd, theory.rules.gsd; docs/theory.md section 6b): a hand-worked example, the release's
logic replayed as a plain loop (tests/bruteforce.py: gsd_f) on a planted codebook, the theory (E[tau], B,
exact TV against enumeration; T10/T11 from recorded rows), the simulator's law, the facts of section 6b
and bad input."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bruteforce as bf
from strategies import chain_case
from test_markov import check_against_enumeration
from theory import markov, rules
from theory.rules import methods
from theory.likelihood.recorded import predict_rounds

TOL = 1e-10
SETTINGS = settings(max_examples=40, deadline=None)

# ------------------------------------------------------------------ the hand-worked example (V = 6, window 2)
# codes on a line: squared distances 0.25 between 0-1, 1-2 and 3-4 (< 0.5), every other pair >= 1
E6 = np.array([[0.0], [0.5], [1.0], [3.0], [3.5], [10.0]])
P6 = np.array([0.30, 0.25, 0.05, 0.20, 0.12, 0.08])
Q6 = np.array([0.10, 0.50, 0.10, 0.05, 0.20, 0.05])
# by hand: ascending ranking of p is (2, 5, 4, 3, 1, 0). Slices [r-2, r+2):
#   x=2 (r=0): [-2:2] -> [4:2], empty -> vanilla 0.05/0.10 = 0.5
#   x=5 (r=1): [-1:3] -> [5:3], empty -> vanilla min(1, 0.08/0.05) = 1
#   x=4 (r=2): {2,5,4,3}, all within 0.15 of p(4) = 0.12, close to 4: {3} -> G = {4,3}: 0.32/0.25 -> 1
#   x=3 (r=3): {5,4,3,1}, within 0.15 of 0.20: all; close to 3: {4} -> G = {3,4} -> 1
#   x=1 (r=4): {4,3,1,0}, within 0.15 of 0.25: all; close to 1: {0} (2 is outside the slice) -> G = {1,0}:
#              0.55/0.60 = 11/12 (vanilla: 0.5)
#   x=0 (r=5): {3,1,0}; close to 0: {1} -> G = {0,1}: 11/12 (vanilla: 1)
F6 = np.array([11 / 12, 11 / 12, 0.5, 1.0, 1.0, 1.0])
G6_RELEASE = np.array([0.20, 0, 0, 0.15, 0, 0.03]) / 0.38                       # Norm([p - q]_+)
G6_STAR = np.array([0.30 - 0.10 * 11 / 12, 0, 0, 0.15, 0, 0.03]) / (0.38 - 0.10 * 11 / 12 + 0.10)  # Norm([p - q f]_+)
# one-position discrepancy D = TV(Q f + (1 - beta) G, P), beta = 0.9: both laws give 0.288333... (by hand);
# with G*, D* = sum [q f - p]_+ = (0.458333 - 0.25) + (0.2 - 0.12) (T5)
D6 = (0.5 * 11 / 12 - 0.25) + (0.20 - 0.12)


def test_hand_worked_example():
    for v, G in ((rules.gsd(E6, window=2), G6_RELEASE), (rules.gsd(E6, window=2, resample="optimal"), G6_STAR)):
        f = v.accept(P6, Q6, 1)
        assert np.allclose(f, F6, atol=1e-15, rtol=0)
        assert np.allclose(v.resample(P6, Q6, f), G, atol=1e-15, rtol=0)
        beta = Q6 @ f
        assert abs(beta - 0.9) < 1e-15
        assert abs(0.5 * np.abs(Q6 * f + (1 - beta) * v.resample(P6, Q6, f) - P6).sum() - D6) < 1e-15
    # the loop replay agrees with the hand computation
    assert np.allclose(bf.gsd_f(list(P6), list(Q6), E6.tolist(), window=2), F6, atol=1e-15, rtol=0)
    # negative control: the same rows with the distance test off group 1 with 2, 3, 4 and 0 (all within 0.15)
    off = rules.gsd(window=2, d_threshold=None).accept(P6, Q6, 1)
    assert abs(off[1] - min(1, (0.12 + 0.20 + 0.25 + 0.30) / (0.20 + 0.05 + 0.50 + 0.10))) < 1e-15
    assert not np.allclose(off, F6)


# ------------------------------------------------------------------ the release's loop, token by token

def _planted(V, rng, d=2, spread=0.5):
    """A codebook of a few tight clusters (squared distances inside ~0.1, between >> 0.5)."""
    centres = rng.normal(scale=4.0, size=(max(1, V // 4), d))
    return centres[rng.integers(len(centres), size=V)] + spread * rng.normal(scale=0.3, size=(V, d))


@pytest.mark.parametrize("V,seed", [(16, 0), (16, 1), (40, 2), (13, 3)])
def test_release_defaults_replayed_as_a_loop(V, seed):
    """Window 7, thresholds 0.15 / 0.5, residual Norm([p - q]_+): every token's f and G on random rows
    (V = 13 < 14 also exercises the release's wrapped slices)."""
    rng = np.random.default_rng(seed)
    E = _planted(V, rng)
    p = rng.dirichlet(np.full(V, 0.3), size=5)
    q = rng.dirichlet(np.full(V, 0.3), size=5)
    p[0, :3] = p[0, 3]                                         # ties in the ranking
    p[0] /= p[0].sum()
    v = rules.gsd(E)
    assert v.name == "gsd" and v.params == {"window": 7, "p_threshold": 0.15, "d_threshold": 0.5, "resampler": "residual"}
    f = v.accept(p, q, 1)
    G = v.resample(p, q, f)
    for r in range(len(p)):                                     # rows: an independent loop each
        ref = bf.gsd_f(list(p[r]), list(q[r]), E.tolist())
        assert np.allclose(f[r], ref, atol=1e-13, rtol=0)
        assert np.allclose(G[r], bf.residual_g_rows(list(p[r]), list(q[r])), atol=1e-13, rtol=0)
    # the grouping acts: some token is decided differently from vanilla
    assert np.abs(f - rules.vanilla().accept(p, q, 1)).max() > 0.05


@SETTINGS
@given(st.integers(2, 20), st.integers(0, 9), st.sampled_from([0.05, 0.15, 0.4, 2.0]),
       st.sampled_from([None, 0.1, 0.5, 3.0]), st.integers(0, 2**32 - 1))
def test_any_settings_replayed_as_a_loop(V, window, p_thr, d_thr, seed):
    rng = np.random.default_rng(seed)
    E = _planted(V, rng)
    p = rng.dirichlet(np.full(V, 0.5), size=3)
    q = rng.dirichlet(np.full(V, 0.5), size=3)
    p[1, rng.random(V) < 0.3] = 0.0                            # zeros (ties at the bottom of the ranking)
    q[2, rng.random(V) < 0.3] = 0.0
    p[1, 0] += 1e-3
    q[2, 0] += 1e-3
    p /= p.sum(1, keepdims=True)
    q /= q.sum(1, keepdims=True)
    f = rules.gsd(E, window=window, p_threshold=p_thr, d_threshold=d_thr).accept(p, q, 1)
    for r in range(3):
        assert np.allclose(f[r], bf.gsd_f(list(p[r]), list(q[r]), E.tolist(), window, p_thr, d_thr), atol=1e-13, rtol=0)


def test_torch_rows_and_batched_positions_agree_with_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    V = 30
    E = _planted(V, rng)
    p = rng.dirichlet(np.full(V, 0.3), size=(2, 3))
    q = rng.dirichlet(np.full(V, 0.3), size=(2, 3))
    for res in ("residual", "optimal"):
        v = rules.gsd(E, resample=res)
        f = v.accept(p, q, np.arange(1, 4))
        vt = rules.gsd(torch.as_tensor(E), resample=res)
        ft = vt.accept(torch.as_tensor(p), torch.as_tensor(q), torch.arange(1, 4))
        assert np.allclose(ft.numpy(), f, atol=1e-14)
        assert np.allclose(vt.resample(torch.as_tensor(p), torch.as_tensor(q), ft).numpy(), v.resample(p, q, f), atol=1e-14)
        assert np.array_equal(vt.accept.close.numpy(), v.accept.close)


# ------------------------------------------------------------------ theory: chains, recorded rows

def _gsd_pair(V, rng, window, p_thr, d_thr, res):
    E = _planted(V, rng, d=1, spread=1.0)
    v = rules.gsd(E, window=window, p_threshold=p_thr, d_threshold=d_thr, resample=res)
    g = bf.residual_g_rows if res == "residual" else bf.optimal_g_rows
    ref = bf.RowRule(lambda i, p, q: bf.gsd_f(p, q, E.tolist(), window, p_thr, d_thr), g)
    return v, ref


@SETTINGS
@given(chain_case(max_V=5, max_L=3), st.integers(0, 3), st.sampled_from([0.1, 0.3, 1.0]),
       st.sampled_from([None, 0.5, 2.0]), st.sampled_from(["residual", "optimal"]))
def test_tables_match_the_algorithm_by_enumeration(case, window, p_thr, d_thr, res):
    """E[tau] (T8), B (T9) and exact TV (T3) from rule_tables equal the enumeration of the algorithm run with
    the loop replay of the release's rule; TV <= B (Theorem 2b), equal at L = 1; G* (T5) never has the larger B."""
    P, Q, L, init, rng = case
    v, ref = _gsd_pair(len(P), rng, window, p_thr, d_thr, res)
    F, G = markov.rule_tables(P, Q, L, v)
    b = check_against_enumeration(P, Q, F, G, ref, L, init)
    if res == "residual":
        Fs, Gs = markov.rule_tables(P, Q, L, rules.Verifier(v.accept, rules.Optimal()))
        assert markov.tv_bound(P, Q, Fs, Gs, init) <= b + TOL


@settings(max_examples=20, deadline=None)
@given(chain_case(max_V=5, max_L=3), st.integers(1, 3), st.sampled_from(["residual", "optimal"]))
def test_recorded_rows_average_to_the_exact_theory(case, window, res):
    """T10/T11: per-round predictions over all V^L draft paths, weighted by their Q-probability."""
    import itertools

    P, Q, L, _, rng = case
    V = len(P)
    v, _ = _gsd_pair(V, rng, window, 0.3, 0.5, res)
    s = int(rng.integers(V))
    paths = np.array(list(itertools.product(range(V), repeat=L)))
    prev = np.concatenate([np.full((len(paths), 1), s), paths], axis=1)
    w = np.prod(Q[prev[:, :-1], paths], axis=1)
    pred = predict_rounds(P[prev], Q[prev[:, :-1]], paths, v)
    F, G = markov.rule_tables(P, Q, L, v)
    assert abs(w @ pred.accepted - markov.expected_accepted(P, Q, F, s)) < TOL
    assert abs(w @ pred.bound - markov.tv_bound(P, Q, F, G, s)) < TOL


# ------------------------------------------------------------------ facts of section 6b

@settings(max_examples=30, deadline=None)
@given(chain_case(max_V=5, max_L=3), st.sampled_from(["window", "p", "d"]), st.sampled_from(["residual", "optimal"]))
def test_singleton_groups_are_vanilla_and_lossless(case, how, res):
    """Window 0 (every slice empty: the release's fallback), or thresholds so small that every group is {x}
    (distinct p values; codes farther apart than the threshold): f = vanilla, B = exact TV = 0."""
    P, Q, L, init, rng = case
    V = len(P)
    E = np.arange(V, dtype=float)[:, None]                    # squared distances >= 1
    kw = {"window": dict(window=0), "p": dict(p_threshold=1e-300, d_threshold=None),
          "d": dict(d_threshold=0.5, p_threshold=1.0)}[how]
    v = rules.gsd(E, resample=res, **kw)
    F, G = markov.rule_tables(P, Q, L, v)
    Fv, Gv = markov.rule_tables(P, Q, L, rules.vanilla())
    # (|p(y) - p(x)| < 1e-300 still groups tokens of equal p; the chains' ties are at p = 0, where the group's
    # p-mass is 0 as vanilla's ratio is)
    assert np.array_equal(F, Fv)
    assert markov.tv_bound(P, Q, F, G, init) < TOL and markov.exact_tv(P, Q, F, G, init) < TOL


@SETTINGS
@given(chain_case(max_V=6, max_L=1), st.integers(0, 3), st.sampled_from([0.1, 0.3, 1.0]))
def test_gstar_bound_is_zero_iff_grouped_acceptance_stays_below_p(case, window, p_thr):
    """GSD+G* at L = 1: B = exact TV = sum_s mu(s) sum_x [q f - p]_+ (T5), zero iff Q f <= P on the start rows."""
    P, Q, _, init, rng = case
    v, _ = _gsd_pair(len(P), rng, window, p_thr, 0.5, "optimal")
    F, G = markov.rule_tables(P, Q, 1, v)
    mu = np.zeros(len(P))
    if isinstance(init, int):
        mu[init] = 1
    else:
        mu = init
    excess = sum(mu[s] * sum(max(Q[s, x] * F[0, s, x] - P[s, x], 0.0) for x in range(len(P))) for s in range(len(P)))
    b, t = markov.tv_bound(P, Q, F, G, init), markov.exact_tv(P, Q, F, G, init)
    assert abs(b - excess) < TOL and abs(t - excess) < TOL
    assert (b < TOL) == (excess < TOL)


def test_grouping_can_be_stricter_than_vanilla_so_gstar_differs_from_the_release_residual():
    """Unlike scaled rules with w >= 1 (Proposition 1), f^GSD < f^van happens (token 0 of the hand example:
    11/12 < 1), and then G* != Norm([p - q]_+)."""
    v = rules.gsd(E6, window=2)
    f = v.accept(P6, Q6, 1)
    assert f[0] < rules.vanilla().accept(P6, Q6, 1)[0]
    assert np.abs(rules.Optimal()(P6, Q6, f) - v.resample(P6, Q6, f)).max() > 0.01
    # ... and where f >= vanilla everywhere, the two resamplers coincide (the argument of Proposition 1)
    p, q = np.array([0.4, 0.35, 0.25]), np.array([0.2, 0.3, 0.5])
    w = rules.gsd(np.array([[0.0], [0.5], [5.0]]), window=1)
    fw = w.accept(p, q, 1)
    assert np.all(fw >= rules.vanilla().accept(p, q, 1) - 1e-15)
    assert np.allclose(rules.Optimal()(p, q, fw), w.resample(p, q, fw), atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(0, 2**32 - 1))
def test_partition_groups_accept_at_least_as_much_as_vanilla(V, seed):
    """Groups that partition the vocabulary (whole-vocabulary windows, w >= 2V - 1; no probability test;
    tight clusters far apart): sum_G q f = min(P(G), Q(G)) >= sum_G min(p, q), so beta >= beta^van."""
    rng = np.random.default_rng(seed)
    centres = np.stack([10.0 * rng.integers(0, max(1, V // 3), size=V), np.zeros(V)], axis=1)
    E = centres + rng.uniform(-0.2, 0.2, size=(V, 2))     # inside a cluster d^2 <= 0.32, across >= 92
    p = rng.dirichlet(np.full(V, 0.5), size=20)
    q = rng.dirichlet(np.full(V, 0.5), size=20)
    v = rules.gsd(E, window=2 * V - 1, p_threshold=2.0, d_threshold=2.0)
    C = v.accept.close
    assert np.array_equal(C, C.T) and np.array_equal((C.astype(int) @ C.astype(int)) > 0, C)   # an equivalence
    beta = (q * v.accept(p, q, 1)).sum(-1)
    assert np.all(beta >= np.minimum(p, q).sum(-1) - 1e-12)
    if V >= 6:   # negative control: window 1 breaks the partition, and some row then accepts less than vanilla
        narrow = rules.gsd(E, window=1, p_threshold=2.0, d_threshold=2.0)
        rows = rng.dirichlet(np.full(V, 0.5), size=(2, 200))
        assert np.any((rows[1] * narrow.accept(rows[0], rows[1], 1)).sum(-1) < np.minimum(*rows).sum(-1) - 1e-12)


def test_grouping_can_accept_less_than_vanilla_on_a_chain():
    """The non-partition case (section 6b): the codebook chain of the docs, p_threshold 0.05, L = 3."""
    from sim.sources import codebook_source

    src = codebook_source(V=16, d=2, seed=1)
    e = {}
    for name, v in (("vanilla", rules.vanilla()), ("gsd", rules.gsd(src.embeddings, p_threshold=0.05))):
        e[name] = markov.expected_accepted(src.P, src.Q, markov.rule_tables(src.P, src.Q, 3, v)[0], src.init)
    assert e["gsd"] < e["vanilla"]


def test_equal_rows_accept_everything():
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(20), size=4)
    assert np.array_equal(rules.gsd(_planted(20, rng)).accept(p, p, 1), np.ones_like(p))


# ------------------------------------------------------------------ the simulator

def test_simulator_follows_the_enumerated_law():
    """x_{1:L+1} (with the start state) from sim.simulate_rule (the rule objects drawing the rejected token's
    replacement) against the law enumerated with the loop replay; a GSD with the distance test off (a
    different rule on the same chain) is the negative control that must be detected."""
    import sim
    from test_sim import ALPHA, brute_law, chisq_p, with_start

    from theory.markov import chains

    V, L, n = 4, 2, 60_000
    P, Q = chains.ambiguous_pair(V, spread=0.8, tv=0.45, seed=7)
    init = np.full(V, 0.25)
    E = np.array([[0.0], [0.5], [3.0], [3.4]])
    v = rules.gsd(E, window=1, p_threshold=0.3)
    ref = bf.RowRule(lambda i, p, q: bf.gsd_f(p, q, E.tolist(), 1, 0.3, 0.5), bf.residual_g_rows)
    law = brute_law(P, Q, ref, L, init)
    assert chisq_p(with_start(sim.simulate_rule(P, Q, v, L, init, n, seed=21)), law) >= ALPHA
    other = rules.gsd(window=1, p_threshold=0.3, d_threshold=None)
    bad = brute_law(P, Q, bf.RowRule(lambda i, p, q: bf.gsd_f(p, q, E.tolist(), 1, 0.3, None), bf.residual_g_rows),
                    L, init)
    lam = n * ((bad - law) ** 2 / np.where(law > 0, law, 1)).sum()
    assert lam > 200, lam                                     # the control is detectable at this n
    assert chisq_p(with_start(sim.simulate_rule(P, Q, other, L, init, n, seed=21)), law) < ALPHA


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("call, match", [
    (lambda: rules.gsd(), r"gsd: the embedding-distance test \(d_threshold=0.5\) needs the codebook vectors: pass embeddings"),
    (lambda: rules.gsd(np.zeros(5)), r"embeddings must be a non-empty \(V, d\) array"),
    (lambda: rules.gsd(np.full((4, 2), np.nan)), "NaN or infinite"),
    (lambda: rules.gsd(np.zeros((4, 2)), d_threshold=0.0), "d_threshold must be a number > 0"),
    (lambda: rules.gsd(np.zeros((4, 2)), d_threshold="x"), "d_threshold must be a number > 0"),
    (lambda: rules.gsd(np.zeros((4, 2)), window=-1), "window must be an int >= 0"),
    (lambda: rules.gsd(np.zeros((4, 2)), window=2.5), "window must be an int >= 0"),
    (lambda: rules.gsd(np.zeros((4, 2)), p_threshold=0), "p_threshold must be a finite number > 0"),
    (lambda: rules.gsd(np.zeros((4, 2)), resample="lantern"), "gsd: unknown resampler 'lantern'"),
    (lambda: rules.gsd(close=np.ones((3, 4), bool)), r"close must be a \(V, V\) bool table"),
    (lambda: rules.gsd(close=np.ones((3, 3))), "close must be a bool table"),
    (lambda: rules.gsd(np.zeros((4, 2))).accept(np.full(5, 0.2), np.full(5, 0.2), 1), "closeness table has 4 codes"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_table_memory_estimate_covers_the_group_gathers():
    from test_bad_input import _peak

    from theory.markov import chains

    V = 100
    P, Q = chains.ambiguous_pair(V, spread=0.5, tv=0.4, seed=0)
    E = _planted(V, np.random.default_rng(0))
    for window, L in ((7, 2), (2, 4), (0, 3)):
        v = rules.gsd(E, window=window)
        markov.rule_tables(P, Q, L, v)                         # warm-up
        peak = _peak(lambda: markov.rule_tables(P, Q, L, v, max_bytes=None))
        assert 0.8 <= markov.tables_bytes(v, V, L) / peak <= 1.2, (window, L, markov.tables_bytes(v, V, L), peak)
    assert methods.get("gsd").needs_embeddings
