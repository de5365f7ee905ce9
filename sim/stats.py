"""Small statistics used to compare simulated rounds with the exact theory: chi-square goodness of fit
(with pooling of sparse cells) and its power, the law of the plug-in TV estimator, z-scores of tau."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

__all__ = ["ChiSquare", "chi_square", "chi_square_power", "sequence_counts", "plugin_tv", "plugin_tv_null",
           "tau_moments", "MIN_EXPECTED", "ZERO_PROB"]

MIN_EXPECTED = 5.0     # the usual rule for the chi-square approximation: expected count >= 5 per cell
ZERO_PROB = 1e-14      # exact laws are sums of products; |p| below this is float noise around an exact 0


@dataclass(frozen=True)
class ChiSquare:
    stat: float
    df: int
    pvalue: float
    n_cells: int               # cells after pooling
    impossible: int            # observations in cells of probability 0 (any -> p = 0)


def _pool(expected: np.ndarray, min_expected: float) -> np.ndarray:
    """Cell -> group id: cells with expected count < min_expected are pooled into one group, which is
    grown with the next smallest cells until it reaches min_expected. Zero-probability cells get -1."""
    group = np.full(expected.shape, -1, np.int64)
    pos = np.flatnonzero(expected > 0)
    order = pos[np.argsort(expected[pos], kind="stable")]
    small = expected[order] < min_expected
    n_small = int(small.sum())
    if n_small:
        cum = np.cumsum(expected[order])
        n_small = max(n_small, int(np.searchsorted(cum, min_expected)) + 1)  # grow the pool to >= min_expected
        n_small = min(n_small, order.size)
    group[order[:n_small]] = 0
    group[order[n_small:]] = np.arange(order.size - n_small) + (1 if n_small else 0)
    return group


def chi_square(counts, probs, min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Pearson chi-square of observed ``counts`` against the law ``probs`` (same shape, any dims).

    Sparse cells are pooled (expected >= ``min_expected`` per cell). A count in a cell of probability
    0 (|p| < ZERO_PROB) is an impossible event under the law: p-value 0.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    if counts.shape != probs.shape:
        raise ValueError(f"chi_square: counts {counts.shape} and probs {probs.shape} differ in size")
    n = counts.sum()
    p = np.where(np.abs(probs) < ZERO_PROB, 0.0, probs)
    impossible = int(counts[p <= 0].sum())
    group = _pool(n * p, min_expected)
    k = int(group.max()) + 1
    obs = np.bincount(group[group >= 0], weights=counts[group >= 0], minlength=k)
    exp = np.bincount(group[group >= 0], weights=n * p[group >= 0], minlength=k)
    exp *= obs.sum() / exp.sum() if exp.sum() > 0 else 1.0   # renormalise the float-noise-free cells
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = max(k - 1, 1)
    pval = 0.0 if impossible else float(_st.chi2.sf(stat, df))
    return ChiSquare(stat, df, pval, k, impossible)


def chi_square_power(n: int, null, alt, alpha: float, min_expected: float = MIN_EXPECTED) -> float:
    """Power of the pooled chi-square test at level ``alpha`` with n samples from ``alt`` against ``null``
    (noncentral chi-square approximation, lambda = n sum (alt - null)^2 / null over pooled cells).
    Mass of ``alt`` on cells where ``null`` is 0 makes the test reject once observed: that probability
    is folded in as 1 - (1 - power) (1 - m)^n."""
    null = np.where(np.abs(np.ravel(null)) < ZERO_PROB, 0.0, np.ravel(null))
    alt = np.clip(np.ravel(alt), 0.0, None)
    group = _pool(n * null, min_expected)
    k = int(group.max()) + 1
    p0 = np.bincount(group[group >= 0], weights=null[group >= 0], minlength=k)
    p1 = np.bincount(group[group >= 0], weights=alt[group >= 0], minlength=k)
    lam = n * float(((p1 / p1.sum() - p0) ** 2 / p0).sum()) if p1.sum() > 0 else 0.0
    df = max(k - 1, 1)
    power = float(_st.ncx2.sf(_st.chi2.isf(alpha, df), df, lam)) if lam > 0 else alpha
    m = float(alt[group < 0].sum())
    return 1 - (1 - power) * (1 - m) ** n


def sequence_counts(tokens: np.ndarray, V: int) -> np.ndarray:
    """Counts of each sequence x_{1:L+1}: tokens (n, L+1) -> array of shape (V,) * (L+1)."""
    tokens = np.asarray(tokens)
    shape = (V,) * tokens.shape[1]
    idx = np.ravel_multi_index(tokens.T, shape)
    return np.bincount(idx, minlength=V ** tokens.shape[1]).reshape(shape)


def plugin_tv(counts, ref) -> float:
    """Plug-in TV between the empirical law of ``counts`` and the law ``ref``: 1/2 sum |counts/n - ref|."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    return 0.5 * float(np.abs(counts / counts.sum() - np.ravel(ref)).sum())


def plugin_tv_null(law, ref, n: int, reps: int = 200, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of the plug-in TV(empirical(n draws from ``law``), ``ref``), by
    ``reps`` multinomial draws (a parametric bootstrap under the exact law). The plug-in is biased
    upward by sampling noise (about sum sqrt(law (1 - law) / (2 pi n)) where law = ref); this is the
    reference the observed plug-in TV is compared with."""
    law = np.clip(np.ravel(law), 0.0, None)
    law = law / law.sum()
    ref = np.ravel(ref)
    draws = np.random.default_rng(seed).multinomial(n, law, size=reps)
    tvs = 0.5 * np.abs(draws / n - ref).sum(1)
    return float(tvs.mean()), float(tvs.std(ddof=1))


def tau_moments(acceptance_probs) -> tuple[float, float]:
    """E[tau] and Var(tau) from Pr(tau >= i), i = 1..L (T8): E[tau^2] = sum_i (2i - 1) Pr(tau >= i)."""
    pr = np.asarray(acceptance_probs, dtype=np.float64)
    i = np.arange(1, pr.size + 1)
    m = float(pr.sum())
    return m, max(float(((2 * i - 1) * pr).sum()) - m * m, 0.0)


def z_score(value: float, mean: float, se: float) -> float:
    return (value - mean) / se if se > 0 else (0.0 if value == mean else math.copysign(math.inf, value - mean))
