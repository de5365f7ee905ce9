"""The numpy fast paths of theory.core.xp (``ratio_min1``: divide and clip; ``positive_part``: fmax and + 0.0;
``normalize``: the division alone when no row is empty) give the
generic array-API formulas' values bit for bit, special values included (0, -0.0, inf, NaN, denormals, negative
masses), on broadcast shapes; a planted fast path without the NaN repair is told apart (control)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from theory.core import xp as X

SPECIAL = [0.0, -0.0, 1.0, 0.5, 2.0, 1e-310, 5e-324, 1e300, np.inf, -np.inf, np.nan, -1.0, 3.0]


SPECIAL32 = [0.0, -0.0, 1.0, 0.5, 2.0, 1e-40, 1e-45, 3e38, np.inf, -np.inf, np.nan, -1.0, 3.0]   # float32's extremes


def values(dtype):
    f32 = dtype == np.float32
    return st.one_of(st.sampled_from(SPECIAL32 if f32 else SPECIAL), st.floats(-2, 4, allow_nan=False,
                                                                             width=32 if f32 else 64))


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def generic(num, q):
    import array_api_compat.numpy as cnp

    with np.errstate(all="ignore"):
        return X._ratio_min1_generic(num, q, cnp).astype(np.result_type(num, q), copy=False)


@st.composite
def pairs(draw):
    dt_n = draw(st.sampled_from([np.float32, np.float64]))
    dt_q = draw(st.sampled_from([np.float32, np.float64]))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=5))
    nshape = tuple(1 if draw(st.booleans()) else s for s in shape)      # num broadcasts over q (n, 1, V) / (n, L, V)
    num = draw(hnp.arrays(dt_n, nshape, elements=values(dt_n)))
    mass = draw(st.booleans())                                          # most calls: q a mass row (>= 0)
    q = draw(hnp.arrays(dt_q, shape, elements=values(dt_q)))
    if mass:
        q = np.where(np.isnan(q) | (q < 0), np.asarray(0, dt_q), q).astype(dt_q)
    return num, q


@settings(max_examples=400, deadline=None)
@given(pairs())
def test_ratio_min1_fast_path_is_the_generic_formula_bit_for_bit(nq):
    num, q = nq
    with np.errstate(all="ignore"):      # a negative num over q = 0 warns as the generic formula always did
        fast = X.ratio_min1(num, q)
    assert same_bits(fast, generic(num, q))


def test_ratio_min1_special_cases_and_a_planted_fast_path_without_the_nan_repair():
    num = np.array([0.0, 1.0, np.inf, np.nan, 0.3, -0.5, 0.0, 2.0])
    q = np.array([0.0, 0.0, np.inf, 0.2, np.nan, 0.0, 1e-310, 1e-320])
    want = np.array([1.0, 1.0, 1.0, np.nan, 1.0, -np.inf, 0.0, 1.0])
    got = X.ratio_min1(num, q)
    assert same_bits(got, generic(num, q)) and np.array_equal(got, want, equal_nan=True)

    def planted(n, d):                            # divide and clip only: 0 / 0 and a NaN q come out NaN, not 1
        with np.errstate(all="ignore"):
            return np.minimum(np.divide(n, d), 1)
    assert not same_bits(planted(num, q), generic(num, q))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64]), hnp.array_shapes(max_dims=3, max_side=6),
                  elements=st.sampled_from(SPECIAL32)))
def test_positive_part_fast_path_is_the_generic_formula_bit_for_bit(x):
    import array_api_compat.numpy as cnp

    want = cnp.where(x > 0, x, cnp.zeros_like(x))
    assert same_bits(X.positive_part(x), want)
    torch = pytest.importorskip("torch")
    t = torch.as_tensor(x)
    got, want_t = X.positive_part(t), torch.where(t > 0, t, torch.zeros_like(t))
    assert got.dtype == t.dtype and same_bits(got.numpy(), want_t.numpy()) and same_bits(got.numpy(), want)


def test_positive_part_control_a_planted_maximum_is_told_apart():
    x = np.array([np.nan, -1.0, 2.0])
    import array_api_compat.numpy as cnp

    want = cnp.where(x > 0, x, cnp.zeros_like(x))
    assert same_bits(X.positive_part(x), want) and not same_bits(np.maximum(x, 0), want)   # NaN -> 0, not NaN
    torch = pytest.importorskip("torch")
    t = torch.tensor([np.nan, -0.0, -1.0, 2.0])
    assert same_bits(X.positive_part(t).numpy(), np.array([0.0, 0.0, 0.0, 2.0], np.float32))
    assert not same_bits(t.clamp_min(0).numpy(), X.positive_part(t).numpy())   # NaN kept without the repair


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
                  elements=st.sampled_from([0.0, -0.0, 1.0, 0.25, 3.0, 1e-310, np.nan])),
       st.sampled_from([np.float32, np.float64]), st.booleans())
def test_normalize_fast_path_is_the_generic_formula_bit_for_bit(w, fdt, row_fallback):
    import array_api_compat.numpy as cnp

    fb = np.full(w.shape[-1:] if row_fallback else w.shape, 1.0 / w.shape[-1], dtype=fdt)
    s = cnp.sum(w, axis=-1, keepdims=True)
    empty = s <= 0
    want = cnp.where(empty, fb, w / cnp.where(empty, cnp.ones_like(s), s))
    assert same_bits(X.normalize(w, fb), want)


def test_normalize_control_an_empty_row_takes_the_fallback():
    w = np.array([[0.0, 0.0], [1.0, 3.0]])
    fb = np.array([0.5, 0.5])
    assert np.array_equal(X.normalize(w, fb), [[0.5, 0.5], [0.25, 0.75]])
    assert not np.array_equal(w / np.sum(w, axis=-1, keepdims=True), X.normalize(w, fb), equal_nan=True)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
                  elements=st.sampled_from([0.0, -0.0, 1.0, 0.25, 3.0, 1e-30])), st.booleans())
def test_normalize_host_torch_is_the_device_formula_bit_for_bit(w, row_fallback):
    """``normalize(host=True)`` on torch CPU rows (the sums read on the host; with no empty row the division alone)
    gives the device formula's bits, empty rows (the fallback) included."""
    import torch

    t = torch.from_numpy(w)
    fb = torch.full(w.shape[-1:] if row_fallback else w.shape, 1.0 / w.shape[-1])
    assert same_bits(X.normalize(t, fb, host=True).numpy(), X.normalize(t, fb).numpy())


