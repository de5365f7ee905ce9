"""T10-T11: per-round predictions from recorded rows average, over drafts ~ Q, to the exact E[tau] and B.
The average over all V^L draft paths is computed exactly by enumeration (no sampling noise)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import chain_case
from theory import markov, rules
from theory.recorded import predict_rounds

TOL = 1e-10


def _all_paths(P, Q, L, s):
    """Rows along every draft path from state s, with the path's probability under Q."""
    V = len(P)
    paths = np.array(list(itertools.product(range(V), repeat=L)))
    prev = np.concatenate([np.full((len(paths), 1), s), paths], axis=1)   # h_{i-1} last tokens
    weight = np.prod(Q[prev[:, :-1], paths], axis=1)
    return P[prev], Q[prev[:, :-1]], paths, weight


def _verifiers(V, rng):
    out = [rules.vanilla(), rules.cool_sd(2.5), rules.uniform_rsd(1.7), rules.linear_rsd(3.0, 0.8, 4),
           rules.typical(), rules.greedy()]
    if V >= 3:  # LANTERN's resampler needs k + 1 <= V - 1 neighbours
        nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
        k = min(2, V - 2)
        out += [rules.lantern(nb, k, 0.3), rules.lantern_pp(nb, k, 2.0)]
    return out


@settings(max_examples=25, deadline=None)
@given(chain_case(max_V=5, max_L=3))
def test_predictions_average_to_exact_theory(case):
    P, Q, L, _, rng = case
    s = int(rng.integers(len(P)))
    p, q, drafts, w = _all_paths(P, Q, L, s)
    for v in _verifiers(len(P), rng):
        pred = predict_rounds(p, q, drafts, v)
        F, G = markov.rule_tables(P, Q, L, v)
        assert abs(w @ pred.accepted - markov.expected_accepted(P, Q, F, s)) < TOL, v.name
        assert abs(w @ pred.bound - markov.tv_bound(P, Q, F, G, s)) < TOL, v.name


def test_short_rounds_are_masked():
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(4), size=4)
    Q = rng.dirichlet(np.ones(4), size=4)
    p, q, drafts, w = _all_paths(P, Q, 3, 1)
    v = rules.uniform_rsd(1.5)
    full2 = predict_rounds(p[:, :3], q[:, :2], drafts[:, :2], v)
    masked = predict_rounds(p, q, drafts, v, n_drafted=np.full(len(drafts), 2))
    assert np.allclose(masked.accepted, full2.accepted, atol=TOL) and np.allclose(masked.bound, full2.bound, atol=TOL)
    F, G = markov.rule_tables(P, Q, 2, v)
    assert abs(w @ masked.accepted - markov.expected_accepted(P, Q, F, 1)) < TOL


def test_torch_rows_give_the_same_predictions():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    P = rng.dirichlet(np.ones(5), size=5)
    Q = rng.dirichlet(np.ones(5), size=5)
    p, q, drafts, _ = _all_paths(P, Q, 2, 0)
    for v in _verifiers(5, rng):
        a = predict_rounds(p, q, drafts, v)
        b = predict_rounds(torch.as_tensor(p), torch.as_tensor(q), torch.as_tensor(drafts), v)
        assert np.allclose(a.accepted, b.accepted.numpy(), atol=1e-12) and np.allclose(a.bound, b.bound.numpy(), atol=1e-12)


def test_shape_errors():
    with pytest.raises(ValueError, match="expected p"):
        predict_rounds(np.ones((2, 3, 4)) / 4, np.ones((2, 3, 4)) / 4, np.zeros((2, 2), int), rules.vanilla())
