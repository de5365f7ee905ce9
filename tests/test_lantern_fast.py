"""The fast LANTERN / LANTERN++ paths (theory.rules.prefix_mass, neighbor_sum; theory.likelihood's joint
offsets with p shared) against the direct computations they replace, written here: the dense (..., V, k)
neighbour gather with its cumulative sum, and log P^ from per-offset 2-D rule calls with the dense (V, V)
effective law and a plain forward sum over round offsets (docs/theory.md sections 6 and 11, T12)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from theory import rules
from theory.likelihood import log_likelihood, round_masks

lantern_mod = importlib.import_module("theory.rules.prefix_mass")   # the prefix machinery LANTERN reads
lantern_rules = importlib.import_module("theory.rules.lantern")


def dense_prefix_mass(p, nb, thr, k):
    """The admitted mass the direct way: gather p at the (V, k) table, cumulative sums, the largest <= thr."""
    c = np.cumsum(p[..., nb[:, :k]], axis=-1)
    t = thr if np.ndim(thr) == 0 else thr[..., None]
    return np.max(np.where(c <= t, c, 0.0), axis=-1)


def rows(rng, shape, V, conc, zeros=0.0):
    r = rng.dirichlet(np.full(V, conc), size=shape)
    r[rng.random(r.shape) < zeros] = 0
    r[..., 0] += 1e-3
    return r / r.sum(-1, keepdims=True)


@pytest.mark.parametrize("whole_first", [True, False])
@pytest.mark.parametrize("regime", ["levels", "dense", "sliced", "widened"])
def test_prefix_mass_equals_the_dense_cumulative_sum(regime, whole_first, monkeypatch):
    """Bit for bit on numpy (the same sequential sums), for both thresholds, rows with zeros, and each of the
    strategies forced: one column per block (a level loop), one block of all k columns, the gathers sliced into
    pieces of a few entries, blocks widened to the active set's size (SMALL_BLOCK) after the first compactions;
    with a scalar threshold the whole neighbour sums first (``WHOLE_FIRST``) or every entry prefix by prefix."""
    monkeypatch.setattr(lantern_mod, "WHOLE_FIRST", whole_first)
    if regime == "levels":
        monkeypatch.setattr(lantern_mod, "FIRST_BLOCK", 1)
        monkeypatch.setattr(lantern_mod, "SMALL_BLOCK", 0)
    elif regime == "widened":
        monkeypatch.setattr(lantern_mod, "SMALL_BLOCK", 40)
    elif regime == "dense":
        monkeypatch.setattr(lantern_mod, "FIRST_BLOCK", 1 << 20)
    else:
        monkeypatch.setattr(lantern_mod, "GATHER_LIMIT", 7)
    rng = np.random.default_rng(3)
    V, k = 60, 9
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    for conc, zeros in ((0.2, 0.0), (1.0, 0.4), (5.0, 0.0)):
        p = rows(rng, (7, 5), V, conc, zeros)
        for thr in (0.0, 0.05, 0.3, 1.0, 1.5 * p, 0.0 * p, 4.0 * p):
            got = lantern_mod.prefix_mass(p, nb, thr, k)
            want = dense_prefix_mass(p, nb, thr, k)
            assert got.shape == p.shape
            assert np.array_equal(got, want), (regime, conc, np.max(np.abs(got - want)))
    # a wrong mass (the first neighbour always admitted) must be told apart
    assert not np.array_equal(lantern_mod.prefix_mass(p, nb, 1.5 * p, k), p[..., nb[:, 0]])


def _tiny_masses(V=40):
    """float32 rows where summing in float32 with a rounding at every block's end loses a mass: code 0's nearest
    neighbour holds 0.5, the next ones 2^-26 each (a quarter of float32's spacing at 0.5)."""
    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(V, 3)))
    p = np.zeros(V, np.float32)
    p[nb[0, 0]], p[nb[0, 1:12]], p[0] = 0.5, 2.0 ** -26, 0.25
    return nb, np.broadcast_to(p, (3, V)).copy()


