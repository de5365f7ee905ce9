"""Issue 42: greedy tokens identical across the eager host path, the device path (forced on the CPU,
``real.nn.devpath``) and the compiled decoder blocks (``real.nn.blocks.compile_blocks``; backend and paths below),
for every drafting mode (chain, static tree eagle25, dynamic tree, Jacobi) at B = 1 and B = 4, on
the tiny LlamaGen pair; and all equal plain greedy decoding.

Backend: the suite compiles with torch.compile's "eager" backend (dynamo's graph capture, guards, dynamic shapes
and graph breaks, without code generation) and runs the compiled blocks on the device path only (what a GPU runs;
tests/test_compile.py keeps inductor chain and tree legs on the host path, B = 3): ~25 s on 2 shared cores. With
``COOLSD_TEST_COMPILE_BACKEND=inductor pytest tests/test_compiled_paths.py`` (any backend given) the compiled host
path joins, with inductor's C++ code generation (what ``--compile`` runs on the CPU): 45 s-2 min with inductor's
on-disk cache warm, ~4 min cold (it passed when written). The compiled
functions are shared by every model and mode (one lru-cached pair per backend); 16 tokens per image.
"""
from __future__ import annotations

import copy
import os

import pytest
import torch

from real.decode import engine
from real.decode.dynamic_tree import DynamicTree
from real.decode.jacobi import Jacobi
from real.decode.sampling import Processing
from real.nn.blocks import EAGER, compile_blocks, compile_problem
from real.registry import tiny_llamagen_pair
from theory import rules
from theory.tree import EAGLE_25, Tree

GREEDY = Processing(temperature=0.0, cfg_scale=2.0)
MODES = {"chain": lambda: 4, "eagle25": lambda: Tree(EAGLE_25), "dynamic": lambda: DynamicTree(26, 4, 4),
         "jacobi": lambda: Jacobi(5)}
T = 16
BACKEND = os.environ.get("COOLSD_TEST_COMPILE_BACKEND", "eager")
FULL = "COOLSD_TEST_COMPILE_BACKEND" in os.environ

pytestmark = pytest.mark.skipif(compile_problem("cpu", BACKEND) is not None, reason=str(compile_problem("cpu", BACKEND)))


@pytest.fixture(scope="module")
def models():
    t, d = tiny_llamagen_pair(seed=0)
    tc, dc = copy.deepcopy(t), copy.deepcopy(d)
    compile_blocks(tc, backend=BACKEND)
    compile_blocks(dc, backend=BACKEND)
    yield {"eager": (t, d), "compiled": (tc, dc)}
    compile_blocks(tc, enabled=False)
    compile_blocks(dc, enabled=False)


def _gen(pair, mode, B, **kw):
    t, d = pair
    return engine.generate(t, None if mode == "jacobi" else d, list(range(B)), num_tokens=T,
                           verifier=rules.greedy(), drafting=MODES[mode](), processing=GREEDY, batch_size=B, **kw)


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_tokens_equal_across_eager_device_path_and_compiled(models, mode, B):
    t, _ = models["eager"]
    plain = engine.generate(t, None, list(range(B)), num_tokens=T, processing=GREEDY, batch_size=B)
    legs = {"eager host": _gen(models["eager"], mode, B, device_path=False),
            "eager device": _gen(models["eager"], mode, B, device_path=True),
            "compiled device": _gen(models["compiled"], mode, B, device_path=True)}
    if FULL:                                  # the compiled host path too (tests/test_compile.py covers it in the suite)
        legs["compiled host"] = _gen(models["compiled"], mode, B, device_path=False)
    ref = legs["eager host"]
    for name, gens in legs.items():
        assert len(gens) == B
        for g, r, p in zip(gens, ref, plain):
            assert torch.equal(g.tokens, p.tokens), (name, "differs from plain greedy")
            assert [x.accepted for x in g.rounds] == [x.accepted for x in r.rounds], name
    if mode != "jacobi":                                                 # (random Jacobi drafts: rarely accepted)
        assert sum(x.accepted for g in ref for x in g.rounds) > 0       # drafts were accepted: the walks ran
    tc, dc = models["compiled"]
    fns = tc.layers[0].fns
    assert fns is not EAGER and dc.layers[0].fns is fns                  # really compiled, one shared pair
    assert not fns.pre.failed and not fns.post.failed                   # and never fell back to eager


