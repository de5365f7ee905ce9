"""theory.likelihood.tree_mc (T14, docs/theory.md section 11c): the Monte Carlo likelihood of sampled static trees,
against the brute-force enumeration of whole tree rounds (tests/bruteforce_tree.py, nothing of the package), with
tolerances from the estimator's own standard errors; negative controls (a wrong residual law, a wrong draw law); the
coverage of the KL interval the fidelity report builds from the estimates, in a fixed-seed repeated experiment."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bruteforce_tree import all_sequences, context_rows, process_law, static_tree_at, teacher_rows
from test_tree_likelihood import TREES, scalar_rule
from theory import rules
from theory.likelihood import fidelity, tree_log_likelihood
from theory.likelihood import tree_mc
from theory.likelihood.tree_mc import tree_log_likelihood_mc
from theory.rules.resampling import Residual
from theory.tree import Tree

RULES = ["vanilla", "cool-sd", "uniform-rsd", "scaled", "level", "typical", "gsd", "lantern", "lantern++", "lantern+G*"]
Z = 6.0            # |mean - exact| <= Z standard errors of the mean (per sequence; a few hundred comparisons per run)


def _enumerated(rule, tree, V, T, seed, convention="eagle", zp=0.2):
    """(verifier, Tree, sequences (S, T), p, q, exact law (S,)) by enumeration (sampled candidates, q per depth)."""
    rng = np.random.default_rng(seed)
    verifier, f_rule, g_rule = scalar_rule(rule, V, rng)
    paths = TREES[tree]
    D = max(len(t) for t in paths)
    prow, qrow = context_rows(rng, V, T, D, True, zp)
    law = process_law(prow, qrow, f_rule, g_rule, T, convention, "sampled", static_tree_at(paths))
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, D, True)
    return verifier, Tree(paths), seqs, p, q, np.array([law.get(tuple(s), 0.0) for s in seqs])


def _replicated(p, q, seqs, verifier, tree, n, seed, **kw):
    """n independent estimates of every sequence (the batch axis replicates: each row draws its own samples):
    (n, S) arrays of the pooled P^_hat and the jackknife log P^."""
    tile = lambda a: np.broadcast_to(a, (n, *a.shape))           # noqa: E731
    o = tree_log_likelihood_mc(tile(p), tile(q), tile(seqs), verifier, tree, seed=seed, **kw)
    return np.exp(o["log_p_hat_pooled"]), o["log_p_hat"], o["se"]


REL = 2e-3         # ... plus REL x exact: a rejection of probability below ~1 / (draws) may go unseen in a run, and
#                    with it its share of the mean (at small V a row's rejection law can put 0.2% on a second token)


def _z(est, exact):
    """max over sequences of |mean - exact| / (SE of the mean + REL exact / Z): below Z passes."""
    m, se = est.mean(0), est.std(0, ddof=1) / math.sqrt(est.shape[0])
    return float(np.max(np.abs(m - exact) / (se + REL * exact / Z + 1e-15)))


@settings(max_examples=25, deadline=None)
@given(rule=st.sampled_from(RULES), tree=st.sampled_from(["three", "eagle"]), V=st.integers(3, 5),
       T=st.integers(2, 4), seed=st.integers(0, 2**32 - 1))
@example(rule="cool-sd", tree="eagle", V=5, T=3, seed=709)   # a first rejection of probability 4e-4 carrying 15%
def test_unbiased_against_enumeration(rule, tree, V, T, seed):
    """E[P^_hat(x)] = P^(x) for every sequence (V <= 5, up to 3 root candidates, depth <= 3), every rule family: the
    mean of 400 independent pooled estimates (2 groups x 2 draws per row: the noisiest setting) within Z standard
    errors of the enumeration; zero where the law is zero; and the exact path (``tree_log_likelihood``) agrees."""
    if V ** T > 125:
        T = 3
    verifier, tr, seqs, p, q, exact = _enumerated(rule, tree, V, T, seed)
    np.testing.assert_allclose(np.exp(tree_log_likelihood(p, q, seqs, verifier, tr, candidates="sampled")), exact,
                               rtol=1e-11, atol=1e-15)
    P, _, _ = _replicated(p, q, seqs, verifier, tr, 400, seed % 1000, samples=2, groups=2)
    assert np.all(P[:, exact == 0] == 0)
    assert _z(P, exact) < Z


def test_negative_controls_are_detected(monkeypatch):
    """The same check fails for a planted wrong residual (the vanilla residual for G*: they differ where the weight is
    below 1, as the "scaled" rule's 0.6 at position 1) and a planted wrong draw
    law (the rejected candidates drawn from u^0.3: skewed to the end of the rejection law, not reweighted; on cool-sd
    rows, where the draws matter: the scaled rule's rows happen to give every draw the same estimate)."""
    verifier, tr, seqs, p, q, exact = _enumerated("scaled", "three", 4, 4, 7)
    P, _, _ = _replicated(p, q, seqs, verifier, tr, 400, 1, samples=2, groups=2)
    assert _z(P, exact) < Z                                            # the right estimator passes
    wrong = rules.Verifier(verifier.accept, Residual())
    Pw, _, _ = _replicated(p, q, seqs, wrong, tr, 400, 1, samples=2, groups=2)
    assert _z(Pw, exact) > 3 * Z

    draw = np.random.default_rng

    class Skewed:
        def __init__(self, seed):
            self.g = draw(seed)

        def random(self, shape):
            return self.g.random(shape) ** 0.3

    verifier, tr, seqs, p, q, exact = _enumerated("cool-sd", "three", 4, 4, 7)     # rows with Monte Carlo noise
    P, _, _ = _replicated(p, q, seqs, verifier, tr, 400, 1, samples=1, groups=4)   # (1 draw per group: every
    assert _z(P, exact) < Z                                                         # first rejection is drawn)
    monkeypatch.setattr(tree_mc.np.random, "default_rng", Skewed)
    Ps, _, _ = _replicated(p, q, seqs, verifier, tr, 400, 1, samples=1, groups=4)
    monkeypatch.undo()
    assert _z(Ps, exact) > 3 * Z


def test_small_first_rejections_are_summed_exactly():
    """Where every row's first rejection law has at most ``samples`` tokens and no node has more than 2 children (the
    EAGLE-like tree: one rejection is drawn at most), each group enumerates the rejected identity: P^_hat equals the
    enumeration to rounding, with SE 0. Control: with fewer draws per group than support tokens the same rows carry
    Monte Carlo error (some sequence's estimate is off by more than 1e-6 relative)."""
    verifier, tr, seqs, p, q, exact = _enumerated("cool-sd", "eagle", 4, 3, 7)
    P, _, se = _replicated(p, q, seqs, verifier, tr, 3, 4, samples=4, groups=2)
    np.testing.assert_allclose(P, np.broadcast_to(exact, P.shape), rtol=1e-10, atol=1e-300)
    assert np.all(se[:, exact > 0] == 0)
    Pc, _, _ = _replicated(p, q, seqs, verifier, tr, 3, 4, samples=1, groups=2)
    assert np.max(np.abs(Pc - exact) / np.maximum(exact, 1e-300)) > 1e-6


def test_jackknife_bias_and_se():
    """The jackknife log estimate's mean error is within 4 of its standard errors of zero (the pooled log's bias,
    -Var/(2 P^2), is removed to second order), and the jackknife SE is the estimates' spread within 30%."""
    verifier, tr, seqs, p, q, exact = _enumerated("cool-sd", "eagle", 4, 4, 3)
    keep = exact > 0
    seqs, p, q, exact = seqs[keep][:40], p[keep][:40], q[keep][:40], exact[keep][:40]
    _, J, se = _replicated(p, q, seqs, verifier, tr, 300, 2, samples=1, groups=8)
    err = J - np.log(exact)
    sd = err.std(0, ddof=1)
    noisy = sd > 1e-6
    assert noisy.sum() >= 10
    zb = np.abs(err.mean(0)[noisy]) / (sd[noisy] / math.sqrt(err.shape[0]))
    assert np.max(zb) < 4.5
    ratio = np.sqrt(np.mean(se[:, noisy] ** 2, axis=0)) / sd[noisy]
    assert np.all((ratio > 0.7) & (ratio < 1.3)), ratio


def test_kl_interval_covers():
    """The fidelity report's KL(P^||P) interval (mean_ci over images of the estimated log P^ - log P: the between-image
    spread includes the Monte Carlo error, each image drawing its own) covers the exact KL in at least 90.4% of 200
    fixed-seed experiments of 30 images (nominal 95%, less 3 binomial SEs), on LANTERN rows where the Monte Carlo
    variance of log P^_hat is about 0.02 at 1 draw x 2 groups. Negative control: the same experiments scored with a
    planted wrong residual (the vanilla residual for LANTERN's law) cover less than that."""
    verifier, tr, seqs, p, q, exact = _enumerated("lantern", "eagle", 4, 4, 8, zp=0.0)
    lp = np.sum(np.log(np.take_along_axis(p, seqs[..., None], -1)[..., 0]), axis=-1)
    keep = exact > 0
    T = seqs.shape[1]
    kl = float(np.sum(exact[keep] * (np.log(exact[keep]) - lp[keep]))) / T
    rng = np.random.default_rng(0)
    n, reps = 30, 200
    idx = rng.choice(len(seqs), size=(reps, n), p=exact / exact.sum())

    def coverage(v):
        o = tree_log_likelihood_mc(p[idx], q[idx], seqs[idx], v, tr, samples=1, groups=2, seed=5)
        hit = 0
        for r in range(reps):   # a loop over experiments (the report's own interval, as --fidelity builds it)
            d = fidelity.kl_sd(o["log_p_hat"][r], lp[idx[r]], T=T)["per_token"]
            hit += d["ci"][0] <= kl <= d["ci"][1]
        return hit / reps, float(np.var(o["log_p_hat"] - np.log(exact[idx])))

    cov, mc_var = coverage(verifier)
    assert mc_var > 0.01 and cov >= 0.904, (cov, mc_var)
    bad, _ = coverage(rules.Verifier(verifier.accept, Residual()))
    assert bad < 0.904, bad


def test_refusals_before_work():
    """One-line errors: groups < 2, samples < 1, a dynamic tree (row_trees) is not this estimator's."""
    verifier, tr, seqs, p, q, _ = _enumerated("cool-sd", "three", 3, 2, 1)
    with pytest.raises(ValueError, match="groups"):
        tree_log_likelihood_mc(p, q, seqs, verifier, tr, groups=1)
    with pytest.raises(ValueError, match="samples"):
        tree_log_likelihood_mc(p, q, seqs, verifier, tr, samples=0)
    with pytest.raises(ValueError, match="tree must be"):
        tree_log_likelihood_mc(p, q, seqs, verifier, None)


def test_torch_gives_numpy_bits():
    """The same draws (seed) on torch tensors give numpy's estimates bit for bit (array API code)."""
    torch = pytest.importorskip("torch")
    verifier, tr, seqs, p, q, exact = _enumerated("cool-sd", "three", 4, 3, 7)
    a = tree_log_likelihood_mc(p, q, seqs, verifier, tr, seed=1)
    b = tree_log_likelihood_mc(*(torch.from_numpy(x) for x in (p, q, seqs)), verifier, tr, seed=1)
    for k in ("log_p_hat", "se"):
        np.testing.assert_array_equal(b[k].numpy(), a[k])
