"""theory.rules.lantern_walk: a level of many entries settled rank by rank (``_by_rank``: every round's sibling j read
from the row its earlier siblings' rejections zeroed, the admitted mass A_j decided from the bounds ``whole_bounds``
gives of the whole neighbour sum, and summed exactly only where they do not decide) against the stamps-and-fixed-point
layout, bit for bit (hypothesis): the same first accepted sibling of every round and the same residual rows, or None
alike; float32 and float64 rows with exact zeros, absolute and relative thresholds, repeated siblings and siblings
among each other's neighbours, prefixes of the ranks, uniforms anywhere, at the layouts' thresholds and one ulp below
(where a bound without headroom would decide wrongly). Control: with bounds without headroom (slack 0) the rank layout
misdecides some siblings at their thresholds."""
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_lantern_one_round import _case as one_round_case, _settle as one_round_settle
from test_lantern_one_round import _thresholds as one_round_thresholds

LW = sys.modules["theory.rules.lantern_walk"]


def _case(seed, V, B, K, dtype, relative):
    """``test_lantern_one_round``'s case (a LANTERN acceptance, rows, candidates with repeats and siblings among each
    other's neighbours, uniforms often inside the bounds) with tried (B, K) prefixes of the ranks in every round, at
    least two rounds trying (``ROUNDS_APART`` = 1 below: one alone takes ``_one_round``)."""
    acc, p, c, _, u = one_round_case(seed, V, B, K, dtype, relative)
    has = np.arange(K) < np.random.default_rng(seed).integers(0, K + 1, size=B)[:, None]
    has[:2, 0] = True
    return acc, p, c, has, u


def _settle(acc, p, c, has, u, by_rank, mp):
    """``test_lantern_one_round``'s settle (each round's first accepted rank, K: none; the stopped rounds' residual
    rows; or None) of the level step rank by rank (``by_rank``) or in the stamps layout (at least two rounds try)."""
    mp.setattr(LW, "RANK_BY_RANK", 0 if by_rank else 1 << 40)
    mp.setattr(LW, "ROUNDS_APART", 1)                                         # (not round by round)
    return one_round_settle(acc, p, c, has, u, True)


def _uniforms(acc, p, c, has, u, mp):
    """The uniforms tried: u, and for each rank j the thresholds themselves (all rejected there) with rank j one ulp
    below its threshold in every round (accepted there when reached)."""
    mp.setattr(LW, "RANK_BY_RANK", 1 << 40)                                    # (the stamps layout's)
    t = one_round_thresholds(acc, p, c, has)
    if t is None:
        return [u]
    at = np.where(np.isnan(t), 0.5, t)
    out = [u, at]
    for j in range(c.shape[1]):   # a loop over the sibling ranks (test code)
        below = at.copy()
        below[:, j] = np.where(np.isnan(t[:, j]), 0.5, np.nextafter(at[:, j], 0.0))
        out.append(below)
    return out


def _mismatches(acc, p, c, has, u, mp) -> tuple[int, int]:
    """(uniforms tried, those on which the rank layout and the stamps layout differ)."""
    n = bad = 0
    for uu in _uniforms(acc, p, c, has, u, mp):   # a loop over a handful of uniform sets (test code)
        got, ref = (_settle(acc, p, c, has, uu, r, mp) for r in (True, False))
        n += 1
        bad += (got is None) != (ref is None) or (ref is not None and not (
            np.array_equal(got[0], ref[0]) and got[1].tobytes() == ref[1].tobytes()))
    return n, bad


@settings(max_examples=250, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([6, 12, 50, 300]), B=st.integers(2, 6),
       K=st.integers(1, 5), dtype=st.sampled_from([np.float32, np.float64]), relative=st.booleans())
def test_rank_by_rank_equals_the_stamps_layout_bit_for_bit(seed, V, B, K, dtype, relative):
    acc, p, c, has, u = _case(seed, V, B, K, dtype, relative)
    mp = pytest.MonkeyPatch()
    try:
        n, bad = _mismatches(acc, p, c, has, u, mp)
    finally:
        mp.undo()
    assert n >= 1 and bad == 0


def test_control_bounds_without_headroom_misdecide_at_thresholds(monkeypatch):
    """Control: the rank layout with ``whole_bounds`` given slack 0 (the float64 neighbour sum's value as the whole
    sum's bounds) decides some siblings at their thresholds otherwise than the stamps layout; with the slack it does
    not (those cases pass above)."""
    wrong = 0
    for seed in range(60):
        acc, p, c, has, u = _case(seed, 300, 6, 5, np.float32, False)
        with monkeypatch.context() as m:
            m.setattr(LW, "whole_slack", lambda k, dtype: 0.0)
            wrong += _mismatches(acc, p, c, has, u, m)[1]
        assert _mismatches(acc, p, c, has, u, monkeypatch)[1] == 0
    assert wrong >= 5