def test_generate_compile_flag_equals_eager_restores_and_refuses(monkeypatch):
    """engine.generate(compile=...): the API's --compile. Greedy tokens equal the eager run's (chain and eagle25, B = 2);
    afterwards every decoder layer has its own functions back; refused before any model call when the compiler is
    missing (simulated) or a model has no compilable layers (FastLlama, named)."""
    import real.nn.blocks as blocks
    from real.adapters.hf import hf_llama_pair
    from real.models.llama import FastLlama

    t, d = tiny_llamagen_pair(seed=0, draft="layerskip")
    before = [m.fns for m in t.modules() if hasattr(m, "fns")]
    kw = dict(num_tokens=T, verifier=rules.greedy(), processing=GREEDY, batch_size=2)
    for drafting in (4, Tree(EAGLE_25)):
        eager = engine.generate(t, d, [1, 2], drafting=drafting, **kw)
        comp = engine.generate(t, d, [1, 2], drafting=drafting, compile="default", compile_backend=BACKEND, **kw)
        assert [g.tokens.tolist() for g in comp] == [g.tokens.tolist() for g in eager]
    assert [m.fns for m in t.modules() if hasattr(m, "fns")] == before and before[0] is EAGER
    calls = []
    monkeypatch.setattr(t, "prefill", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(blocks, "compile_problem", lambda *a, **k: "no C++ compiler (simulated)")
    with pytest.raises(ValueError, match="no C.. compiler"):
        engine.generate(t, d, [1, 2], drafting=4, compile="default", **kw)
    monkeypatch.undo()
    ft, fd = (FastLlama.from_hf(m) for m in hf_llama_pair())
    with pytest.raises(ValueError, match="FastLlama has no decoder layers"):
        engine.generate(ft, fd, [torch.tensor([1, 2])], drafting=4, compile="default", compile_backend=BACKEND,
                        **{**kw, "batch_size": 1})
    assert not calls


@pytest.mark.parametrize("mode,B", [("chain", 4), ("eagle25", 1), ("dynamic", 4)])
def test_static_shapes_compiled_equal_plain_greedy_and_read_whole_caches(mode, B, monkeypatch):
    """``generate(compile=..., compile_static=True)`` (what "reduce-overhead" does on CUDA): graphs compiled per shape
    and every KV-cache block attending over all its slots (``real.nn.kvcache.static_keys``), so the keys' length
    is the cache's ``max_len`` in every forward of the run; tokens equal plain greedy decoding. The control: the
    same run without static shapes attends over a growing prefix of the cache."""
    from real.nn.kvcache import KVCache

    t, d = tiny_llamagen_pair(seed=0)
    seen = []
    reserve = KVCache.reserve

    def recording(self, S):
        reserve(self, S)
        seen.append((self._K, self.max_len))

    monkeypatch.setattr(KVCache, "reserve", recording)
    plain = engine.generate(t, None, list(range(B)), num_tokens=T, processing=GREEDY, batch_size=B)
    seen.clear()
    gens = _gen((t, d), mode, B, device_path=True, compile="default", compile_backend=BACKEND, compile_static=True)
    assert all(torch.equal(g.tokens, p.tokens) for g, p in zip(gens, plain))
    assert len(seen) > 10 and all(K == m for K, m in seen), sorted(set(seen))[:5]
    seen.clear()
    _gen((t, d), mode, B, device_path=True, compile="default", compile_backend=BACKEND)
    assert len({K for K, _ in seen}) > 3 and all(K < m for K, m in seen)
    assert all(layer.fns is EAGER for layer in t.layers)             # restored after the call