@pytest.mark.parametrize("small_block", [0, 64, None])
def test_torch_masses_do_not_depend_on_the_block_layout(small_block, monkeypatch):
    """On torch float32 rows the drafted tokens' p~ (a few entries: one block of every column when SMALL_BLOCK allows)
    equals the dense row's (every code: doubling blocks, compactions) bit for bit: the sums are carried in float64
    from block to block. Random rows and the constructed rounding case alike."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", False)   # the torch blocks themselves (the device path)
    if small_block is not None:
        monkeypatch.setattr(lantern_mod, "SMALL_BLOCK", small_block)
    rng = np.random.default_rng(11)
    nb, tiny = _tiny_masses()
    cases = [(tiny, np.zeros(3, np.int64), 4)]
    for _ in range(4):
        cases.append((rows(rng, (3,), 40, 0.3, 0.2).astype(np.float32), rng.integers(0, 40, 3), int(rng.integers(1, 39))))
    for p, x, k in cases:
        for acc in (rules.Lantern(torch.as_tensor(nb), k, delta=0.6), rules.Lantern(torch.as_tensor(nb), k, lam=3.0)):
            P, X = torch.as_tensor(p), torch.as_tensor(x)
            assert torch.equal(acc.aggregated_at(P, X), acc.aggregated(P)[torch.arange(3), X]), (small_block, k)


def test_control_float32_sums_rounded_per_block_are_caught(monkeypatch):
    """The control: summed in float32 and rounded at each block's end (torch's cumulative sum accumulates in float64
    within a block only), the one-block masses at the drafted tokens and the dense row's doubling blocks differ on
    the constructed case (0.5 + 2^-24 against 0.5), and the comparison above must see it."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", False)
    monkeypatch.setattr(lantern_mod, "SMALL_BLOCK", 64)
    monkeypatch.setattr(lantern_mod, "_sum_dtype", lambda pf, xp: (pf.dtype, True))
    nb, p = _tiny_masses()
    acc = rules.Lantern(torch.as_tensor(nb), 4, delta=1.0)
    P, X = torch.as_tensor(p), torch.zeros(3, dtype=torch.int64)
    assert not torch.equal(acc.aggregated_at(P, X), acc.aggregated(P)[torch.arange(3), X])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_cpu_on_numpy_is_the_torch_blocks_bit_for_bit(dtype, monkeypatch):
    """torch CPU tensors are summed by the numpy code on float64 views (``TORCH_CPU_ON_NUMPY``): bit for bit the torch
    blocks' masses (the device path, forced with the flag off), dense rows and drafted tokens, both thresholds, the
    constructed rounding case included. Control: the numpy code on the rows' own float32 (no float64 view) loses
    the 2^-26 masses there, and the comparison must see it."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    nb, tiny = _tiny_masses()
    cases = [tiny.astype(dtype)] + [rows(rng, (4, 3), 40, c, z).astype(dtype) for c, z in ((0.3, 0.2), (2.0, 0.0))]

    def both(acc, P, X):
        out = []
        for on in (True, False):
            monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", on)
            out.append((acc.aggregated(P), acc.aggregated_at(P, X)))
        return out

    for p in cases:
        P = torch.as_tensor(p)
        X = torch.as_tensor(rng.integers(0, 40, P.shape[:-1]))
        for acc in (rules.Lantern(torch.as_tensor(nb), 7, delta=0.6), rules.Lantern(torch.as_tensor(nb), 13, lam=3.0)):
            (d1, s1), (d0, s0) = both(acc, P, X)
            assert d1.dtype == d0.dtype == P.dtype
            assert torch.equal(d1, d0) and torch.equal(s1, s0), (dtype, acc)
    if dtype == "float32":   # the control: float32 sums on the host lose what the float64 blocks keep
        monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", False)
        P = torch.as_tensor(cases[0])
        acc = rules.Lantern(torch.as_tensor(nb), 12, delta=1.0)
        host32 = torch.as_tensor(lantern_mod.prefix_mass(cases[0], nb, 1.0, 12))
        assert not torch.equal(lantern_mod.prefix_mass(P, torch.as_tensor(nb), 1.0, 12), host32)
        assert torch.equal(acc.aggregated(P), P + lantern_mod.prefix_mass(P, torch.as_tensor(nb), 1.0, 12))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_cpu_views_give_the_torch_verdict_bit_for_bit(dtype, monkeypatch):
    """``Lantern.at`` and the released resampling laws (both variants, given the rejected token and at the point law) on
    torch CPU tensors run numpy's calls on views of them (``TORCH_CPU_ON_NUMPY``): bit for bit what the torch calls give
    with the flag off (the device path), on rows with zeros and ties (equal masses), both thresholds, and on the
    constructed rounding case (float32 sums on the host would lose its 2^-26 masses). Control: the same
    residual normalised by numpy's row sum instead of torch's differs on these rows (so normalising on the host would be
    caught), and the host view of a torch row is its memory (no copy)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(21)
    V, k = 50, 9
    nb = torch.as_tensor(rules.lantern_neighbors(rng.normal(size=(V, 3))))
    p = rows(rng, (6, 4), V, 0.4, 0.3)
    p[..., 7] = p[..., 8] = p[..., 9]                                                    # ties
    q = rows(rng, (6, 4), V, 0.4, 0.2)
    P, Q = torch.as_tensor(p.astype(dtype)), torch.as_tensor(q.astype(dtype))
    X = torch.as_tensor(rng.integers(0, V, (6, 4)))
    X[0] = torch.as_tensor(np.argmin(p[0], -1))                                          # tokens of mass 0
    verifiers = [rules.lantern(nb, k, 0.05), rules.lantern(nb, k, 0.9), rules.lantern_pp(nb, k, 2.0),
                 rules.lantern_pp(nb, k, 1.0)]

    def outputs(on):
        monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", on)
        out = []
        for v in verifiers:
            f = v.accept.at(P, Q, 1, X)
            out += [f, v.resample(P, Q, None, X), v.resample.point(P, X, f)]
        return out

    host, device = outputs(True), outputs(False)
    nb0, tiny = _tiny_masses()                       # the rounding case: float32 sums on the host would lose 2^-26s
    T, Z = torch.as_tensor(tiny.astype(dtype)), torch.zeros(3, dtype=torch.int64)
    for on in (True, False):
        monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", on)
        acc = rules.Lantern(torch.as_tensor(nb0), 12, delta=1.0)
        (host if on else device).append(acc.at(T, torch.ones_like(T), 1, Z))
    for a, b in zip(host, device):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    res = verifiers[0].resample
    w = torch.as_tensor(res._released_kept(p.astype(dtype), q.astype(dtype), X.numpy(), np))
    torch_norm = w / w.sum(-1, keepdim=True)
    numpy_norm = torch.as_tensor(w.numpy() / w.numpy().sum(-1, keepdims=True))
    assert not torch.equal(torch_norm, numpy_norm)                                       # the control
    monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", True)                          # the host path is taken
    views = lantern_rules._host_views(P, Q, X)
    assert views is not None and np.shares_memory(views[0], P.numpy())
    assert lantern_rules._host_views(P.requires_grad_(), Q) is None                      # (autograd: the torch calls)


