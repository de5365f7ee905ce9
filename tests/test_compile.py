"""The compiled decoder blocks (``real.nn.blocks.compile_blocks``, torch.compile with the inductor CPU backend):
same greedy tokens as eager, same sampling law, eager fallback when compilation fails."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from real.decode import engine
from real.models import llamagen as lg
from real.nn.blocks import EAGER, compile_blocks
from real.decode.sampling import Processing
from theory import rules
from theory.tree import EAGLE_25, Tree

from test_real_engine import _chi2, _exact_law, _law_models


def _uncompiled(*models):
    for m in models:
        compile_blocks(m, enabled=False)


def test_compiled_greedy_equals_eager_and_plain_greedy():
    """A trained EAGLE pair (the shipped MNIST target + drafter, CFG 2, B = 3 ragged rows): chain and
    25-node tree, compiled target and drafter, give the tokens of eager plain greedy decoding."""
    from real.zoo import gpt

    t = gpt.load_target()
    d = gpt.load_eagle(t)
    proc = Processing(temperature=0.0, cfg_scale=2.0)
    conds, T = [1, 4, 8], 49
    plain = engine.generate(t, None, conds, num_tokens=T, processing=proc, batch_size=3)
    try:
        compile_blocks(t)
        compile_blocks(d)
        assert t.layers[0].fns is not EAGER and d.layers[0].fns is t.layers[0].fns
        for kw in (dict(drafting=4), dict(drafting=Tree(EAGLE_25))):
            got = engine.generate(t, d, conds, num_tokens=T, verifier=rules.greedy(), processing=proc,
                                  batch_size=3, **kw)
            for g, p in zip(got, plain):
                assert torch.equal(g.tokens, p.tokens)
            assert len({tuple(r.accepted for r in g.rounds) for g in got}) > 1     # drafts were accepted, unevenly
        assert not t.layers[0].fns.pre.failed and not t.layers[0].fns.post.failed  # it really ran compiled
    finally:
        _uncompiled(t, d)


def test_compiled_sampling_follows_the_exact_law():
    """Vanilla SD with compiled target and draft (V = 4, T = 3, B = 40, N = 800 as test_batch's law test):
    chi-square against the exact law of plain sampling, p > 1e-3; negative control: the same compiled
    models with a resampler that ignores the residual (~0.2 TV per token) is rejected at p < 1e-3."""
    t, d = _law_models()
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    T, N = 3, 800
    law = _exact_law(t, 2, T, proc)
    try:
        compile_blocks(t)
        compile_blocks(d)

        def counts(verifier, seed):
            out: dict = {}
            for g in engine.generate(t, d, [2] * N, num_tokens=T, verifier=verifier, drafting=2, processing=proc,
                                     batch_size=40, seed=seed):
                s = tuple(g.tokens.tolist())
                out[s] = out.get(s, 0) + 1
            return out

        p_van, _ = _chi2(counts(rules.vanilla(), 1), law, N)
        p_bad, _ = _chi2(counts(rules.Verifier(rules.Vanilla(), rules.Target(), "wrong-resampler"), 2), law, N)
        assert not t.layers[0].fns.post.failed
    finally:
        _uncompiled(t, d)
    assert p_van > 1e-3
    assert p_bad < 1e-3


def test_failed_compilation_warns_once_and_runs_eager():
    """A backend that raises: a RuntimeWarning, then the eager functions (same logits as never compiled)."""
    calls = []

    def broken(gm, example_inputs):
        calls.append(1)
        raise RuntimeError("no compiler here")

    c = lg.LlamaGenConfig(dim=32, n_head=2, n_layer=2, vocab_size=16, num_classes=3, block_size=4, multiple_of=32)
    t = lg.LlamaGen(c).random_init(0).eval()
    with torch.no_grad():
        ref = t.prefill(1, torch.tensor([[3, 5]])).logits
        compile_blocks(t, backend=broken)
        with pytest.warns(RuntimeWarning, match="running eager"):
            got = t.prefill(1, torch.tensor([[3, 5]])).logits
        again = t.prefill(1, torch.tensor([[3, 5]])).logits
    assert calls and torch.equal(got, ref) and torch.equal(again, ref)


def test_compile_blocks_refuses_bad_input():
    t = lg.LlamaGen(lg.LlamaGenConfig(dim=32, n_head=2, n_layer=1, vocab_size=16, num_classes=3, block_size=4,
                                      multiple_of=32))
    with pytest.raises(ValueError, match="mode must be"):
        compile_blocks(t, mode="fastest")
    with pytest.raises(ValueError, match="no decoder layers"):
        compile_blocks(torch.nn.Linear(2, 2))
    assert np.all([layer.fns is EAGER for layer in t.layers])


def test_compile_problem_names_what_is_missing(monkeypatch):
    """``compile_problem``: None where inductor can work; one line naming the missing piece otherwise (a C++
    compiler on the CPU and triton on CUDA simulated missing; CUDA graphs asked for on the CPU)."""
    from real.nn import blocks

    assert blocks.compile_problem("cpu") is None                     # this machine has g++
    assert blocks.compile_problem("cpu", backend="eager") is None
    assert "CUDA graphs" in blocks.compile_problem("cpu", mode="reduce-overhead")

    def no_cxx():
        raise RuntimeError("InvalidCxxCompiler")

    monkeypatch.setattr(blocks, "_cpp_compiler", no_cxx)
    why = blocks.compile_problem("cpu")
    assert "no C++ compiler" in why and "\n" not in why
    assert blocks.compile_problem("cpu", backend="eager") is None    # no code generation: no compiler needed
    monkeypatch.setattr(blocks, "_has_triton", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "triton" in blocks.compile_problem("cuda")


class _Built(Exception):
    pass


def _generate(capsys, *args):
    from coolsd.cli import main

    rc = main(["generate", "--model", "llamagen-tiny", "--num-tokens", "4", "--json", *args])
    return rc, capsys.readouterr().err.strip()


def test_generate_compile_refuses_before_any_work(monkeypatch, capsys):
    """``coolsd generate --compile``: a missing compiler, a mode the device cannot honour and a model without
    compilable blocks are refused in one line before any model is built; with a working compiler the checks
    pass and the models are built (the control)."""
    import real.registry
    from real.nn import blocks

    def build(*a, **k):
        raise _Built()

    monkeypatch.setattr(real.registry, "build", build)
    with pytest.raises(_Built):                                          # control: the checks pass, building starts
        _generate(capsys, "--compile")
    monkeypatch.setattr(blocks, "_cpp_compiler", lambda: (_ for _ in ()).throw(RuntimeError("none")))
    rc, err = _generate(capsys, "--compile")
    assert rc == 2 and "--compile default: no C++ compiler" in err and len(err.splitlines()) == 1
    with pytest.raises(_Built):                                          # without --compile: nothing checked
        _generate(capsys)
    monkeypatch.undo()
    monkeypatch.setattr(real.registry, "build", build)
    rc, err = _generate(capsys, "--compile", "reduce-overhead")
    assert rc == 2 and "CUDA graphs" in err and len(err.splitlines()) == 1
    from coolsd.cli import main

    assert main(["generate", "--model", "hf-llama-tiny", "--compile", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--model hf-llama-tiny is not built of them" in err and "llamagen-tiny" in err
    assert len(err.splitlines()) == 1
