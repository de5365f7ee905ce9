"""The engine's CPU fast paths give what the plain operations give: ``real.nn.layers.linear`` (oneDNN with packed,
possibly fused weights, rebuilt whenever a weight changes), ``real.nn.layers.attend`` (fused kernel or written out),
``KVCache.begin`` with every row at the same length (one shared mask) and ``KVCache.keep`` when the kept
entries are already in place (no copy)."""
from __future__ import annotations

import contextlib
import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from real.nn import layers
from real.nn.kvcache import KVCache

needs_onednn = pytest.mark.skipif(not layers._ONEDNN, reason="torch built without oneDNN (or COOLSD_CPU_GEMM=default)")


def _spy(monkeypatch):
    """Count the calls that reach oneDNN."""
    calls = []
    real = layers._onednn_linear

    def spy(*a):
        calls.append(a[0].shape)
        return real(*a)
    monkeypatch.setattr(layers, "_onednn_linear", spy)
    return calls


@needs_onednn
def test_linear_packed_and_fused_match_f_linear(monkeypatch):
    calls = _spy(monkeypatch)
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(256, 768, bias=True)
    q, k, v = (nn.Linear(256, n, bias=False) for n in (512, 128, 128))
    sm = nn.Linear(256, 256, bias=False)                           # 2^16 entries
    x = torch.randn(2, 26, 256, generator=g)
    with torch.no_grad():
        outside = layers.linear(x, lin.weight, lin.bias)           # no scope: plain F.linear, nothing cached
        assert not calls and not layers._CACHE
        with layers.inference_weights():
            got = layers.linear(x, lin.weight, lin.bias)
            fused = layers.linear(x, (q.weight, k.weight, v.weight))
            small = layers.linear(x[:1, :1], sm.weight)            # a small weight at one row: MKL
            small_many = layers.linear(x, sm.weight)               # 52 rows: 3.4M multiply-adds, oneDNN
            assert len(layers._CACHE) == 3
        assert not layers._CACHE                                   # dropped when the scope ends
    assert len(calls) == 3                                         # the three big products went to oneDNN
    assert torch.equal(outside, F.linear(x, lin.weight, lin.bias))
    assert torch.allclose(got, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert torch.allclose(fused, torch.cat([q(x), k(x), v(x)], -1), rtol=1e-5, atol=1e-5)
    assert torch.equal(small, F.linear(x[:1, :1], sm.weight))
    assert torch.allclose(small_many, F.linear(x, sm.weight), rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 26, 768) and fused.shape == (2, 26, 768)


@needs_onednn
def test_linear_repacks_after_every_kind_of_weight_change(monkeypatch):
    """A stale packed copy would give the old product: each change below moves the output by O(1)."""
    _spy(monkeypatch)
    lin = nn.Linear(256, 1024, bias=False)
    x = torch.randn(4, 256)
    with torch.no_grad(), layers.inference_weights():
        y0 = layers.linear(x, lin.weight)
        lin.weight.add_(1.0)                                        # in place (an optimiser step)
        y1 = layers.linear(x, lin.weight)
        assert torch.allclose(y1, F.linear(x, lin.weight), rtol=1e-5, atol=1e-4)
        assert not torch.allclose(y0, y1, atol=1.0)
        lin.load_state_dict({"weight": torch.zeros(1024, 256)})    # load_state_dict copies in place
        assert torch.equal(layers.linear(x, lin.weight), torch.zeros(4, 1024))
        lin.weight.data = torch.ones(1024, 256)                    # a new storage
        assert torch.allclose(layers.linear(x, lin.weight), x.sum(-1, keepdim=True).expand(-1, 1024), atol=1e-4)
        lin.weight.data = lin.weight.data[:300]                    # a view of the same storage: new shape
        assert layers.linear(x, lin.weight).shape == (4, 300)


def test_linear_outside_a_scope_reads_the_weights_themselves():
    """Training is outside any scope: a fused optimiser step (which leaves the version counter alone) and writes
    through ``.data`` are seen at once, and gradients flow as through ``F.linear``."""
    lin = nn.Linear(256, 1024, bias=False)
    x = torch.randn(4, 256)
    with layers.inference_weights(), torch.no_grad():
        layers.linear(x, lin.weight)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.5, fused=True)
    lin.weight.grad = torch.ones_like(lin.weight)
    opt.step()
    lin.weight.data.mul_(2.0)
    with torch.no_grad():
        assert torch.equal(layers.linear(x, lin.weight), F.linear(x, lin.weight))