def test_normalize_host_control_an_empty_row_takes_the_fallback():
    """Control: the host division without its emptiness test would leave NaN where a row is empty."""
    import torch

    w, fb = torch.tensor([[0.0, 0.0], [1.0, 3.0]]), torch.tensor([0.5, 0.5])
    assert X.normalize(w, fb, host=True).tolist() == [[0.5, 0.5], [0.25, 0.75]]
    assert torch.isnan(w / w.sum(-1, keepdim=True)).any()


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_put_last_writes_the_listed_codes_only(backend):
    """``put_last`` (a copy with values scattered at the listed codes, repeats of equal values allowed) against the
    loop over rows written here, on every backend the rules run on; scalar and per-entry values; the input is left
    untouched. Control: writing at the codes shifted by one is told apart."""
    from theory.core.xp import put_last

    rng = np.random.default_rng(2)
    x = rng.random((3, 4, 11))
    idx = rng.integers(0, 11, (3, 4, 5))
    idx[..., 1] = idx[..., 0]                                   # a repeat
    vals = rng.random((3, 4, 5))
    vals[..., 1] = vals[..., 0]                                 # ... with an equal value
    want_s, want_v = x.copy(), x.copy()
    for r in np.ndindex(3, 4):
        want_s[r][idx[r]] = 0.0
        want_v[r][idx[r]] = vals[r]
    if backend == "numpy":
        to, back = (lambda a: a), np.asarray
    else:
        m = pytest.importorskip(backend)
        if backend == "jax":
            m.config.update("jax_enable_x64", True)
            to, back = m.numpy.asarray, np.asarray
        else:
            to, back = m.as_tensor, lambda a: a.numpy()
    X = to(x)
    got_s = back(put_last(X, to(idx), to(np.zeros((), x.dtype))))
    got_v = back(put_last(X, to(idx), to(vals)))
    assert np.array_equal(got_s, want_s) and np.array_equal(got_v, want_v)
    assert np.array_equal(back(X), x)
    Y = to(x.copy())
    assert np.array_equal(back(put_last(Y, to(idx), to(vals), copy=False)), want_v)
    if backend != "jax":                                        # written in place where the backend can
        assert np.array_equal(back(Y), want_v)
    assert not np.array_equal(back(put_last(X, to((idx + 1) % 11), to(vals))), want_v)


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(0, 4), min_size=0, max_size=3), V=st.integers(1, 9), J=st.integers(0, 5),
       seed=st.integers(0, 2 ** 31), strided=st.booleans())
def test_take_last_fast_path_is_take_along_axis(lead, V, J, seed, strided):
    """numpy's 2-D-view gather (contiguous rows, indices of the same leading shape; negative indices wrap) equals
    ``np.take_along_axis`` bit for bit, and the fallbacks (a strided x, broadcast leading axes) too; control: the same
    gather with the indices one code off differs where some row has two distinct values."""
    g = np.random.default_rng(seed)
    x = g.standard_normal((*lead, 2 * V if strided else V))
    x = x[..., ::2] if strided else x
    idx = g.integers(-V, V, (*lead, J))
    want = np.take_along_axis(x, idx, axis=-1)
    assert same_bits(X.take_last(x, idx), want)
    if lead:
        assert same_bits(X.take_last(x[:1], idx), np.take_along_axis(x[:1], idx, axis=-1))   # broadcast: fallback
    off = (idx + 1) % V
    if want.size and V > 1 and not np.array_equal(np.take_along_axis(x, off, axis=-1), want):
        assert not same_bits(X.take_last(x, off), want)


