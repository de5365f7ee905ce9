"""The grid pass of the exact chain law (theory.likelihood.chain.log_likelihoods: every rule of a sweep's grid on the
same rows, the scaled rules from sufficient statistics of the rows) against brute-force enumeration of the sampling
process and against log_likelihood rule by rule; and the sparse-product neighbour sum of theory.rules.neighbors
against the gather loop it replaces, bit for bit (docs/theory.md sections 6, 8c and 11, T12)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_likelihood import all_sequences, context_rows, process_law, scalar_rule, teacher_rows
from theory import rules
from theory.likelihood import log_likelihood
from theory.likelihood import chain as chain_mod
from theory.likelihood.chain import log_likelihoods, scaled_weights

neighbors_mod = importlib.import_module("theory.rules.neighbors")

# scaled rules (the grid pass: w > 1, w < 1, w = 1) and rules that keep the full emission pass
GRID = ["vanilla", "cool-sd:offset", "uniform-rsd", "linear-rsd", "scaled", "level", "typical", "lantern++", "lantern"]


def _grid(V, rng):
    vs, laws = {}, {}
    for name in GRID:
        vs[name], f, g = scalar_rule(name, V, np.random.default_rng(rng.integers(2**32)))
        laws[name] = (f, g)
    return vs, laws


@settings(max_examples=30, deadline=None)
@given(V=st.integers(2, 3), T=st.integers(1, 4), L=st.integers(1, 3), per_offset=st.booleans(),
       convention=st.sampled_from(["theory", "eagle"]), zp=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**32 - 1))
def test_grid_pass_matches_bruteforce(V, T, L, per_offset, convention, zp, seed):
    V = 3                                    # LANTERN's k + 1 = 2 neighbours per code
    rng = np.random.default_rng(seed)
    vs, laws = _grid(V, rng)
    prow, qrow = context_rows(rng, V, T, L, per_offset, zp)
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, L, per_offset)
    got = log_likelihoods(p, q, seqs, vs, L, convention=convention)
    assert list(got) == list(vs)
    for name, (f, g) in laws.items():
        law = process_law(prow, qrow, f, g, L, T, convention)
        exact = np.array([law.get(tuple(s), 0.0) for s in seqs])
        np.testing.assert_allclose(np.exp(got[name]), exact, rtol=1e-10, atol=1e-15, err_msg=name)
        assert np.all(np.isneginf(got[name][exact == 0])), name       # impossible sequences: exactly -inf


def _random_rows(seed, B=3, T=9, L=3, V=12, per_offset=True, zeros=0.3, dtype=np.float32):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.4), size=(B, T))
    q = rng.dirichlet(np.full(V, 0.4), size=(B, T, L) if per_offset else (B, T))
    for a in (p, q):
        a[rng.random(a.shape) < zeros] = 0
        a[..., 0] += 1e-3
        a /= a.sum(-1, keepdims=True)
    x = np.array([[rng.choice(V, p=p[b, t]) for t in range(T)] for b in range(B)])
    return p.astype(dtype), q.astype(dtype), x


@pytest.mark.parametrize("per_offset", [True, False])
@pytest.mark.parametrize("convention", ["theory", "eagle"])
def test_grid_pass_equals_log_likelihood_rule_by_rule(per_offset, convention):
    p, q, x = _random_rows(1, per_offset=per_offset)
    vs = {"vanilla": rules.vanilla(), "cool-sd": rules.cool_sd(3.0), "w<1": rules.scaled(rules.Explicit((0.7, 1.0, 2.5))),
          "uniform": rules.uniform_rsd(1.5), "typical": rules.typical(0.3, 0.9)}
    got = log_likelihoods(p, q, x, vs, 3, convention=convention)
    for k, v in vs.items():
        want = log_likelihood(p, q, x, v, 3, convention=convention)
        assert np.array_equal(np.isfinite(got[k]), np.isfinite(want)), k
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[k][fin], want[fin], rtol=1e-13, atol=0, err_msg=k)


def test_grid_pass_on_torch():
    torch = pytest.importorskip("torch")
    p, q, x = _random_rows(2)
    vs = {"cool-sd": rules.cool_sd(2.0), "vanilla": rules.vanilla()}
    got = log_likelihoods(torch.as_tensor(p), torch.as_tensor(q), torch.as_tensor(x), vs, 3)
    for k, v in vs.items():
        np.testing.assert_allclose(got[k].numpy(), log_likelihood(p, q, x, v, 3), rtol=1e-13, atol=0)


def test_control_a_wrong_weight_is_caught(monkeypatch):
    """Negative control: the grid pass reading weights 2% off (as a schedule read at the wrong positions would) no
    longer matches log_likelihood."""
    p, q, x = _random_rows(3)
    v = rules.cool_sd(3.0)
    good = log_likelihoods(p, q, x, {"a": v}, 3)["a"]
    np.testing.assert_allclose(good, log_likelihood(p, q, x, v, 3), rtol=1e-13)
    real = chain_mod.scaled_weights
    monkeypatch.setattr(chain_mod, "scaled_weights", lambda v, L: real(v, L) * 1.02)
    bad = log_likelihoods(p, q, x, {"a": v}, 3)["a"]
    assert not np.allclose(bad, log_likelihood(p, q, x, v, 3), rtol=1e-6)


def test_scaled_weights_reads_only_scaled_rules_with_gstar():
    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(6, 2)))
    np.testing.assert_array_equal(scaled_weights(rules.vanilla(), 3), np.ones(3))
    w = rules.cool_sd(4.0).accept.schedule(np.arange(1.0, 5.0), np)
    np.testing.assert_array_equal(scaled_weights(rules.cool_sd(4.0), 4), w)
    np.testing.assert_array_equal(scaled_weights(rules.uniform_rsd(1.5), 2), [1.5, 1.5])
    for v in (rules.scaled(rules.Explicit((2.0, 1.0)), resample=rules.Residual()),   # scaled but not G*
              rules.lantern_pp(nb, 1, 2.0), rules.lantern_pp(nb, 1, 2.0, resample="optimal"), rules.typical(),
              rules.level(rules.Explicit((0.2, 0.1))), rules.row_scaled([2.0, 1.5], 0.3), rules.greedy()):
        assert scaled_weights(v, 2) is None, v.name


def test_bad_input_one_line():
    p, q, x = _random_rows(4)
    with pytest.raises(ValueError, match="verifiers must be a dict"):
        log_likelihoods(p, q, x, [rules.vanilla()], 3)
    with pytest.raises(ValueError, match="log_likelihoods: verifier must be a chain rule"):
        log_likelihoods(p, q, x, {"a": object()}, 3)
    with pytest.raises(ValueError, match="tokens must be"):
        log_likelihoods(p, q, x[:, :-1], {"a": rules.vanilla()}, 3)


def _lantern_grid(V=40, k=6, seed=7):
    rng = np.random.default_rng(seed)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    vs = {f"{lam}:{res}": rules.lantern_pp(nb, k, lam, resample=res) for lam in (1.5, 2.0, 5.0)
          for res in ("lantern", "optimal")}
    return nb, vs


@pytest.mark.parametrize("per_offset", [True, False])
def test_lantern_rules_sharing_a_chunk_equal_their_own_passes_bit_for_bit(per_offset):
    """Rules of one table share a chunk's admitted masses (equal memo_key: released and G* of one lambda) and the "q"
    law's neighbour sums (every lambda): the same bits as each rule's own pass."""
    _, vs = _lantern_grid()
    p, q, x = _random_rows(8, B=2, T=12, V=40, per_offset=per_offset, dtype=np.float64)
    got = log_likelihoods(p, q, x, vs, 3)
    for k, v in vs.items():
        assert np.array_equal(got[k], log_likelihood(p, q, x, v, 3)), k


def test_control_a_memo_key_shared_by_different_thresholds_is_caught(monkeypatch):
    """Negative control: if rules with different lambdas claimed one memo key, the later ones would read the first
    one's acceptance row and the grid pass would no longer equal their own passes."""
    _, vs = _lantern_grid()
    p, q, x = _random_rows(9, B=2, T=12, V=40, dtype=np.float64)
    monkeypatch.setattr(rules.Lantern, "memo_key", property(lambda self: ("lantern", id(self.neighbors), self.k)))
    got = log_likelihoods(p, q, x, vs, 3)
    assert not all(np.array_equal(got[k], log_likelihood(p, q, x, v, 3)) for k, v in vs.items())


