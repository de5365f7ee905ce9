"""theory.likelihood.tune (schedules tuned on recorded rounds), Cool-SD's normalisations and the tune CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from theory.markov import chains, optimize
from theory import markov, rules
from theory.likelihood import tune

pytest.importorskip("jax")

L = 3


def chain_rows(P, Q, mu, n, seed):
    """Recorded rows of n simulated vanilla rounds on the chain (P, Q): the engine's own path
    (sim.simulate_rule drafts L tokens from Q), rows gathered along the drafted prefix."""
    from sim.rounds import simulate_rule

    r = simulate_rule(P, Q, rules.vanilla(), L, mu, n, seed=seed)
    pref = np.concatenate([r.start[:, None], r.drafts], axis=1)
    return tune.Rows(P[pref], Q[pref[:, :L]], r.drafts, None, np.arange(n) // 25)


def exact(P, Q, mu, w):
    """(E[tau], B) of the scaled rule with weights w and G*, exactly (T2, T4)."""
    F, G = optimize.scaled_tables(P, Q, w)
    return float(markov.expected_accepted(P, Q, F, mu)), float(markov.tv_bound(P, Q, F, G, mu))


@pytest.fixture(scope="module")
def setup():
    P, Q = chains.random_pair(5, tv=0.4, seed=3)
    mu = chains.stationary(P)
    # n from the standard error: at n = 5000 the predicted bound has SE ~ 0.0015, well below the gap of
    # ~0.09 between the optimal and the uniform schedule that the negative control must detect
    rows = chain_rows(P, Q, mu, 5000, seed=1)
    e_van = exact(P, Q, mu, np.ones(L))[0]
    T = e_van + 0.5 * (optimize.max_reachable(P, Q, L, mu) - e_van)
    res = tune.tune(rows, "free", tokens_per_call=1 + T, search_rounds=None)
    return P, Q, mu, rows, T, res


def test_recorded_optimiser_agrees_with_exact_theory(setup):
    P, Q, mu, rows, T, res = setup
    e, b = exact(P, Q, mu, res.values)
    # the target is met on the rows exactly and in expectation within sampling error
    assert abs(res.tokens_per_call - (1 + T)) < 1e-7
    assert abs(e - T) < 4 * res.tokens_per_call_se
    # exact optimum at the E[tau] the tuned weights really reach: the tuned rule cannot beat it, and is
    # within sampling error of it
    opt = optimize.optimal_schedule(P, Q, L, mu, e, n_random=0)
    assert b >= opt.tv_bound - 1e-7
    assert b - opt.tv_bound < 4 * res.bound_se
    # the in-sample predicted bound is within sampling error of the exact optimum at the target. The rows meet
    # the target exactly, so the error of the estimated E[tau] moves the weights along the frontier: the
    # error of the bound estimate is that of mean(T11_r - slope T10_r), slope = dB*/dE[tau] at the target
    opt_T = optimize.optimal_schedule(P, Q, L, mu, T, n_random=0)
    h = 0.02
    slope = (optimize.optimal_schedule(P, Q, L, mu, T + h, n_random=0).tv_bound
             - optimize.optimal_schedule(P, Q, L, mu, T - h, n_random=0).tv_bound) / (2 * h)
    pr = tune.predict(rows, res.verifier)
    z = pr["bound"] - slope * pr["accepted"]
    se = z.std(ddof=1) / math.sqrt(len(z))
    assert abs(res.bound - opt_T.tv_bound) < 4 * se
    # negative control: the uniform schedule tuned to the same target is detected as worse
    uni = tune.tune(rows, "uniform", tokens_per_call=1 + T)
    e_u, b_u = exact(P, Q, mu, uni.values)
    opt_u = optimize.optimal_schedule(P, Q, L, mu, e_u, n_random=0)
    assert b_u - opt_u.tv_bound > 4 * res.bound_se


def test_constraints_and_family_order(setup):
    P, Q, mu, rows, T, res = setup
    lo, hi = np.exp(tune.LOGW[0]), np.exp(tune.LOGW[1])
    assert np.all(res.values >= lo * (1 - 1e-12)) and np.all(res.values <= hi * (1 + 1e-12))
    # the reported figures are those of the rule object the engine runs (Explicit weights)
    pr = tune.predict(rows, rules.scaled(rules.Explicit(tuple(res.values))))
    assert math.isclose(pr["tokens_per_call"], res.tokens_per_call, rel_tol=1e-12)
    assert math.isclose(pr["bound_mean"], res.bound, rel_tol=1e-12)
    for fam in ("uniform", "exponential", "level"):
        r = tune.tune(rows, fam, tokens_per_call=1 + T)
        assert abs(r.tokens_per_call - (1 + T)) < 1e-7
        if fam == "level":
            assert np.all((r.values > 0) & (r.values <= 1))
        if fam == "uniform":
            assert np.allclose(r.values, r.values[0])
            assert res.bound <= r.bound + 1e-9      # free weights contain the uniform ones
    # budget mode: the bound meets the budget, and the free family is at least as fast as uniform there
    budget = 0.5 * res.bound
    rb = tune.tune(rows, "free", bound_budget=budget)
    ru = tune.tune(rows, "uniform", bound_budget=budget)
    assert rb.bound <= budget + 1e-9 and ru.bound <= budget + 1e-9
    assert rb.tokens_per_call >= ru.tokens_per_call - 1e-9


def test_out_of_range_targets_refused(setup):
    P, Q, mu, rows, T, res = setup
    van, top = tune.reachable(rows, "free")
    assert math.isclose(top, 1 + optimize.max_reachable(P, Q, L, mu), rel_tol=1e-12)  # P > 0 everywhere: top = 1 + L
    for bad in (van - 0.05, top + 0.1):
        with pytest.raises(ValueError, match=r"reachable range.*\[" + f"{van:.6g}".replace(".", r"\.")):
            tune.tune(rows, "free", tokens_per_call=bad)
    with pytest.raises(ValueError, match="exactly one"):
        tune.tune(rows, "free")
    with pytest.raises(ValueError, match="family"):
        tune.tune(rows, "cubic", tokens_per_call=1 + T)


def test_split_validation_and_bootstrap(setup):
    P, Q, mu, rows, T, res = setup
    v = tune.split_validation(rows, "uniform", tokens_per_call=1 + T, n_boot=100)
    h = v["heldout"]
    assert v["fit_images"] + v["heldout_images"] == np.unique(rows.image).size
    assert h["tokens_per_call_ci95"][0] <= h["tokens_per_call"] <= h["tokens_per_call_ci95"][1]
    assert h["bound_ci95"][0] <= h["bound"] <= h["bound_ci95"][1]
    # the held-out prediction of the half-fitted weights estimates the exact E[tau] of those weights
    e, _ = exact(P, Q, mu, np.array(v["values"]))
    assert h["tokens_per_call_ci95"][0] - 0.01 <= 1 + e <= h["tokens_per_call_ci95"][1] + 0.01
    no_img = tune.Rows(rows.p, rows.q, rows.drafts, rows.n_drafted, None)
    with pytest.raises(ValueError, match="image index"):
        tune.split_validation(no_img, "uniform", tokens_per_call=1 + T)


def test_frontier(setup):
    P, Q, mu, rows, T, res = setup
    sub = rows.subset(np.arange(1500))
    fr = tune.frontier(sub, families=("free", "uniform"), n_points=3, lo=0.2, hi=0.7, maxiter=20)
    van, top = tune.reachable(sub, "free")
    assert np.allclose(fr["targets"], van + np.linspace(0.2, 0.7, 3) * (top - van))
    for fam in ("free", "uniform"):
        t = [p["tokens_per_call"] for p in fr[fam]]
        b = [p["bound"] for p in fr[fam]]
        assert np.allclose(t, fr["targets"], atol=1e-7) and np.all(np.diff(b) > 0)   # faster costs more bound
    assert all(f["bound"] <= u["bound"] + 1e-9 for f, u in zip(fr["free"], fr["uniform"]))


def test_tree_rows_chain_tree_equals_chain_rows(setup):
    """A chain written as a static tree (one candidate per node) gives the same predictions and the same tuned
    schedule as the chain rows (predict_tree_rounds equals T10/T11 for a chain)."""
    from theory.tree import chain_tree

    P, Q, mu, rows, T, res = setup
    sub = rows.subset(np.arange(800))
    tokens = np.concatenate([np.zeros((sub.R, 1), np.int64), sub.drafts], axis=1)   # root token unused
    q = np.concatenate([sub.q, np.full((sub.R, 1, sub.q.shape[2]), 1.0 / sub.q.shape[2])], axis=1)  # leaf: placeholder
    tr = tune.TreeRows(sub.p, q, tokens, chain_tree(L), sub.image)
    v = rules.cool_sd(2.0)
    a, b = tune.predict(sub, v), tune.predict(tr, v)
    assert np.allclose(a["accepted"], b["accepted"]) and np.allclose(a["bound"], b["bound"])
    t = 0.5 * sum(tune.reachable(sub, "free"))
    rc = tune.tune(sub, "exponential", tokens_per_call=t, maxiter=20)
    rt = tune.tune(tr, "exponential", tokens_per_call=t, maxiter=20)
    assert abs(rt.tokens_per_call - t) < 1e-7 and np.allclose(rt.values, rc.values, rtol=1e-4)


def test_tree_rows_branching_tree():
    """On a branching tree (rows simulated on a chain): the target is met, free weights do no worse than
    uniform, an unreachable target is refused."""
    from theory.tree import Tree

    P, Q = chains.random_pair(4, tv=0.4, seed=7)
    rng = np.random.default_rng(0)
    tree = Tree(((0,), (1,), (0, 0), (1, 0)))
    R, V = 400, 4
    N = tree.n_nodes
    state = np.zeros((R, N + 1), np.int64)
    state[:, 0] = rng.integers(0, V, R)
    for n in range(N + 1):      # children drawn without replacement from Q(.|parent), by rank (small tree, test only)
        kids = [int(k) for k in tree.children[n] if k >= 0]
        for r in range(R):
            if kids:
                pick = rng.choice(V, len(kids), replace=False, p=Q[state[r, n]])
                state[r, kids] = pick
    tr = tune.TreeRows(P[state], Q[state], state, tree, np.arange(R) // 20)
    van, top = tune.reachable(tr, "free")
    t = van + 0.4 * (top - van)
    rf = tune.tune(tr, "free", tokens_per_call=t, maxiter=20)
    ru = tune.tune(tr, "uniform", tokens_per_call=t)
    assert abs(rf.tokens_per_call - t) < 1e-7 and rf.bound <= ru.bound + 1e-9
    with pytest.raises(ValueError, match="reachable range"):
        tune.tune(tr, "free", tokens_per_call=top + 0.1)


# --------------------------------------------------------------------------- Cool-SD normalisations

def test_cool_sd_norms():
    i = np.arange(1, 5, dtype=float)
    d, nu = 2.5, 0.7
    e = np.exp(-nu * (i - 1))
    assert np.allclose(rules.cool_sd_schedule(d, nu, "offset")(i, np), 1 + (d - 1) * e)
    assert np.allclose(rules.cool_sd_schedule(d, nu, "first")(i, np), d * e)
    assert np.allclose(rules.cool_sd_schedule(d, nu, "floor1")(i, np), np.maximum(1, d * e))
    w = rules.cool_sd_schedule(d, nu, "mean", L=4)(i, np)
    assert math.isclose(w.mean(), d) and np.allclose(w[1:] / w[:-1], math.exp(-nu))
    assert rules.COOL_SD_NORM == "offset" and rules.cool_sd(d).params["norm"] == "offset"
    assert math.isclose(rules.cool_sd(d, nu, mu=0.0).accept.schedule(1, np), d * math.exp(-nu))
    with pytest.raises(ValueError, match="norm"):
        rules.cool_sd(2.0, norm="bogus")
    with pytest.raises(ValueError, match="needs the draft length L"):
        rules.cool_sd(2.0, norm="mean")
    with pytest.raises(ValueError, match="not both"):
        rules.cool_sd(2.0, mu=0.0, norm="first")


def test_default_cool_sd_at_small_delta_beats_vanilla():
    """The paper's statement (delta = 1.1 already accepts more than vanilla) under the default; the old
    normalisation w_1 = delta is the negative control (it accepts less)."""
    P, Q = chains.random_pair(6, tv=0.3, seed=5)
    mu = chains.stationary(P)
    e = lambda v: float(markov.expected_accepted(P, Q, markov.rule_tables(P, Q, 4, v)[0], mu))  # noqa: E731
    van = e(rules.vanilla())
    ds = (1.1, 1.5, 2.0, 3.0, 4.0)
    default = [e(rules.cool_sd(x)) for x in ds]
    assert default[0] > van and np.all(np.diff(default) > 0)
    assert e(rules.cool_sd(1.1, norm="first")) < van


def test_level_rule_and_vector_schedule():
    P, Q = chains.random_pair(4, tv=0.3, seed=2)
    v = rules.Vanilla()(P, Q, 1)
    assert np.allclose(rules.Level(rules.Uniform(1e-300))(P, Q, 1), v)
    assert np.allclose(rules.Level(rules.Uniform(1.0))(P, Q, 1), 1.0)
    a = rules.Level(rules.Explicit((0.25, 0.5)))(P, Q, 2)
    assert np.allclose(a, v + 0.5 * (1 - v))
    w = np.array([2.0, 1.5, 0.5])
    i = np.arange(1, 4)
    assert np.allclose(rules.Vector(w)(i.astype(float), np), w)
    assert np.allclose(rules.Scaled(rules.Vector(w))(P[None], Q[None], i[:, None]),
                       rules.Scaled(rules.Explicit(tuple(w)))(P[None], Q[None], i[:, None]))
    with pytest.raises(ValueError, match="position 4"):
        rules.Vector(w)(4, np)


# --------------------------------------------------------------------------- CLI

def test_tune_cli(setup, tmp_path, capsys):
    from coolsd.cli import main

    P, Q, mu, rows, T, res = setup
    path = tmp_path / "rows.npz"
    sub = rows.subset(np.arange(1000))
    np.savez(path, p=sub.p, q=sub.q, drafts=sub.drafts, n_drafted=sub.n_drafted, image=sub.image)
    van, top = tune.reachable(sub, "uniform")
    out = tmp_path / "schedule.json"
    mid = 0.5 * (van + top)
    assert main(["tune", "--objective", "bound", "--record", str(path), "--tokens-per-call", str(mid), "--family",
                 "uniform", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert len(d["weights"]) == L and abs(d["predicted_tokens_per_call"] - mid) < 1e-7
    capsys.readouterr()
    assert main(["tune", "--objective", "bound", "--record", str(path), "--tokens-per-call", str(top + 0.5)]) == 2
    err = capsys.readouterr().err
    assert "reachable range" in err and f"{van:.6g}" in err and f"{top:.6g}" in err
    assert main(["tune", "--record", str(tmp_path / "missing.npz"), "--tokens-per-call", "2"]) == 2
    capsys.readouterr()
    assert main(["tune", "--record", str(path), "--tokens-per-call", str(mid)]) == 2     # kl (default) needs a stamp
    assert "no stamp" in capsys.readouterr().err


def test_generate_scaled_weights(tmp_path, capsys):
    from coolsd.cli import main
    from theory.rules.methods import weights_value as parse_weights     # the registry's --weights parser

    sched = tmp_path / "s.json"
    sched.write_text(json.dumps({"weights": [3.0, 1.2, 1.0, 1.0]}))
    assert parse_weights(str(sched)) == (3.0, 1.2, 1.0, 1.0) and parse_weights("2,1") == (2.0, 1.0)
    rec = tmp_path / "r.npz"
    assert main(["generate", "--model", "mnist", "--method", "scaled", "--weights", str(sched), "--num-images", "2",
                 "--record", str(rec), "--json"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d["verifier"] == "scaled" and d["tokens"] == 2 * 49
    z = np.load(rec)
    assert set(np.unique(z["image"])) == {0, 1} and len(z["image"]) == len(z["drafts"])
    assert main(["generate", "--model", "mnist", "--method", "scaled", "--weights", "2,1", "--json"]) == 2
    assert main(["generate", "--model", "mnist", "--method", "scaled", "--json"]) == 2
    for bad in ("0,1,1,1", "a,b"):
        with pytest.raises(ValueError, match="weights"):
            parse_weights(bad)
