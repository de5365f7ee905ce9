"""The verifiers' sparse entry (theory.rules.accept_at, issue 55): f_i at the drafted tokens equals the dense row
gathered there, bit for bit, on numpy and torch, for every built-in acceptance rule; on random rows with ties and
zeros, random neighbour tables and closeness tables, thresholds at and around the masses. The dense rows are the
same code applied at every code, so any second implementation that disagrees anywhere is caught; a planted one
(the control) must be."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import rules
from theory.core.xp import gather, namespace
from theory.rules import accept_at

torch = pytest.importorskip("torch")


def _rows(rng, shape, V, conc, zero_frac, ties):
    r = rng.dirichlet(np.full(V, conc), size=shape)
    r[rng.random(r.shape) < zero_frac] = 0
    if ties:   # exact ties: a block of equal masses (GSD's sort, LANTERN's prefix bounds)
        r[..., : V // 3] = r[..., :1]
    r[..., -1] += 1e-3
    return r / r.sum(-1, keepdims=True)


def _rule_zoo(rng, V):
    """Every built-in acceptance rule, with parameters drawn so that thresholds fall among the masses."""
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    close = rules.gsd_close(rng.normal(size=(V, 2)), 1.0)
    k = int(rng.integers(1, V - 1))
    return {
        "vanilla": rules.Vanilla(),
        "scaled": rules.Scaled(rules.Exponential(3.0, 0.7)),
        "row-scaled": rules.RowScaled(rules.Explicit((1.5, 1.2, 1.0, 1.0)), 0.3, "entropy"),
        "level": rules.Level(rules.Explicit((0.5, 0.3, 0.1, 0.0), zero_ok=True)),
        "typical": rules.Typical(float(rng.uniform(0, 0.2)), float(rng.uniform(0, 1))),
        "greedy": rules.Greedy(),
        "lantern": rules.Lantern(nb, k, delta=float(rng.choice([0.0, 0.05, 0.2, 1.0]))),
        "lantern++": rules.Lantern(nb, k, lam=float(rng.choice([1.0, 2.0, 5.0]))),
        "gsd": rules.Grouped(close, int(rng.integers(0, 9)), float(rng.uniform(0.01, 0.3))),
        "gsd-no-distance": rules.Grouped(None, 7, 0.15),
    }


def _same(rule, p, q, i, x) -> bool:
    """accept_at(rule) == the dense row gathered, bit for bit (NaN never appears: rows are distributions)."""
    xp = namespace(p)
    want = gather(rule(p, q, i), x, xp)
    got = accept_at(rule, p, q, i, x)
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return False
    return bool(xp.all(got == want))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(3, 40), conc=st.sampled_from([0.05, 0.5, 5.0]),
       zero_frac=st.sampled_from([0.0, 0.3]), ties=st.booleans(), dtype=st.sampled_from(["float32", "float64"]))
def test_sparse_equals_dense_bit_for_bit(seed, V, conc, zero_frac, ties, dtype):
    rng = np.random.default_rng(seed)
    B, L = 3, 4
    p = _rows(rng, (B, L), V, conc, zero_frac, ties).astype(dtype)
    q = _rows(rng, (B, L), V, conc, zero_frac, ties).astype(dtype)
    x = rng.integers(0, V, size=(B, L))
    x[0] = np.argmax(p[0], axis=-1)                   # drafted tokens at the argmax too (greedy, typical)
    pos = np.arange(1, L + 1)
    for name, rule in _rule_zoo(rng, V).items():
        assert _same(rule, p, q, pos, x), (name, "numpy")
        assert _same(rule, p, q, 2, x), (name, "numpy, int position")
        tp, tq, tx = torch.as_tensor(p), torch.as_tensor(q), torch.as_tensor(x)
        assert _same(rule, tp, tq, torch.as_tensor(pos), tx), (name, "torch")
        # one row per round (the tree walks' shape)
        assert _same(rule, p[:, 0], q[:, 0], 1, x[:, 0]), (name, "numpy, one row per round")


@dataclass(frozen=True, eq=False)
class _WrongLantern(rules.Lantern):
    """A planted second implementation: the drafted token's neighbours counted one rank short."""

    def at(self, p, q, i, x):
        short = rules.Lantern(self.neighbors, max(self.k - 1, 1), delta=self.delta, lam=self.lam)
        return short.at(p, q, i, x)


