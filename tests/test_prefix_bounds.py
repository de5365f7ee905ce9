"""theory.rules.prefix_mass.whole_bounds: bounds of the whole sum ``prefix_rows`` takes of k non-negative masses in the
rows' dtype (its sequential sums), from a float64 sum of those k and one more mass. The bounds bracket the whole sums
of float32 and float64 masses (hypothesis: widths 1 to 2,000, scales from subnormal to 1, exact zeros, a dominant last
mass, the float64 sum pairwise or sequential). Control: bounds without headroom (slack 0) miss some whole sums."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from theory.rules.prefix_mass import prefix_rows, whole_bounds, whole_slack


def _masses(seed, m, k, dtype, scale):
    """(g (m, k), last (m,)) non-negative masses in ``dtype``: skewed, about a tenth exactly 0, every fifth entry's
    last mass dominant."""
    rng = np.random.default_rng(seed)
    g = (rng.random((m, k)) ** 4 * scale).astype(dtype)
    g[rng.random(g.shape) < 0.1] = 0.0
    last = (rng.random(m) * scale).astype(dtype)
    last[::5] = dtype(scale * k)
    return g, last


def _totals(g, last):
    """The float64 sums of each row's k masses and its last one: numpy's (pairwise) and a sequential one."""
    both = np.concatenate([g, last[:, None]], 1).astype(np.float64)
    return both.sum(-1), np.cumsum(both, -1)[:, -1]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 40), k=st.sampled_from([1, 2, 3, 31, 64, 1000, 2000]),
       dtype=st.sampled_from([np.float32, np.float64]), scale=st.sampled_from([1e-44, 1e-39, 1e-20, 1e-4, 1.0]))
def test_whole_bounds_bracket_the_whole_sums(seed, m, k, dtype, scale):
    g, last = _masses(seed, m, k, dtype, scale)
    slack = whole_slack(k, dtype)
    whole = prefix_rows(g, np.inf, dtype)                                   # (every prefix admitted: the whole sum)
    assert whole.tobytes() == (np.cumsum(g, 1)[:, -1] + np.zeros((), dtype)).tobytes()
    for total in _totals(g, last):
        lo, hi = whole_bounds(total, last, slack, dtype)
        assert lo.dtype == hi.dtype == dtype
        assert (lo <= whole).all() and (whole <= hi).all()


def test_whole_bounds_nan_and_wide_sums():
    """A NaN total gives NaN bounds; too many masses for the linear bounds give no slack."""
    lo, hi = whole_bounds(np.array([np.nan, 1.0]), np.zeros(2, np.float32), whole_slack(10, np.float32), np.float32)
    assert np.isnan(lo[0]) and np.isnan(hi[0]) and lo[1] <= 1.0 <= hi[1]
    assert whole_slack(10**6, np.float32) is None and whole_slack(10**6, np.float64) is not None


def test_control_bounds_without_headroom_miss_whole_sums():
    """Control: slack 0 (the float64 sum's value, cast) leaves some float32 whole sums outside the bounds."""
    missed = 0
    for seed in range(40):
        g, last = _masses(seed, 20, 1000, np.float32, 1e-4)
        whole = prefix_rows(g, np.inf, np.float32)
        lo, hi = whole_bounds(_totals(g, last)[0], last, 0.0, np.float32)
        missed += int(np.count_nonzero((whole < lo) | (whole > hi)))
    assert missed >= 20
