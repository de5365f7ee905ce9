"""`sim.validate` (sim/validation.py) / `coolsd sim validate` and the statistics behind it: the default run passes with the
negative control flagged, a deliberately broken simulator is caught, and the chi-square / plug-in TV
helpers agree with scipy and with the known bias of the plug-in estimator."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sst

import sim.validation as va
from coolsd.cli import main
from sim import stats
from theory.markov import chains
from theory import markov, rules


def test_chi_square_matches_scipy_without_pooling_and_flags_impossible_cells():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(12) * 20)             # every expected count well above 5
    counts = rng.multinomial(5000, p)
    c = stats.chi_square(counts, p)
    ref = sst.chisquare(counts, 5000 * p)
    assert c.n_cells == 12 and c.df == 11
    assert c.stat == pytest.approx(ref.statistic, rel=1e-10) and c.pvalue == pytest.approx(ref.pvalue, rel=1e-8)
    # sparse cells are pooled to an expected count >= 5
    p2 = np.append(p * 0.999, [0.0005, 0.0005])
    c2 = stats.chi_square(rng.multinomial(2000, p2), p2)
    assert c2.n_cells < 14
    # an observation where the law has probability 0 is impossible: p = 0
    p3 = np.append(p, 0.0)
    counts3 = np.append(counts, 1)
    assert stats.chi_square(counts3, p3).pvalue == 0.0 and stats.chi_square(counts3, p3).impossible == 1


def test_chi_square_power_is_calibrated():
    """Power predicted by the noncentral approximation against the rejection rate of real tests."""
    rng = np.random.default_rng(1)
    p0 = rng.dirichlet(np.ones(10) * 3)
    p1 = 0.9 * p0 + 0.1 * rng.dirichlet(np.ones(10))
    n, alpha, reps = 600, 0.01, 400
    pred = stats.chi_square_power(n, p0, p1, alpha)
    rate = np.mean([stats.chi_square(rng.multinomial(n, p1), p0).pvalue < alpha for _ in range(reps)])
    assert 0.1 < pred < 0.95                       # a regime where the check can fail either way
    assert abs(rate - pred) <= 4 * np.sqrt(pred * (1 - pred) / reps) + 0.03


def test_plugin_tv_bias_matches_the_normal_approximation():
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(50))
    n = 4000
    mean, sd = stats.plugin_tv_null(p, p, n, reps=300, seed=3)
    approx = 0.5 * np.sqrt(2 * p * (1 - p) / (np.pi * n)).sum()   # E|N(0, p(1-p)/n)| summed, halved
    assert mean > 0 and abs(mean - approx) <= 0.05 * approx
    assert sd < 0.2 * mean


def test_tau_moments_against_the_distribution_of_tau():
    P, Q = chains.random_pair(5, tv=0.4, seed=4)
    F, _ = markov.rule_tables(P, Q, 4, rules.cool_sd(2.0))
    pr = markov.acceptance_probs(P, Q, F, 0)
    dist = np.append(1 - pr[0], np.append(pr[:-1] - pr[1:], pr[-1]))  # Pr(tau = 0..L)
    k = np.arange(5)
    m, var = stats.tau_moments(pr)
    assert m == pytest.approx((k * dist).sum(), abs=1e-12)
    assert var == pytest.approx((k**2 * dist).sum() - m**2, abs=1e-12)


@pytest.fixture(scope="module")
def default_report():
    return va.validate(paths=("table", "rule"))


def test_default_validation_passes_and_flags_the_negative_control(default_report):
    rep = default_report
    assert rep.ok, va.format_report(rep)
    names = {c.verifier for c in rep.checks}
    assert {"vanilla", "cool-sd", "uniform-rsd", "lantern", "neg-control"} <= names
    neg = [c for c in rep.checks if c.verifier == "neg-control" and c.check == "law vs P"]
    assert len(neg) == 4 and all(c.expected == "flag" and c.outcome == "flag" for c in neg)
    van = [c for c in rep.checks if c.verifier == "vanilla" and c.check == "law vs P"]
    assert van and all(c.outcome == "pass" for c in van)
    assert any(c.path.startswith("sequence") for c in rep.checks)
    text = va.format_report(rep)
    assert "ALL OK" in text and "SE=" in text and "n=" in text


def test_validation_catches_a_broken_simulator(monkeypatch):
    """A simulator that resamples from P instead of G (the negative control's bug, hidden inside the
    simulator) must make the law checks fail for the relaxed rules."""
    real = va.simulate

    def broken(P, Q, F, G, init, n, seed, backend="numpy"):
        return real(P, Q, F, np.broadcast_to(P, G.shape), init, n, seed, backend=backend)

    monkeypatch.setattr(va, "simulate", broken)
    case = va.default_chains()[1]
    rep = va.validate([case], [rules.vanilla(), rules.cool_sd(2.0)], paths=("table",), sequence_T=4)
    assert not rep.ok
    bad = {(c.verifier, c.check) for c in rep.checks if not c.ok}
    assert ("vanilla", "law vs P") in bad and ("cool-sd", "law vs Phat") in bad


def test_cli_exit_codes(capsys):
    assert main(["sim", "validate", "--paths", "table", "--json"]) == 0
    assert '"ok": true' in capsys.readouterr().out
    # too few rounds: the negative control cannot be detected, and the command says so with exit code 1
    assert main(["sim", "validate", "--paths", "table", "--n-rounds", "300"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["sim", "validate", "--paths", "tables"]) == 2
    assert "--paths takes table and/or rule" in capsys.readouterr().err
