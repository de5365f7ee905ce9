"""SCD's maximal coupling as released is biased from a window of 3 (issue 40; docs/theory.md section 12): the exact
law of the Jacobi process by enumeration (tests/scd_enumerate.py, plain loops independent of the engine), with
SJD and the corrected scd-mc-p exact as controls, and the engine's samples checked against the enumerated laws."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

import pac_enumerate as pe
import scd_enumerate as se
from real.decode.jacobi import Jacobi
from test_jacobi import _counts, _law_model, _tv
from test_real_engine import _chi2
from theory import rules

# V = 2, T = 5: a first-order Markov chain whose rows differ strongly with the last token
INIT, M = [0.9, 0.1], [[0.3, 0.7], [0.9, 0.1]]


def _tv_to_target(W: int, coupling: str) -> float:
    return pe.tv(se.jacobi_law(pe.markov_target(INIT, M), 2, 5, W, coupling), pe.markov_law(INIT, M, 5))


def test_release_maximal_coupling_is_biased_at_window_3():
    """W = 3 (two drafts): scd-mc's TV to the target is 0.0238, far above float error; SJD (no coupling) and
    scd-mc-p are exact to 1e-12 on the same case. W = 2 (one draft, never coupled: the last window row is always a
    fresh draw) is exact for all three, and W = 4 is biased too."""
    tv3 = _tv_to_target(3, "scd-mc")
    print(f"scd-mc V=2 T=5 W=3: TV {tv3:.6f}; W=4: {_tv_to_target(4, 'scd-mc'):.6f}")
    assert tv3 > 0.02
    assert _tv_to_target(3, "scd-mc-p") < 1e-12 and _tv_to_target(3, "none") < 1e-12
    for c in ("none", "scd-mc", "scd-mc-p"):
        assert _tv_to_target(2, c) < 1e-12
    assert _tv_to_target(4, "scd-mc") > 0.005


def test_enumerated_laws_match_the_engine_at_window_3():
    """The enumeration describes the engine: on a tiny model (V = 3, T = 5, rows from the model), N = 6000 engine
    images of scd-mc and of scd-mc-p at W = 3 pass a chi-square against their own enumerated laws (p > 1e-3); and
    scd-mc's enumerated law is off the target's (a positive TV), scd-mc-p's on it (1e-12). At this N the chi-square
    cannot tell the two laws apart (their TV, 0.013, is under the sampling floor): it checks the enumeration
    describes the engine; the bias itself is the exact figure above."""
    from real.decode.sampling import Processing

    T, N = 5, 6000
    t = _law_model(T)
    proc = Processing(temperature=1.0, cfg_scale=1.5)

    @lru_cache(maxsize=None)
    def target(prefix):
        pre = torch.tensor(prefix).view(1, -1).expand(proc.batch, -1)
        with torch.no_grad():
            row = proc(t.prefill(1, pre if prefix else None, cfg=proc.cfg).logits[:, -1])
        return tuple(float(x) for x in row.double() / row.double().sum())

    exact = se.jacobi_law(target, 3, T, 1, "none")                  # W = 1: plain sampling, the target's law
    for coupling in ("scd-mc", "scd-mc-p"):
        law = se.jacobi_law(target, 3, T, 3, coupling)
        c, _ = _counts(t, Jacobi(3, coupling=coupling), rules.vanilla(), N, 50, T, proc, 7)
        p, _ = _chi2(c, law, N)
        gap = pe.tv(law, exact)
        print(f"{coupling}: engine vs enumeration p={p:.3g} TV={_tv(c, law, N):.4f}; enumerated TV to target {gap:.5f}")
        assert p > 1e-3
        assert (gap > 1e-4) if coupling == "scd-mc" else (gap < 1e-12)


def test_bad_coupling_is_named():
    with pytest.raises(ValueError, match="coupling must be none, scd-mc or scd-mc-p"):
        se.jacobi_law(pe.markov_target(INIT, M), 2, 3, 3, "scd-gs")