def test_namespace_cache_is_the_compat_layers_answer():
    import array_api_compat
    import torch

    a, t = np.zeros(3), torch.zeros(3)
    for args in ((a,), (a, a), (t,), (t, t), (a, np.float64(1.0))):
        assert X.namespace(*args) is array_api_compat.array_namespace(*args)
    with pytest.raises(TypeError):                  # a numpy and a torch array together: refused, cache or not
        X.namespace(a, t)
    with pytest.raises(TypeError):
        X.namespace(t, a)


def test_gather_rows_fast_path_is_take_along_axis():
    """numpy (B, N, V) rows picked by (B,) indices (fancy indexing) equal take_along_axis's rows, negative indices
    included; control: the rows of the next index differ."""
    g = np.random.default_rng(1)
    x = g.standard_normal((5, 7, 4))
    idx = g.integers(-7, 7, 5)
    want = np.take_along_axis(x, idx[:, None, None], axis=-2)[:, 0, :]
    assert same_bits(X.gather_rows(x, idx), want)
    assert same_bits(X.gather_rows(x[None], idx[None]), want[None])          # other shapes: take_along_axis
    assert not same_bits(X.gather_rows(x, (idx + 1) % 7), want)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.0, 0.9))
def test_divide_or_zero_is_the_guarded_division_bit_for_bit(seed, zero_share):
    """numpy's one division with the empty entries zeroed == the guarded where-division, bit for bit, broadcast
    (num (4, 3, 7), den (4, 1, 7)) with zeros in both; torch the same values; the mask is den <= 0 (None when none)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    num = rng.random((4, 3, 7)) * (rng.random((4, 3, 7)) > zero_share)
    den = rng.random((4, 1, 7)) * (rng.random((4, 1, 7)) > zero_share)
    want = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    got, empty = X.divide_or_zero(num, den)
    assert got.shape == want.shape and np.array_equal(got, want)
    assert (empty is None and (den > 0).all()) or np.array_equal(empty, den <= 0)
    got_t, _ = X.divide_or_zero(torch.as_tensor(num), torch.as_tensor(den))
    assert np.array_equal(got_t.numpy(), want)


def test_control_an_unguarded_division_is_caught():
    """Negative control: dividing by den with zeros unguarded gives NaN / inf, which the comparison above rejects."""
    num, den = np.array([1.0, 0.0, 2.0]), np.array([2.0, 0.0, 0.0])
    with np.errstate(divide="ignore", invalid="ignore"):
        raw = num / den
    got, empty = X.divide_or_zero(num, den)
    assert not np.array_equal(raw, got) and got.tolist() == [0.5, 0.0, 0.0] and empty.tolist() == [False, True, True]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([np.float32, np.float64]), st.booleans())
def test_discrepancy_on_numpy_is_the_array_api_formula_bit_for_bit(seed, dt, broadcast_p):
    """T3 on numpy rows (``discrepancy``: in one scratch block, in place) gives the array-API formula's bits
    (``discrepancy_of`` without scratch, the compat namespace), broadcast target rows and mixed dtypes included."""
    import array_api_compat.numpy as cnp
    from theory.rules.discrepancy import discrepancy, discrepancy_of

    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(9, 0.4), 1 if broadcast_p else 3).astype(dt)
    Q = rng.dirichlet(np.full(9, 0.4), 3)
    f = np.where(rng.random((3, 9)) < 0.3, 1.0, rng.random((3, 9))).astype(dt)
    G = rng.dirichlet(np.full(9, 0.4), 3)
    assert same_bits(discrepancy(P, Q, f, G), discrepancy_of(Q * f, P, G, cnp))


def test_control_discrepancy_in_another_order_is_told_apart():
    """Control: the same terms summed in another order (A - P first) differ in the last bits on these rows."""
    from theory.rules.discrepancy import discrepancy

    rng = np.random.default_rng(1)
    P, Q, G = (rng.dirichlet(np.full(64, 0.4), 50) for _ in range(3))
    f = rng.random((50, 64))
    A = Q * f
    other = 0.5 * np.abs((A - P) + (1 - A.sum(-1, keepdims=True)) * G).sum(-1)
    assert np.allclose(other, discrepancy(P, Q, f, G)) and not same_bits(other, discrepancy(P, Q, f, G))


def _sample_generic(w, u):
    """``sample_categorical``'s generic formula (the count of cumulative sums <= u * total, off-support draws to the
    row's argmax), step for step in the compat namespace: the reference of numpy's one-row binary search."""
    import array_api_compat.numpy as cnp

    c = cnp.cumulative_sum(w, axis=-1)
    t = u * c[..., -1]
    idx = cnp.minimum(cnp.sum(cnp.astype(c <= t[..., None], cnp.int64), axis=-1), w.shape[-1] - 1)
    ok = cnp.take_along_axis(w, idx[..., None], axis=-1)[..., 0] > 0
    return cnp.where(ok, idx, cnp.astype(cnp.argmax(w, axis=-1), cnp.int64))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([np.float32, np.float64]), st.integers(1, 4),
       st.lists(st.sampled_from([0.0, -0.0, 1.0, 0.25, 3.0, 1e-30, 1e-40, 7.0, np.inf, np.nan, -1.0]), min_size=1,
                max_size=12),
       st.one_of(st.sampled_from([0.0, 0.5, 1.0 - 2.0 ** -53]), st.floats(0, 1, exclude_max=True)))
def test_sample_categorical_one_row_search_is_the_generic_count(dt, rows, vals, u0):
    """numpy's one-row path (a binary search of the cumulative sums) draws the generic formula's index, zeros, tiny
    and special weights (inf, NaN, negative: the generic count is kept for those) and u at the ends included; rows
    of several images take the count (compared too)."""
    w = np.asarray([vals] * rows, dt)
    w[1:] = np.roll(w[1:], 1, axis=-1)
    u = np.full(rows, u0)
    with np.errstate(all="ignore"):
        got, want = X.sample_categorical(w, u), _sample_generic(w, u)
        assert got.dtype == np.int64 and np.array_equal(got, want)
        assert np.array_equal(X.sample_categorical(w[:1], u[:1]), _sample_generic(w[:1], u[:1]))


def test_sample_categorical_one_row_control_a_left_search_is_told_apart():
    """Control: the search's left insertion point (count of c < t) draws another token where u * total lands on a
    cumulative sum exactly; the one-row path draws the count's."""
    w, u = np.array([[1.0, 1.0, 2.0]]), np.array([0.5])            # t = 2.0 = c[1]: count(c <= 2) = 2
    assert X.sample_categorical(w, u).tolist() == _sample_generic(w, u).tolist() == [2]
    c = np.cumsum(w[0])
    assert int(np.searchsorted(c, u[0] * c[-1], side="left")) == 1