def test_control_a_second_implementation_is_caught():
    """Flat target rows with every one of the 12 neighbours admitted (delta = 1) and drafts of mass 0.9: p~(x) =
    13/30 against the planted 12/30, so f differs (0.48 vs 0.44) and the comparison must say so."""
    rng = np.random.default_rng(0)
    V = 30
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    x = rng.integers(0, V, size=(4, 4))
    p = np.full((4, 4, V), 1.0 / V)
    q = np.where(np.arange(V) == x[..., None], 0.9, 0.1 / (V - 1))
    assert _same(rules.Lantern(nb, 12, delta=1.0), p, q, 1, x)
    assert not _same(_WrongLantern(nb, 12, delta=1.0), p, q, 1, x)


def test_a_users_rule_without_a_point_formula_is_gathered():
    """accept_at falls back to the dense row for a rule without ``at`` (a user's), and reads_f assumes G reads f."""
    def mine(p, q, i):
        xp = namespace(p, q)
        return xp.minimum(xp.ones_like(p), 0.5 + p)
    p = np.full((2, 5), 0.2)
    x = np.array([1, 3])
    assert np.array_equal(accept_at(mine, p, p, 1, x), np.full(2, 0.7))
    assert rules.reads_f(lambda p, q, f, rejected=None: p) is True
    assert rules.reads_f(rules.Optimal()) is True and rules.reads_f(rules.Residual()) is False


def _mask_law(p, q, x, nb, k, adm, variant, xp):
    """LANTERN's released law after rejecting x written with the (..., V) mask of N(x) from the (k+1, V) comparison."""
    V = p.shape[-1]
    ar = xp.arange(V)
    N = xp.any(xp.take(nb, xp.reshape(x, (-1,)), axis=0)[:, : k + 1][..., :, None] == ar, axis=-2)
    N = xp.reshape(N, (*x.shape, V)) & adm[..., None]
    ex = ar == x[..., None]
    zero = xp.zeros((), dtype=p.dtype)
    w = xp.where(ex | N, zero, p) if variant == "p" else xp.where(p - xp.where(N, zero, q) > 0, p - xp.where(N, zero, q), zero)
    s = xp.sum(w, axis=-1, keepdims=True)
    return xp.where(s > 0, w / xp.where(s > 0, s, xp.ones_like(s)), xp.ones_like(w) / V)


def test_lantern_resampling_given_the_token_is_the_dense_mask_law():
    """LanternResample given the rejected token (O(V + k): a scatter of its neighbours into the row) against the
    law written with the (V, k+1) comparison mask, bit for bit on numpy and torch, both variants, both acceptances,
    float32 and float64, rows with zeros. Control: a law that zeroes N(x) whether or not a neighbour was admitted
    (the renormalised variant's set) must differ."""
    rng = np.random.default_rng(5)
    V, k = 25, 6
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    controls = 0
    for dtype in ("float64", "float32"):
        p = _rows(rng, (3, 4), V, 0.2, 0.2, False).astype(dtype)
        q = _rows(rng, (3, 4), V, 0.2, 0.2, False).astype(dtype)
        x = rng.integers(0, V, size=(3, 4))
        for acc in (rules.Lantern(nb, k, lam=2.0), rules.Lantern(nb, k, delta=0.02)):
            adm = acc.admits(p)[np.arange(3)[:, None], np.arange(4), x]
            for variant in "pq":
                G = rules.LanternResample(nb, k, variant, "released", acc)(p, q, None, x)
                assert G.dtype == p.dtype and np.array_equal(G, _mask_law(p, q, x, nb, k, adm, variant, np)), variant
                tn = torch.as_tensor(nb)
                Gt = rules.LanternResample(tn, k, variant, "released", rules.Lantern(tn, k, lam=acc.lam, delta=acc.delta))(
                    torch.as_tensor(p), torch.as_tensor(q), None, torch.as_tensor(x))
                want = _mask_law(torch.as_tensor(p), torch.as_tensor(q), torch.as_tensor(x), tn, k, torch.as_tensor(adm),
                                 variant, namespace(tn))
                assert torch.equal(Gt, want), (variant, dtype)
                if adm.any() and not adm.all():
                    controls += 1
                    assert not np.array_equal(G, _mask_law(p, q, x, nb, k, np.ones_like(adm), variant, np)), variant
    assert controls >= 4      # the control ran on rows where some rejected tokens had a neighbour admitted, some not