# --------------------------------------------------------------------------- the neighbour sum

def gather_loop(a, nb, mask):
    """The gather loop the sparse product replaces: whole rows per neighbour rank, added in column order."""
    V = a.shape[-1]
    at = np.ascontiguousarray(a.reshape(-1, V).T)
    s = at[nb[:, 0]]
    for j in range(1, nb.shape[1]):
        s = s + at[nb[:, j]]
    return np.where(mask, s.T.reshape(a.shape), np.zeros_like(a))


@settings(max_examples=40, deadline=None)
@given(V=st.integers(3, 40), K=st.integers(2, 12), dtype=st.sampled_from(["float64", "float32", "int64"]),
       seed=st.integers(0, 2**32 - 1))
def test_sparse_neighbor_sum_is_the_gather_loop_bit_for_bit(V, K, dtype, seed):
    rng = np.random.default_rng(seed)
    K = min(K, V - 1)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))[:, :K]
    a = rng.dirichlet(np.full(V, 0.3), size=(4, 3)) * rng.choice([1.0, 1e-8, 1e8])
    a = (a > 0.05).astype(np.int64) if dtype == "int64" else a.astype(dtype)
    mask = rng.random(a.shape) < 0.6
    got, want = neighbors_mod.neighbor_sum(a, nb, mask), gather_loop(a, nb, mask)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_control_another_summation_order_is_caught():
    """Negative control: the same sums in another column order (the table's columns sorted) differ in some bits, so
    the bit-for-bit test above can see an order change."""
    rng = np.random.default_rng(5)
    V = 64
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))[:, :20]
    a = rng.dirichlet(np.full(V, 0.3), size=(50, 4))
    mask = np.ones(a.shape, bool)
    assert np.array_equal(neighbors_mod.neighbor_sum(a, nb, mask), gather_loop(a, nb, mask))
    assert not np.array_equal(neighbors_mod.neighbor_sum(a, np.sort(nb, axis=1), mask), gather_loop(a, nb, mask))