@st.composite
def one_entry_pairs(draw):
    dt_n = draw(st.sampled_from([np.float32, np.float64]))
    dt_q = draw(st.sampled_from([np.float32, np.float64]))
    num = np.asarray(draw(values(dt_n)), dt_n).reshape((1,) * draw(st.integers(0, 2)))
    q = np.asarray(draw(values(dt_q)), dt_q).reshape((1,) * draw(st.integers(0, 2)))
    if draw(st.booleans()):                                            # a mass q (>= 0), as most calls
        q = np.where(np.isnan(q) | (q < 0), np.asarray(0, dt_q), q).astype(dt_q)
    if draw(st.booleans()):                                            # a quotient near float32's ties and tails
        num = np.asarray(draw(st.floats(0, 1, width=32 if dt_n == np.float32 else 64)), dt_n).reshape(num.shape)
    return num, q


@settings(max_examples=600, deadline=None)
@given(one_entry_pairs())
def test_ratio_min1_one_entry_python_floats_are_the_generic_formula_bit_for_bit(nq):
    """One entry each (a walk's step at batch 1): the Python-float path (float32's quotient by float64's, rounded
    once more) gives the generic formula's bits, shape and dtype, special values and denormals included."""
    num, q = nq
    with np.errstate(all="ignore"):
        got = X.ratio_min1(num, q)
    assert same_bits(got, generic(num, q))


def test_ratio_min1_one_entry_control_a_float32_quotient_rounded_twice_the_wrong_way_is_told_apart():
    """Control: the float32 quotient computed in float64 and truncated (not rounded) to float32 differs from the
    generic formula somewhere on these entries; the one-entry path matches it on all of them."""
    rng = np.random.default_rng(0)
    nums, qs = rng.random(200).astype(np.float32), (rng.random(200) + 1).astype(np.float32)
    differs = False
    for a, b in zip(nums, qs):                     # (a test: one entry at a time is the path under test)
        a1, b1 = np.array([a]), np.array([b])
        assert same_bits(X.ratio_min1(a1, b1), generic(a1, b1))
        exact = np.float64(a) / np.float64(b)
        trunc = np.float32(exact)
        if np.float64(trunc) > exact:              # truncation toward zero instead of rounding to nearest
            trunc = np.nextafter(trunc, np.float32(0))
        differs |= not same_bits(np.array([trunc]), generic(a1, b1))
    assert differs
