"""theory.likelihood.path_bound: per-token round offsets from round records, and the per-image hybrid TV bound from an
image's own path (docs/theory.md section 11)."""
from __future__ import annotations

import numpy as np
import pytest

from theory.rules import discrepancy
from theory.likelihood.path_bound import image_path_bounds, round_offsets
import theory.rules.methods as tm


def test_round_offsets_by_hand():
    # image 0: rounds (L'=0, tau=0), (3, 1), (3, 3), (1, 0); image 1: (3, 0) x 2, (2, 2), (1, 1), (0, 0)
    img = np.array([0, 1, 0, 1, 0, 1, 1, 0, 1])
    drafted = np.array([0, 3, 3, 3, 3, 2, 1, 1, 0])
    accepted = np.array([0, 0, 1, 0, 3, 2, 1, 0, 0])
    off, dr = round_offsets(img, drafted, accepted, 2, 8)
    assert off[0].tolist() == [0, 0, 1, 0, 1, 2, 3, 0]
    assert dr[0].tolist() == [False, True, True, True, True, True, False, True]
    assert off[1].tolist() == [0, 0, 0, 1, 2, 0, 1, 0]
    assert dr[1].tolist() == [True, True, True, True, False, True, False, False]
    with pytest.raises(ValueError, match="exactly T"):
        round_offsets(img, drafted, accepted, 2, 9)
    with pytest.raises(ValueError, match="accepted <= drafted"):
        round_offsets(img, drafted, accepted + 5, 2, 8)


def test_two_tokens_one_draft_bound_is_the_exact_tv():
    """T = 2, L = 1 (theory convention): token 0 is always at a draft position (offset 0), token 1 always comes
    from p (a bonus after an acceptance, or the next round's L' = 0). So TV(P^, P) = D_1(row 0) exactly, and the
    bound of every image, whatever its path, equals it; an enumeration of the two-token law checks it."""
    rng = np.random.default_rng(0)
    V = 5
    p = rng.dirichlet(np.ones(V), size=(1, 2))
    q = rng.dirichlet(np.ones(V), size=(1, 2))
    rule = tm.build("cool-sd", 1, params={"delta": 3})
    f = rule.accept(p[0, 0], q[0, 0], 1)
    G = rule.resample(p[0, 0], q[0, 0], f)
    beta = float(np.sum(q[0, 0] * f))
    law0 = q[0, 0] * f + (1 - beta) * G
    joint_hat = law0[:, None] * p[0, 1][None, :]                     # token 1 ~ p_1 given x_0 (rows do not depend on x_0 here)
    joint = p[0, 0][:, None] * p[0, 1][None, :]
    tv = 0.5 * np.abs(joint_hat - joint).sum()
    for accepted in (0, 1):                                          # both paths of token 0
        rounds = (np.array([0, 0]), np.array([1, 0]), np.array([0, 0])) if accepted == 0 else \
                 (np.array([0]), np.array([1]), np.array([1]))
        off, dr = round_offsets(*rounds, 1, 2)
        b = image_path_bounds(p, q, off, dr, rule, 1)
        assert b[0] == pytest.approx(tv, rel=1e-12) and tv > 0.01
    van = image_path_bounds(p, q, off, dr, tm.build("vanilla", 1), 1)
    assert van[0] < 1e-15
    assert discrepancy(p[0, 0], q[0, 0], f, G) == pytest.approx(tv)
