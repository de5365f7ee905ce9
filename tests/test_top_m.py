"""theory.core.xp.top_m: the m largest entries, ties to the lower index, equal to the full stable sort on numpy and
torch (hypothesis, values drawn from a few levels so ties are common, ties straddling the m-th place included), and a
planted control: the partition without the tie check is caught by the same property."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from theory.core.xp import top_m


def _reference(x, m):
    return np.argsort(-x, axis=-1, kind="stable")[..., :m]


def _no_tie_check(x, m):   # the control: argpartition, winners ordered by value then index, no straddle check
    V = x.shape[-1]
    idx = np.argpartition(x, V - m, axis=-1)[..., V - m:]
    val = np.take_along_axis(x, idx, -1)
    return np.take_along_axis(idx, np.lexsort((idx, -val), axis=-1), -1)


rows = st.integers(2, 40).flatmap(lambda V: st.tuples(
    st.lists(st.lists(st.integers(0, 3), min_size=V, max_size=V), min_size=1, max_size=4), st.integers(1, V)))


@settings(max_examples=300, deadline=None)
@given(rows)
def test_top_m_equals_the_stable_sort(case):
    x, m = np.asarray(case[0], dtype=np.float64), case[1]
    want = _reference(x, m)
    assert np.array_equal(top_m(x, m), want)
    assert np.array_equal(top_m(torch.from_numpy(x), m).numpy(), want)
    assert top_m(x, m).dtype == np.int64


def test_top_m_keeps_leading_axes_and_continuous_rows():
    x = np.random.default_rng(0).dirichlet(np.ones(1024) * 0.3, size=(3, 5))
    assert top_m(x, 10).shape == (3, 5, 10)
    assert np.array_equal(top_m(x, 10), _reference(x, 10))


def test_the_control_without_the_tie_check_is_caught():
    x = np.array([[1.0, 2.0, 2.0, 2.0, 0.0, 2.0]])          # four tied at the top, m = 2: ids 1 and 2 are in
    assert np.array_equal(top_m(x, 2), [[1, 2]])
    found = False
    rng = np.random.default_rng(1)
    for _ in range(200):                                     # the property above would flag the control
        y = rng.integers(0, 3, size=(4, 9)).astype(float)
        if not np.array_equal(_no_tie_check(y, 3), _reference(y, 3)):
            found = True
            break
    assert found


@pytest.mark.parametrize("m", [0, 6, 9])
def test_top_m_edges(m):
    x = np.array([[0.1, 0.3, 0.3, 0.2, 0.05, 0.05]])
    assert np.array_equal(top_m(x, m), _reference(x, m))
