"""LANTERN's neighbour table built only when read, only as wide as read, cached on disk (real.neighbors, issue 55)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from real import neighbors as nbmod  # noqa: E402
from real.decode.methods import make_verifier  # noqa: E402
from real.neighbors import NeighborTable  # noqa: E402
from theory import rules  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COOLSD_CACHE", str(tmp_path))
    monkeypatch.setattr(nbmod, "CACHE_MIN_V", 0)       # cache the small test codebooks too
    return tmp_path / "neighbors"


def _codebook(V=64, d=4, seed=0):
    return torch.as_tensor(np.random.default_rng(seed).normal(size=(V, d)))


def test_nothing_is_built_until_a_rule_reads_it(cache, monkeypatch):
    calls = []
    real = NeighborTable._compute
    monkeypatch.setattr(NeighborTable, "_compute", lambda self, K: calls.append(K) or real(self, K))
    t = NeighborTable(_codebook(), "raw", 40)
    assert t.shape == (64, 40) and calls == []
    make_verifier("cool-sd", 4, {}, t)                     # a rule that reads no table
    make_verifier("vanilla", 4, {}, t)
    assert calls == []
    v = make_verifier("lantern++", 4, {"k": 10}, t)       # the release's resampler reads k + 1 columns
    assert calls == [11] and v.accept.neighbors.shape == (64, 11)
    assert not list(cache.glob("*.tmp"))


def test_the_table_is_the_reference_and_a_prefix_serves_narrower_rules(cache):
    cb = _codebook()
    ref = rules.lantern_neighbors(cb.numpy(), 63)
    t = NeighborTable(cb, "raw")
    assert np.array_equal(t.table(20), ref[:, :20])
    assert np.array_equal(t.table(63), ref)
    assert np.array_equal(np.asarray(t), ref)
    l2 = NeighborTable(cb, "l2").table(20)
    assert np.array_equal(l2, rules.lantern_neighbors(cb.numpy(), 20, normalize=True))
    assert not np.array_equal(l2, ref[:, :20])           # control: the two spaces differ on this codebook


def test_a_second_build_reads_the_cache_and_a_stale_file_is_refused(cache, monkeypatch):
    cb = _codebook()
    NeighborTable(cb, "raw").table(30)
    files = list(cache.glob("*.npz"))
    assert len(files) == 1
    monkeypatch.setattr(NeighborTable, "_compute", lambda self, K: pytest.fail("recomputed despite the cache"))
    assert np.array_equal(NeighborTable(cb, "raw").table(25), rules.lantern_neighbors(cb.numpy(), 25))
    # a file of another codebook under this key's name: refused with the reason, not used
    other = NeighborTable(_codebook(seed=1), "raw")
    bad = files[0]
    with np.load(bad) as z:
        np.savez(bad, table=z["table"], key=np.asarray(other.key), space=np.asarray("raw"))
    with pytest.raises(ValueError, match="another codebook"):
        NeighborTable(cb, "raw").table(25)
    bad.write_bytes(b"not an npz")
    with pytest.raises(ValueError, match="unreadable"):
        NeighborTable(cb, "raw").table(25)


def test_bad_codebooks_and_widths_are_refused():
    with pytest.raises(ValueError, match="NaN"):
        NeighborTable(torch.tensor([[0.0, float("nan")], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="lantern-neighbors"):
        NeighborTable(_codebook(), "cosine")
    with pytest.raises(ValueError, match="columns"):
        NeighborTable(_codebook(), "raw").table(64)


def test_tables_are_numpy_where_rounds_are_verified_on_the_host():
    """On a CPU (the host path) LANTERN's neighbour table and GSD's closeness table reach the verifier as numpy, so
    its rounds are verified on numpy views (real.nn.devpath.host_verification); with the device path forced (the
    control) they stay torch tensors and the rounds take the device walks."""
    from real.nn.devpath import host_verification
    from real.nn import devpath

    nb = torch.as_tensor(rules.lantern_neighbors(_codebook().numpy(), 8))
    emb = _codebook(d=4, seed=1).to(torch.bfloat16)
    for forced in (False, True):
        with devpath.force(forced):
            lp = make_verifier("lantern++", 4, {"k": 4}, nb, device="cpu")
            gsd = make_verifier("gsd", 4, device="cpu", embeddings=emb)
            for v, table in ((lp, lp.accept.neighbors), (gsd, gsd.accept.close)):
                assert isinstance(table, torch.Tensor) is forced, (forced, v.name)
                assert host_verification("cpu", v) is not forced, (forced, v.name)


def _alike(a, b) -> bool:
    """Two verifiers alike: name, parameters, and every attribute of their acceptance and resampling rules, arrays of
    one type (numpy / torch) and the same values."""
    if a.name != b.name or a.params != b.params:
        return False
    for x, y in ((a.accept, b.accept), (a.resample, b.resample)):
        va, vb = getattr(x, "__dict__", {}), getattr(y, "__dict__", {})
        if type(x) is not type(y) or va.keys() != vb.keys():
            return False
        for k in va:
            u, w = va[k], vb[k]
            if isinstance(u, (np.ndarray, torch.Tensor)) or isinstance(w, (np.ndarray, torch.Tensor)):
                if type(u) is not type(w) or not np.array_equal(np.asarray(u.cpu() if isinstance(u, torch.Tensor)
                                                                            else u),
                                                                 np.asarray(w.cpu() if isinstance(w, torch.Tensor)
                                                                            else w)):
                    return False
            elif not callable(u) and u != w:
                return False
    return True


@pytest.mark.parametrize("forced", [False, True])
def test_resolved_verifiers_are_the_two_single_placements(cache, forced):
    """``resolved_verifiers`` (``coolsd generate``: the engine's verifier on the model's device and --fidelity's rule
    as given, in one pass, the lazy table read once) gives what two ``resolved_verifier`` calls give, for LANTERN's
    neighbour table, GSD's closeness table (bf16 vectors) and a rule with neither, on the host path and with the
    device path forced. Control: with the device path forced the engine's verifier holds torch tables and the rule
    numpy ones, and ``_alike`` tells them apart."""
    from real.decode.methods import resolved_verifier, resolved_verifiers
    from real.nn import devpath
    from theory.rules import methods as registry

    emb = _codebook(d=4, seed=1).to(torch.bfloat16)
    with devpath.force(forced):
        for method, params in (("lantern++", {"k": 4}), ("gsd", {}), ("cool-sd", {})):
            full = registry.resolve(method, params)
            got = resolved_verifiers(method, full, NeighborTable(_codebook(), "raw"), emb, L=3, device="cpu",
                                     host_L=5)
            want = [resolved_verifier(method, 3, full, NeighborTable(_codebook(), "raw"), "cpu", emb),
                    resolved_verifier(method, 5, full, NeighborTable(_codebook(), "raw"), None, emb)]
            assert len(got) == 2 and all(_alike(g, w) for g, w in zip(got, want)), (method, forced)
            one = resolved_verifiers(method, full, NeighborTable(_codebook(), "raw"), emb, L=3, device="cpu")
            assert len(one) == 1 and _alike(one[0], want[0])
            if forced and method == "lantern++":
                assert not _alike(got[0], got[1])
