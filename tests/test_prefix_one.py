"""theory.rules.prefix_mass: the one-entry path of ``prefix_mass_at`` (``_prefix_one``, a batch-1 walk's candidate)
equals the few-entry path (``_prefix_mass_few``, the same entry among others) and the dense row's entry, bit for bit:
float32 and float64 rows with exact zeros, -0.0 and ties, tables of k below and above two first blocks (the second
block carried on), scalar thresholds (LANTERN's delta, a Python float) and (1,) ones (LANTERN++'s (lam - 1) p(x)),
thresholds set exactly on a prefix sum, and the float64 sums of the torch views (``sum_dtype``). Control: the same
check sees a one-entry sum that compares strictly (u < thr for u <= thr) on the thresholds set on a sum."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from theory.rules import prefix_mass as PM


def _case(seed, V, k, dtype, on_sum):
    """(flat rows pf (2 V,), table (V, k), entry e, thresholds: a scalar and a (1,) array)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.3), size=2)
    p[rng.random(p.shape) < 0.2] = 0.0
    if rng.random() < 0.5:
        p = np.round(p * 64) / 64                               # ties
    p = p.astype(dtype)
    p[p == 0] = np.where(rng.random(np.count_nonzero(p == 0)) < 0.5, -0.0, 0.0).astype(dtype)
    nb = np.stack([rng.permutation(np.delete(np.arange(V), y))[:k] for y in range(V)]).astype(np.int64)
    e = int(rng.integers(0, 2 * V))
    cs = np.cumsum(p.reshape(-1)[e - e % V + nb[e % V]], dtype=dtype)
    if on_sum:
        thr = float(cs[int(rng.integers(0, k))])                # exactly a prefix sum
    else:
        thr = float(rng.choice([0.0, 0.05, 0.2, 1.0]))
    return p.reshape(-1), nb, e, thr, np.asarray([thr], dtype)


def _equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([8, 40, 200]), dtype=st.sampled_from([np.float32, np.float64]),
       on_sum=st.booleans(), wide=st.booleans(), sum64=st.booleans())
def test_one_entry_equals_few_and_dense_bit_for_bit(seed, V, dtype, on_sum, wide, sum64):
    k = min(V - 1, 150 if wide else 20)
    pf, nb, e, thr, thr1 = _case(seed, V, k, dtype, on_sum)
    sd = np.float64 if sum64 else None
    for t, tt in ((thr, thr), (thr1, np.concatenate([thr1, thr1]))):   # scalar; (1,) (the pair's: each entry's own)
        one = PM.prefix_mass_at(pf, np.array([e]), nb, t, k, V, sum_dtype=sd)
        few = PM.prefix_mass_at(pf, np.array([e, (e + 1) % (2 * V)]), nb, tt, k, V, sum_dtype=sd)[:1]
        assert _equal(one, few), (one, few)
        if sd is None:
            dense = PM.prefix_mass(pf.reshape(2, V), nb, t, k).reshape(-1)[e:e + 1]
            assert _equal(one, dense), (one, dense)


def test_control_a_strict_comparison_is_seen(monkeypatch):
    """A one-entry path that compares sum < thr (for <=) differs from the few-entry path on thresholds set on a sum."""
    real = PM._prefix_one

    def strict(pf, e, nb, thr, k, V, acc, w):
        return real(pf, e, nb, np.nextafter(np.asarray(thr, acc), -np.inf), k, V, acc, w)

    monkeypatch.setattr(PM, "_prefix_one", strict)
    seen = 0
    for seed in range(60):   # a loop over fixed cases (test code)
        pf, nb, e, thr, _ = _case(seed, 40, 39, np.float64, True)
        one = PM.prefix_mass_at(pf, np.array([e]), nb, thr, 39, 40)
        few = PM.prefix_mass_at(pf, np.array([e, (e + 1) % 80]), nb, thr, 39, 40)[:1]
        seen += not _equal(one, few)
    assert seen >= 20, seen