def test_training_keeps_the_plain_arithmetic():
    """Under autograd every piece computes exactly what the shipped checkpoints were trained with: each weight of
    a tuple its own ``F.linear``, the written-out attention, the written-out RMSNorm (bitwise)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 64, generator=g, requires_grad=True)
    w1, w2, w3 = (nn.Parameter(torch.randn(n, 64, generator=g)) for n in (32, 16, 16))
    with layers.inference_weights():
        y = layers.linear(x, (w1, w2, w3))
        q, k, v = (t.view(3, 5, 2, -1).transpose(1, 2) for t in y.split([32, 16, 16], -1))
        att = layers.attend(q.repeat(1, 1, 1, 2)[..., :8], k, v, causal=True)
        nw = nn.Parameter(torch.rand(64, generator=g))
        n = layers.rms_norm(x, nw, 1e-5)
    assert torch.equal(y, torch.cat([F.linear(x, w1), F.linear(x, w2), F.linear(x, w3)], -1))
    qq = q.repeat(1, 1, 1, 2)[..., :8]
    a = (qq @ k.transpose(-1, -2)) * qq.shape[-1] ** -0.5
    a = a.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril_(), float("-inf"))
    assert torch.equal(att, a.softmax(-1) @ v)
    assert torch.equal(n, (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)) * nw)
    (y.sum() + att.sum() + n.sum()).backward()
    assert w1.grad is not None and x.grad is not None


@needs_onednn
def test_linear_under_autograd_is_f_linear_with_gradients(monkeypatch):
    calls = _spy(monkeypatch)
    lin = nn.Linear(256, 1024)
    x = torch.randn(8, 256, requires_grad=True)
    with layers.inference_weights():
        y = layers.linear(x, (lin.weight,), lin.bias)
    y.square().sum().backward()
    assert not calls
    ref_x = x.detach().clone().requires_grad_(True)
    F.linear(ref_x, lin.weight, lin.bias).square().sum().backward()
    assert torch.allclose(x.grad, ref_x.grad)
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


@needs_onednn
def test_linear_cache_dies_with_its_weights_and_its_scope(monkeypatch):
    _spy(monkeypatch)
    lin = nn.Linear(256, 1024, bias=False)
    keep = nn.Linear(256, 1024, bias=False)
    with torch.no_grad(), layers.inference_weights():
        layers.linear(torch.randn(4, 256), lin.weight)
        layers.linear(torch.randn(4, 256), keep.weight)
        assert len(layers._CACHE) == 2
        del lin
        gc.collect()
        assert len(layers._CACHE) == 1
    assert len(layers._CACHE) == 0
    torch.__future__.set_swap_module_params_on_conversion(True)    # swap_tensors needs weights without weak refs
    try:
        keep.to(torch.float64)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert keep.weight.dtype == torch.float64


def test_linear_off_switch_and_other_devices_use_f_linear(monkeypatch):
    calls = _spy(monkeypatch) if layers._ONEDNN else []
    monkeypatch.setattr(layers, "_ONEDNN", False)
    lin = nn.Linear(256, 1024, bias=False)
    x = torch.randn(4, 256)
    with torch.no_grad(), layers.inference_weights():
        assert torch.equal(layers.linear(x, lin.weight), F.linear(x, lin.weight))
        assert torch.equal(layers.linear(x.double(), lin.weight.double()), F.linear(x.double(), lin.weight.double()))
    assert not calls


@pytest.mark.parametrize("B,S,K,kind", [(2, 1, 40, None), (2, 4, 40, "mask"), (2, 26, 60, "mask"), (16, 1, 40, "mask"),
                                        (12, 1, 40, None), (2, 30, 30, "causal")])
@pytest.mark.parametrize("scoped", [False, True])
def test_attend_matches_the_written_out_softmax(B, S, K, kind, scoped):
    """Whichever kernel ``attend`` picks for the shape, inside an ``inference_weights`` scope or not, equals
    softmax(q k^T / sqrt(d) + mask) v in float64."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, 4, n, 16, generator=g) for n in (S, K, K))
    mask = None
    if kind == "mask":
        mask = torch.rand(B, 1, S, K, generator=g) > 0.4
        mask[..., -S:] |= torch.eye(S, dtype=torch.bool)                 # every query sees itself
    with layers.inference_weights() if scoped else contextlib.nullcontext():
        got = layers.attend(q, k, v, mask, causal=kind == "causal")
    a = q.double() @ k.double().transpose(-1, -2) / 4.0
    if kind == "causal":
        mask = torch.ones(S, K, dtype=torch.bool).tril(K - S)
    if mask is not None:
        a = a.masked_fill(~mask, float("-inf"))
    assert torch.allclose(got.double(), a.softmax(-1) @ v.double(), atol=1e-5)