# --------------------------------------------------------------------------- its transpose, the neighbour scatter

def scatter_loop(u, nb):
    """t[z] = sum of u[y] over the codes y listing z, by a Python loop over (y, column) pairs (the definition)."""
    V = u.shape[-1]
    rows = u.reshape(-1, V)
    t = np.zeros_like(rows)
    for y in range(V):
        for z in nb[y]:
            t[:, z] += rows[:, y]
    return t.reshape(u.shape)


@settings(max_examples=30, deadline=None)
@given(V=st.integers(3, 30), K=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_neighbor_scatter_is_the_transposed_sum(V, K, seed):
    """neighbor_scatter(u) = u @ N (N[y, z] = z listed by y) against the loop, on numpy and torch; and the adjoint
    identity <neighbor_sum(a), u> = <a, neighbor_scatter(u)>."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    K = min(K, V - 1)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))[:, :K]
    u = rng.dirichlet(np.full(V, 0.3), size=(3, 2))
    u[rng.random(u.shape) < 0.3] = 0.0
    want = scatter_loop(u, nb)
    np.testing.assert_allclose(neighbors_mod.neighbor_scatter(u, nb), want, rtol=1e-13, atol=1e-300)
    got_t = neighbors_mod.neighbor_scatter(torch.as_tensor(u), torch.as_tensor(nb)).numpy()
    np.testing.assert_allclose(got_t, want, rtol=1e-13, atol=1e-300)
    a = rng.random(u.shape)
    lhs = (neighbors_mod.neighbor_sum(a, nb, np.ones(a.shape, bool)) * u).sum()
    assert np.isclose(lhs, (a * neighbors_mod.neighbor_scatter(u, nb)).sum(), rtol=1e-12)


def test_control_the_scatter_is_not_the_sum():
    """Negative control: on a table that is not symmetric, the scatter (u @ N) differs from the sum (u @ N^T)."""
    rng = np.random.default_rng(2)
    V = 9
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))[:, :2]
    u = rng.random((2, V))
    assert not np.allclose(neighbors_mod.neighbor_scatter(u, nb), neighbors_mod.neighbor_sum(u, nb, np.ones(u.shape, bool)))
    np.testing.assert_allclose(neighbors_mod.neighbor_scatter(u, nb), scatter_loop(u, nb), rtol=1e-13)
