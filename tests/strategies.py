"""Hypothesis strategies: random chains with edge cases (zeros in P and Q, P = Q rows, f in {0, 1})."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


def _rows(rng, V, n, zero_prob):
    a = rng.gamma(rng.choice([0.3, 1.0, 5.0]), size=(n, V))
    a[rng.random((n, V)) < zero_prob] = 0.0
    empty = a.sum(1) == 0
    a[empty, rng.integers(V, size=empty.sum())] = 1.0
    return a / a.sum(1, keepdims=True)


@st.composite
def chain_case(draw, max_V=5, max_L=3, max_seq=4000):
    """(P, Q, L, init, rng): P, Q (V, V) row-stochastic with zeros, init an int or a distribution."""
    V = draw(st.integers(2, max_V))
    L = draw(st.integers(1, max_L))
    if V ** (L + 1) > max_seq:
        L = max(1, int(np.log(max_seq) / np.log(V)) - 1)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    zp = draw(st.sampled_from([0.0, 0.2, 0.4]))
    P = _rows(rng, V, V, zp)
    Q = _rows(rng, V, V, zp)
    same = rng.random(V) < 0.2
    Q[same] = P[same]  # some rows with P = Q (beta = 1 under vanilla)
    if draw(st.booleans()):
        init = int(rng.integers(V))
    else:
        init = _rows(rng, V, 1, zp)[0]
    return P, Q, L, init, rng


def random_tables(rng, L, V):
    """Random F in [0, 1] with exact 0s and 1s, random stochastic G (with zeros)."""
    F = rng.random((L, V, V))
    F[rng.random(F.shape) < 0.15] = 0.0
    F[rng.random(F.shape) < 0.15] = 1.0
    G = _rows(rng, V, L * V, 0.3).reshape(L, V, V)
    return F, G