def test_kvcache_equal_lengths_mask_and_keep_in_place():
    """Rows at the same length share one (1, 1, S, K) mask equal to the per-row construction; keeping entries
    already in place moves nothing (a sentinel written past the kept entries survives), other keeps do."""
    c = KVCache(2, 2, 1, 12, 1, dtype=torch.float32, device="cpu")
    c.begin(5)
    for i in range(2):
        c.update(i, torch.arange(10.0).view(2, 1, 5, 1), torch.arange(10.0).view(2, 1, 5, 1))
    c.commit()
    m = c.begin(3)                                                       # causal block of 3 after 5 entries
    assert m.shape == (1, 1, 3, 8)
    assert m[0, 0].tolist() == [[True] * 6 + [False] * 2, [True] * 7 + [False], [True] * 8]
    tm = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
    m = c.begin(2, tm[1:])                                               # tree level over the last cached entry
    assert m[0, 0].tolist() == [[True] * 4 + [True, True, False], [True] * 4 + [True, False, True]]
    c.begin(3, tm)
    for i in range(2):
        c.update(i, torch.full((2, 1, 3, 1), 7.0), torch.full((2, 1, 3, 1), 7.0))
    c.commit()
    c.k[0][:, 0, 6, 0] = -1.0                                            # sentinel in block slot 1
    c.keep(np.array([0]), np.array([1, 1]))                               # in place: no copy
    assert c.lens.tolist() == [6, 6] and c.k[0][:, 0, 6, 0].tolist() == [-1.0, -1.0]
    c.begin(3, tm)
    for i in range(2):
        c.update(i, torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 3, 1).expand(2, 1, 3, 1).contiguous(),
                 torch.zeros(2, 1, 3, 1))
    c.commit()
    c.keep(np.array([0, 2]))                                             # node 2 moves to slot 1 in every layer
    assert c.lens.tolist() == [8, 8]
    assert c.k[0][:, 0, 6:8, 0].tolist() == [[1.0, 3.0]] * 2 and c.k[1][:, 0, 6:8, 0].tolist() == [[1.0, 3.0]] * 2


