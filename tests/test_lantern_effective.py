"""theory.rules.lantern: LANTERN's released law (variant "p": the rejected code x, and its k + 1 nearest when one was
admitted, zeroed, renormalised; uniform when nothing is left) has its effective law (``rejected=None``: the mixture
sum_x w(x) G(.|x) / sum w, w = q (1 - f), docs/theory.md section 6) computed by neighbour sums and their transpose,
O(V k) per row (``LanternResample._effective``), with no (V, V) mask. Against an exact rational brute force of the mixture
(hypothesis: V up to 120, zeros, target rows piled on a code and its neighbours, draft rows piled on one code, so that
the kept masses Z(x) and the kept weights T(y) cancel in the subtractions; numpy and torch float64): within 1e-12, and
the cancelled entries' direct sums are taken. ``effective_at`` (the same weights, ``lantern_effective.p_weights``, at
its documented 1e-8) gathers the same law.
Control: with the direct sums switched off the piled-up cases miss the brute force by more than 1e-12."""
import importlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bruteforce as bf
from theory import rules
from theory.rules.lantern import LanternResample

LE = importlib.import_module("theory.rules.lantern_effective")


def _case(seed, V, piled):
    """(table, k, delta, p (R, V), q (R, V)) float64; ``piled``: p's mass on a code and its nearest (their kept sets
    nearly empty), q's on that code (the mixture dominated by its G)."""
    rng = np.random.default_rng(seed)
    table = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    k = int(rng.integers(1, max(2, V // 4)))
    delta = float(rng.choice([0.05, 0.2, 0.6, 1.0]))
    R = 4
    p = rng.dirichlet(np.full(V, 0.5), size=R)
    q = rng.dirichlet(np.full(V, 0.5), size=R)
    p[rng.random(p.shape) < 0.2] = 0.0
    if piled:
        x0 = rng.integers(0, V, size=R)
        for r in range(R):   # a loop over the case's rows (test set-up)
            near = np.asarray(table)[x0[r], : k + 1]
            p[r] *= 10.0 ** -float(rng.choice([4, 8, 12]))
            p[r, x0[r]] += 1.0
            p[r, near] += rng.random(k + 1) * 0.2
            q[r] *= 10.0 ** -float(rng.choice([3, 9]))
            q[r, x0[r]] += 1.0
    p[p.sum(1) == 0, 0] = 1.0
    return table, k, delta, p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


def _exact(p, q, f, table, k, delta):
    """The effective law of one row by rational arithmetic (the rows' float values taken exactly), rounded once."""
    V = len(p)
    P, W = [Fraction(float(v)) for v in p], [Fraction(float(a)) * (1 - Fraction(float(b))) for a, b in zip(q, f)]
    tot = sum(W)
    if tot == 0:
        return np.asarray(p, float)
    out = [Fraction(0)] * V
    for x in range(V):   # a loop over the rejected codes (brute force)
        if W[x] == 0:
            continue
        admitted = bf.lantern_admitted(list(p), table, x, delta, None)
        gone = {x} | ({int(y) for y in table[x][: k + 1]} if admitted else set())
        kept = [Fraction(0) if y in gone else P[y] for y in range(V)]
        Z = sum(kept)
        g = [v / Z for v in kept] if Z > 0 else [Fraction(1, V)] * V
        out = [a + W[x] * b for a, b in zip(out, g)]
    return np.array([float(a / tot) for a in out])


def _law(table, k, delta, p, q, xp=np):
    acc = rules.Lantern(table, k, delta=delta)
    G = LanternResample(table, k, "p", "released", acc)
    f = acc(p, q, 1)
    return G, f, G(p, q, f)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([6, 30, 120]), piled=st.booleans())
def test_released_p_effective_law_equals_the_exact_mixture(seed, V, piled):
    torch = pytest.importorskip("torch")
    table, k, delta, p, q = _case(seed, V, piled)
    G, f, got = _law(table, k, delta, p, q)
    tt = torch.as_tensor
    got_t = G(tt(p), tt(q), tt(f)).numpy()
    x = np.random.default_rng(seed).integers(0, V, size=len(p))
    at = G.effective_at(p, q, f, x)                     # the same weights gathered at x (their tolerance 1e-6: 1e-8)
    for r in range(len(p)):   # a loop over the case's rows (the brute force is per row)
        want = _exact(p[r], q[r], f[r], np.asarray(table), k, delta)
        assert np.max(np.abs(got[r] - want)) <= 1e-12 and np.max(np.abs(got_t[r] - want)) <= 1e-12
        assert abs(at[r] - want[x[r]]) <= 1e-8 * want[x[r]] + 1e-15


def test_control_without_the_direct_sums_piled_rows_miss(monkeypatch):
    """The piled-up rows cancel: the direct sums are taken there (counted), and without them (the subtractions'
    values kept) the law misses the exact mixture by more than 1e-12 in some cases."""
    taken = []
    real = LE.kept_where_cancelled

    def counting(c, adm, nb, T, flag, xp):
        taken.append(int(np.sum(flag)))
        return real(c, adm, nb, T, flag, xp)

    monkeypatch.setattr(LE, "kept_where_cancelled", counting)
    worst_on, worst_off = 0.0, 0.0
    for seed in range(12):
        table, k, delta, p, q = _case(seed, 30, True)
        want = None
        for switch in (True, False):
            with monkeypatch.context() as m:
                if not switch:
                    m.setattr(LE, "kept_where_cancelled", lambda c, a, nb, T, flag, xp: T)
                    m.setattr(LE, "exact_where_cancelled", lambda k, p, a, nb, Z, flag, xp: Z)
                G, f, got = _law(table, k, delta, p, q)
            if want is None:
                want = np.stack([_exact(p[r], q[r], f[r], np.asarray(table), k, delta) for r in range(len(p))])
            err = float(np.max(np.abs(got - want)))
            if switch:
                worst_on = max(worst_on, err)
            else:
                worst_off = max(worst_off, err)
    assert sum(taken) > 0
    assert worst_on <= 1e-12 < worst_off