def test_torch_bfloat16_rows_keep_the_torch_blocks(monkeypatch):
    """numpy has no bfloat16: such CPU tensors are not handed to the numpy code (it could not view them) but summed by
    the torch blocks, in float64, as before; the dense row and the drafted tokens agree bit for bit."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    nb, _ = _tiny_masses()
    P = torch.as_tensor(rows(rng, (4, 3), 40, 0.5, 0.2)).to(torch.bfloat16)
    X = torch.as_tensor(rng.integers(0, 40, (4, 3)))
    acc = rules.Lantern(torch.as_tensor(nb), 9, lam=2.0)
    got = acc.aggregated(P)
    assert got.dtype == torch.bfloat16 and torch.equal(acc.aggregated_at(P, X), torch.take_along_dim(got, X[..., None], -1)[..., 0])
    monkeypatch.setattr(lantern_mod, "TORCH_CPU_ON_NUMPY", False)
    assert torch.equal(acc.aggregated(P), got)


def test_prefix_mass_and_neighbor_sum_on_torch_and_jax():
    rng = np.random.default_rng(4)
    V, k = 30, 5
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    p = rows(rng, (6, 4), V, 0.5, 0.2)
    mask = rng.random(p.shape) < 0.5
    want_m = dense_prefix_mass(p, nb, 2.0 * p, k)
    want_s = np.where(mask, p[..., nb[:, :k + 1]].sum(-1), 0.0)
    np.testing.assert_allclose(lantern_rules.neighbor_sum(p, nb[:, :k + 1], mask), want_s, rtol=1e-14, atol=0)
    pos = (p > 0).astype(np.int64)
    assert np.array_equal(lantern_rules.neighbor_sum(pos, nb[:, :k + 1], mask),
                          np.where(mask, pos[..., nb[:, :k + 1]].sum(-1), 0))
    for mod in ("torch", "jax"):
        m = pytest.importorskip(mod)
        if mod == "jax":
            m.config.update("jax_enable_x64", True)
            to = m.numpy.asarray
        else:
            to = m.as_tensor
        got = lantern_mod.prefix_mass(to(p), to(nb), 2.0 * to(p), k)
        np.testing.assert_allclose(np.asarray(got), want_m, rtol=1e-14, atol=0)
        got = lantern_rules.neighbor_sum(to(p), to(nb[:, :k + 1]), to(mask))
        np.testing.assert_allclose(np.asarray(got), want_s, rtol=1e-14, atol=0)


def reference_log_likelihood(p, q, x, v, L, convention):
    """log P^ from the emissions computed one offset at a time on 2-D rows, with the dense effective law
    ``v.resample(p, q, f)`` (no effective_at, no shared p), then alpha summed over offsets (T12, unscaled:
    T is small here)."""
    B, T, V = p.shape
    draft, bonus = round_masks(T, L, convention)
    out = np.zeros(B)
    for b in range(B):   # a reference: loops over images, offsets and positions
        a = np.zeros((T, L))
        r = np.zeros((T, L))
        for i in range(1, L + 1):
            qi = q[b, :, i - 1] if q.ndim == 4 else q[b]
            f = v.accept(p[b], qi, i)
            G = v.resample(p[b], qi, f)
            t = np.arange(T)
            sq = qi.sum(-1)
            a[:, i - 1] = (qi * f)[t, x[b]] / sq
            r[:, i - 1] = (qi * (1 - f)).sum(-1) / sq * G[t, x[b]] / G.sum(-1)
        pt = p[b][np.arange(T), x[b]] / p[b].sum(-1)
        alpha = np.zeros(L + 1)
        alpha[0] = 1.0
        for t in range(T):
            new = np.zeros(L + 1)
            for i in range(L + 1):
                if draft[t, i]:
                    new[i + 1] += alpha[i] * a[t, i]
                    new[0] += alpha[i] * r[t, i]
                elif bonus[t, i]:
                    new[0] += alpha[i] * pt[t]
            alpha = new
        out[b] = np.log(alpha[0]) if alpha[0] > 0 else -np.inf
    return out


@pytest.mark.parametrize("family", ["lantern", "lantern++"])
@pytest.mark.parametrize("resample", ["lantern", "optimal"])
@pytest.mark.parametrize("per_offset", [False, True])
@pytest.mark.parametrize("convention", ["theory", "eagle"])
def test_fast_log_likelihood_equals_the_per_offset_path(family, resample, per_offset, convention, monkeypatch):
    """log_likelihood (offsets jointly, p's neighbour masses once, effective_at) == the per-offset dense path to
    1e-12, on flat and peaked random rows, with prefix_mass's blocks of one column forced (a level loop; these rows
    are small enough for one block otherwise)."""
    monkeypatch.setattr(lantern_mod, "FIRST_BLOCK", 1)
    rng = np.random.default_rng(11)
    B, T, L, V, k = 3, 7, 3, 24, 4
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    make = rules.lantern if family == "lantern" else rules.lantern_pp
    v = make(nb, k, 0.15 if family == "lantern" else 2.0, resample=resample)
    for conc in (0.3, 3.0):
        p = rows(rng, (B, T), V, conc)
        q = rows(rng, (B, T, L) if per_offset else (B, T), V, conc)
        x = rng.integers(V, size=(B, T))
        got = log_likelihood(p, q, x, v, L, convention=convention)
        want = reference_log_likelihood(p, q, x, v, L, convention)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    # negative control: another rule's law is told apart at this tolerance
    other = make(nb, k, 0.3 if family == "lantern" else 3.0, resample=resample)
    assert np.max(np.abs(reference_log_likelihood(p, q, x, other, L, convention) - got)) > 1e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_few_entries_past_the_first_block_are_the_dense_masses(dtype, monkeypatch):
    """``prefix_mass_at`` of a few entries sums the first FEW_FIRST neighbours, then the other columns of the
    entries that passed them all, carried on from their sums: bit for bit the direct cumulative sum over all k, on
    prefixes that stop within the first block and past it (checked: some do each). Control: restarting the second
    block from zero (the carry dropped) is caught on the same entries."""
    rng = np.random.default_rng(11)
    V, k, m = 400, 250, 24
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    p = rows(rng, (3,), V, 3.0).astype(dtype)
    e = np.sort(rng.choice(3 * V, size=m, replace=False)).astype(np.int64)
    pf = p.reshape(-1)
    want_rows = np.cumsum(p[:, nb[:, :k]], axis=-1)                         # (3, V, k): the direct sums
    direct = want_rows.reshape(-1, k)[e]
    F = lantern_mod.FEW_FIRST
    runs = []
    for thr in (0.02, 0.1, 0.3, 0.6):
        got = lantern_mod.prefix_mass_at(pf, e, nb, thr, k, V)
        passed = (direct <= thr).sum(-1)                                     # columns each prefix runs over
        want = np.where(passed > 0, direct[np.arange(m), np.maximum(passed - 1, 0)], 0.0).astype(dtype)
        assert got.dtype == dtype and np.array_equal(got, want), (thr, np.max(np.abs(got - want)))
        runs.append(passed)
    runs = np.concatenate(runs)
    assert ((runs > 0) & (runs < F)).any() and ((runs > F) & (runs < k)).any()
    real = lantern_mod._prefix_of

    def restart(g, thr, acc, dt, carry=None):
        return real(g, thr, acc, dt)                                         # the carry dropped
    monkeypatch.setattr(lantern_mod, "_prefix_of", restart)
    assert not np.array_equal(lantern_mod.prefix_mass_at(pf, e, nb, 0.6, k, V), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_whole_sums_first_are_the_prefix_sums_bit_for_bit(dtype, monkeypatch):
    """``prefix_mass`` with a scalar threshold on numpy: the whole neighbour sums first (``WHOLE_FIRST``, one sparse
    product in the adds' order) equal the prefix-by-prefix sums bit for bit (k = 100, float32 and float64 rows, most
    codes' whole sums under the threshold, some over). Control: whole sums in numpy's pairwise order (``sum``) differ
    in some entries, and the comparison sees it."""
    rng = np.random.default_rng(5)
    V, k = 300, 100
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    p = rows(rng, (6,), V, 0.3, 0.1).astype(dtype)
    got = {}
    for whole, thr in ((True, 0.33), (False, 0.33), (True, 10.0), (False, 10.0)):
        monkeypatch.setattr(lantern_mod, "WHOLE_FIRST", whole)
        got[whole, thr] = lantern_mod.prefix_mass(p, nb, thr, k)
    assert got[True, 0.33].tobytes() == got[False, 0.33].tobytes()
    assert got[True, 10.0].tobytes() == got[False, 10.0].tobytes()
    assert 0 < np.mean(got[True, 0.33] < np.cumsum(p[:, nb[:, :k]], -1)[..., -1]) < 0.9     # some codes cut short
    neighbors = importlib.import_module("theory.rules.neighbors")
    pairwise = lambda a, t, mask: np.where(mask, np.ascontiguousarray(a[..., t]).sum(-1), 0)   # noqa: E731
    monkeypatch.setattr(neighbors, "neighbor_sum", pairwise)
    monkeypatch.setattr(lantern_mod, "WHOLE_FIRST", True)
    assert lantern_mod.prefix_mass(p, nb, 10.0, k).tobytes() != got[False, 10.0].tobytes()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.integers(6, 60), dtype=st.sampled_from([np.float32, np.float64]),
       variant=st.sampled_from(["p", "q"]), relative=st.booleans())
def test_one_rejected_row_is_the_rows_path_bit_for_bit(seed, V, dtype, variant, relative):
    """The released resampling's row before its normalisation, for a batch-1 rejection (one row: on its scalars,
    ``LanternResample._released_kept_host`` at R = 1) equals the same row's in a batch (the flat-index path), bit for bit: rows
    with zeros and ties, both thresholds set between the rows' values so that some rows admit x's nearest
    neighbour and others do not (both branches are taken in every example), both variants."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, V - 1))
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    R = 8
    p, q = rows(rng, (R,), V, 0.5, 0.2).astype(dtype), rows(rng, (R,), V, 0.5, 0.1).astype(dtype)
    p[:, 2] = p[:, 3]                                                                  # ties
    x = rng.integers(0, V, R)                                                    # p(x) = 0 included (delta) ...
    if relative:                                                                 # ... or p(x) > 0 (a finite lam)
        x = np.array([rng.choice(np.flatnonzero(r > 0)) for r in p])
    first, px = p[np.arange(R), nb[x, 0]], p[np.arange(R), x]
    if relative:    # admitted where p(first) <= (lam - 1) p(x): lam between the rows' ratios
        ratio = np.sort(first.astype(np.float64) / px)
        acc = rules.Lantern(nb, k, lam=1.0 + float(ratio[R // 2]))
    else:
        acc = rules.Lantern(nb, k, delta=float(np.sort(first)[R // 2]))
    res = lantern_rules.LanternResample(nb, k, variant, "released", acc)
    adm = first <= acc._threshold(px)
    assume(0 < adm.sum() < R)
    many = res._released_kept_host(p, q, x)
    for i in range(R):
        one = res._released_kept_host(p[i:i + 1], q[i:i + 1], x[i:i + 1])
        assert one.shape == (1, V) and one.dtype == many.dtype
        assert one.tobytes() == many[i:i + 1].tobytes(), (i, bool(adm[i]))


def test_control_the_one_row_path_reads_the_admission():
    """The comparison above can fail: a one-row path that ignores whether x's nearest neighbour was admitted (N(x)
    always restored from p) differs from the batch's rows where it was not."""
    rng = np.random.default_rng(5)
    V, k, R = 30, 6, 8
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    p, q = rows(rng, (R,), V, 0.5), rows(rng, (R,), V, 0.5)
    x = rng.integers(0, V, R)
    acc = rules.Lantern(nb, k, delta=float(np.median(p[np.arange(R), nb[x, 0]])))
    res = lantern_rules.LanternResample(nb, k, "q", "released", acc)
    many = res._released_kept_host(p, q, x)
    broken = lantern_rules.LanternResample(nb, k, "q", "released", rules.Lantern(nb, k, delta=np.inf))  # admits all
    differ = sum(not np.array_equal(broken._released_kept_host(p[i:i + 1], q[i:i + 1], x[i:i + 1])[0], many[i])
                 for i in range(R))
    assert differ >= 1