def test_host_verification_gives_the_torch_verdict():
    """``verify_round`` on the host (numpy views of the rows, ``real.decode.round.on_host``) returns the torch path's
    verdict on the same rows, for chains and trees; a verifier holding a tensor (LANTERN's neighbour table placed on
    the device) is kept on torch, one without is verified on the host."""
    from types import SimpleNamespace

    from real.decode.round import on_host
    from real.nn.devpath import holds_tensors, host_verification
    from theory import rules
    from theory.rules.lantern import lantern_neighbors
    from theory.tree import EAGLE_25, Tree, verify_round, verify_tree
    from theory.rules.chain import verify_chain

    g = torch.Generator().manual_seed(3)
    V, B, tree = 64, 5, Tree(EAGLE_25)
    N = tree.n_nodes
    p = torch.softmax(2 * torch.randn(B, N + 1, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(B, N + 1, V, generator=g, dtype=torch.float64), -1)
    tok = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, N + 1)
    ua, us = torch.rand(B, N + 1, generator=g, dtype=torch.float64), torch.rand(B, generator=g, dtype=torch.float64)
    nb = lantern_neighbors(np.random.default_rng(0).normal(size=(V, 4)), 8)
    lpp_t = rules.lantern_pp(torch.as_tensor(nb), 2, 2.0)
    host = SimpleNamespace(host=True)
    for v in (rules.vanilla(), rules.cool_sd(2.0), rules.lantern_pp(nb, 2, 2.0)):
        cap = torch.tensor([5, 5, 2, 1, 5])
        want = verify_tree(p, q, tok, ua, us, tree, v, early_exit=True, max_depth=cap,
                           draft_law="without_replacement")
        *rows, c = on_host(host, p, q, tok, ua, us, cap)
        assert all(isinstance(a, np.ndarray) for a in rows)
        got = verify_round(*rows, tree, v, law="without_replacement", max_depth=c)
        assert all(np.array_equal(np.asarray(a), b.numpy()) for a, b in zip(got, want)), v.name
        nd = torch.tensor([4, 4, 2, 0, 3])
        c_want = verify_chain(p[:, :5], q[:, :4], tok[:, 1:5], ua[:, :4], us, v, n_drafted=nd)
        *rows, c = on_host(host, p[:, :5], q[:, :4], tok[:, :5], ua[:, :5], us, nd)
        c_got = verify_round(*rows, None, v, law="sampled", max_depth=c)
        assert np.array_equal(c_got.accepted, c_want.accepted.numpy()), v.name
        assert np.array_equal(c_got.next_token, c_want.next_token.numpy()), v.name
    assert not holds_tensors(rules.vanilla()) and not holds_tensors(rules.lantern_pp(nb, 2, 2.0))
    assert holds_tensors(lpp_t)
    assert host_verification("cpu", rules.cool_sd(2.0)) and not host_verification("cpu", lpp_t)
    assert not host_verification("meta", rules.vanilla())


@pytest.mark.parametrize("shared", [True, False])
def test_keep_matches_a_row_by_row_copy(shared):
    """KVCache.keep (one index_select when every row keeps the same slots, an advanced-index copy otherwise) against a
    brute-force copy per row, layer, head and entry, on random blocks with ragged lengths and partial counts."""
    rng = np.random.default_rng(5 if shared else 6)
    for _ in range(40):
        R, L, H, M, hd = int(rng.integers(1, 5)), int(rng.integers(1, 3)), 2, 40, 3
        c = KVCache(L, R, H, M, hd, dtype=torch.float32, device="cpu")
        c.kv.copy_(torch.randn(c.kv.shape))
        c.lens[:] = int(rng.integers(0, 10)) if shared else rng.integers(0, 10, R)
        S = int(rng.integers(1, 12))
        c.begin(S)
        c.commit()
        k = int(rng.integers(1, S + 1))
        rows = [np.sort(rng.choice(S, k, replace=False)) for _ in range(1 if shared else R)]
        idx = np.stack(rows * R if shared else rows)
        counts = np.full(R, k) if shared else rng.integers(0, k + 1, R)
        before, start = c.kv.clone(), c.block_start.copy()
        c.keep(idx, counts)
        want = before.clone()
        for r in range(R):                      # the reference: entry by entry
            for j in range(int(counts[r])):
                want[:, r, :, start[r] + j] = before[:, r, :, start[r] + idx[r, j]]
        assert (c.lens == start + counts).all()
        for r in range(R):
            assert torch.equal(c.kv[:, r, :, :c.lens[r]], want[:, r, :, :c.lens[r]])
