"""Speculative Jacobi Decoding in the engine (real.decode.jacobi, ``generate(jacobi=...)``): greedy == plain greedy,
per-image streams (batch-size invariance), the law of vanilla SJD and of SCD's couplings against exact
enumeration (with negative controls), recorded rows for theory.likelihood.recorded, bad input."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from real.decode import engine
from real.decode import jacobi as J
from real.decode.jacobi import Jacobi
from real.decode.sampling import Processing
from real.models import llamagen as lg
from theory import rules
from theory.likelihood.recorded import predict_rounds

from test_real_engine import _chi2, _exact_law

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def mnist():
    from real.zoo import gpt

    return gpt.load_target()


def _tokens(gens):
    return torch.stack([g.tokens for g in gens])


# ----------------------------------------------------------------------------- greedy and batch invariance

@pytest.mark.parametrize("W,init", [(16, "random"), (5, "repeat_horizon"), (7, "sample_horizon")])
def test_greedy_jacobi_equals_plain_greedy(mnist, W, init):
    """--method greedy --draft jacobi gives plain greedy decoding token for token (B = 5 images with CFG, rows
    accepting different numbers of drafts), at batch 5 and batch 1; the window does accept drafts (more than one
    token per call), so the comparison is not vacuous."""
    proc = Processing(temperature=0.0, cfg_scale=2.0)
    conds = [0, 3, 7, 3, 9]
    ref = _tokens(engine.generate(mnist, None, conds, num_tokens=49, processing=proc, batch_size=5))
    spec = Jacobi(W, init, width=7)
    gens = engine.generate(mnist, None, conds, num_tokens=49, verifier=rules.greedy(), drafting=spec, processing=proc,
                           batch_size=5)
    assert torch.equal(_tokens(gens), ref)
    one = engine.generate(mnist, None, conds[:2], num_tokens=49, verifier=rules.greedy(), drafting=spec,
                          processing=proc, batch_size=1)
    assert torch.equal(_tokens(one), ref[:2])
    assert engine.summarize(gens)["tokens_per_target_call"] > 1.3
    assert len({tuple(r.accepted for r in g.rounds) for g in gens}) > 1        # ragged rows


@pytest.mark.parametrize("coupling", ["none", "scd-mc", "scd-gs"])
def test_jacobi_image_depends_only_on_seed_and_index(mnist, coupling):
    """With per-image streams, image k of a sampled Jacobi run is the same at batch sizes 1, 3 and 6 (rows of a
    batch commit different numbers of tokens, so a row that read another row's window or draws would differ)."""
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    conds = [1, 4, 4, 8, 0, 2]
    spec = Jacobi(8, coupling=coupling)
    outs = [_tokens(engine.generate(mnist, None, conds, num_tokens=49, verifier=rules.cool_sd(2.0), drafting=spec,
                                    processing=proc, batch_size=b, seed=11)) for b in (1, 3, 6)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


# ----------------------------------------------------------------------------- the law

def _law_model(T: int):
    """Target over V = 3 with image length ``T`` whose rows depend strongly on the context (random weights with
    large embeddings): a stale draft row P_k(.|x_<k) differs from the true row, so a q that is not the row the
    draft was drawn from biases the law."""
    kw = dict(dim=32, n_head=2, vocab_size=3, num_classes=2, block_size=9, multiple_of=32)   # T <= 9 tokens used
    return lg.LlamaGen(lg.LlamaGenConfig(n_layer=2, **kw)).random_init(5, std=0.4, output_std=0.6,
                                                                       embed_std=1.5).eval()


def _counts(t, spec, verifier, N, B, T, proc, seed):
    """Sequence counts of N Jacobi-decoded images (batches of B) and the generations."""
    gens = engine.generate(t, None, [1] * N, num_tokens=T, verifier=verifier, drafting=spec, processing=proc,
                           batch_size=B, seed=seed)
    return dict(Counter(tuple(g.tokens.tolist()) for g in gens)), gens


@pytest.fixture(scope="module")
def law6():
    T = 6
    t = _law_model(T)
    proc = Processing(temperature=1.0, cfg_scale=1.5)
    return t, proc, T, _exact_law(t, 1, T, proc)


def _tv(counts, law, N):
    return 0.5 * sum(abs(counts.get(s, 0) / N - p) for s, p in law.items())


def test_sjd_law_equals_plain_sampling_batched(law6, monkeypatch):
    """Vanilla SJD (window 4: 3 Jacobi drafts, carried over up to two iterations) at B = 50 has the exact law of
    plain sampling (chi-square over the 729 sequences, cells under 5 expected pooled; N = 6000). Negative control:
    verifying the drafts against uniform rows as q (instead of the rows they were drawn from) is rejected at
    p < 1e-6."""
    t, proc, T, law = law6
    N, B = 6000, 50
    c, gens = _counts(t, Jacobi(4), rules.vanilla(), N, B, T, proc, 1)
    assert max(r.drafted - r.accepted for g in gens for r in g.rounds) >= 2     # drafts carried and rejected
    p_ok, _ = _chi2(c, law, N)
    monkeypatch.setattr(J, "draft_rows", lambda win, Lr: torch.full_like(win.q[:, :Lr], 1.0 / win.q.shape[-1]))
    bad, _ = _counts(t, Jacobi(4), rules.vanilla(), N, B, T, proc, 2)
    p_bad, _ = _chi2(bad, law, N)
    print(f"SJD p={p_ok:.3g} TV={_tv(c, law, N):.4f}; q = uniform rows p={p_bad:.3g} TV={_tv(bad, law, N):.4f}")
    assert p_ok > 1e-3
    assert p_bad < 1e-6


@pytest.mark.parametrize("coupling", ["scd-mc-p", "scd-gs"])
def test_coupled_jacobi_is_lossless(law6, coupling):
    """SCD's Gumbel coupling (noise table by absolute position) and the maximal coupling with the current rows
    as q (scd-mc-p) keep the exact law of plain sampling (as the SJD test; N = 6000, B = 50)."""
    t, proc, T, law = law6
    N = 6000
    c, _ = _counts(t, Jacobi(4, coupling=coupling), rules.vanilla(), N, 50, T, proc, 3)
    p, _ = _chi2(c, law, N)
    print(f"{coupling}: p={p:.3g} TV={_tv(c, law, N):.4f}")
    assert p > 1e-3


def _coupled_then_verified(q, P, p, release: bool):
    """Exact law of the token committed when a draft x ~ q is maximally coupled with the row P (keep x with
    probability min(1, P(x)/q(x)), else draw from Norm([P - q]_+)) and the result y is then verified against p
    with vanilla SD using q' = q where x was kept (release) or q' = P (ours). Plain loops over tokens."""
    V = len(q)
    res = np.maximum(P - q, 0)
    res = res / res.sum() if res.sum() > 0 else P

    def verified(y, qq):              # law of vanilla verification of draft y with draft row qq against p
        a = min(1.0, p[y] / qq[y]) if qq[y] > 0 else 1.0
        r = np.maximum(p - qq, 0)
        r = r / r.sum() if r.sum() > 0 else p
        out = (1 - a) * r
        out[y] += a
        return out

    law = np.zeros(V)
    for x in range(V):
        if q[x] == 0:
            continue
        keep = min(1.0, P[x] / q[x])
        law += q[x] * keep * verified(x, q if release else P)
        for y in range(V):
            law += q[x] * (1 - keep) * res[y] * verified(y, P)
    return law


def test_release_maximal_coupling_is_not_lossless_worked_example():
    """docs/theory.md section 12: with q = (0.6, 0.4), P = (0.2, 0.8) and p = (0.5, 0.5), the release's q' (the old
    row where the old draft was kept) commits token 0 with probability 0.317 instead of 0.5; q' = P gives p exactly
    (and does for random rows)."""
    q, P, p = np.array([0.6, 0.4]), np.array([0.2, 0.8]), np.array([0.5, 0.5])
    # by hand: keep x=0 w.p. 0.6 * 1/3 = 0.2 (then accept w.p. 5/6 -> 1/6 on token 0); keep x=1 w.p. 0.4 (q'(1) = 0.4
    # < p: accepted, token 1); reject x=0 w.p. 0.4 -> y = 1 with q' = P: accept w.p. 5/8 (0.25 on 1), else 0 (0.15)
    # -> token 0: 1/6 + 0.15 = 0.3167
    rel = _coupled_then_verified(q, P, p, release=True)
    assert rel[0] == pytest.approx(1 / 6 + 0.15, abs=1e-12)
    assert np.allclose(_coupled_then_verified(q, P, p, release=False), p, atol=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(50):       # random rows: ours exact, the release off somewhere
        q, P, p = (rng.dirichlet(np.ones(4)) for _ in range(3))
        assert np.allclose(_coupled_then_verified(q, P, p, release=False), p, atol=1e-12)
    assert np.abs(_coupled_then_verified(q, P, p, release=True) - p).sum() > 1e-3


def test_release_maximal_coupling_deviation_measured(law6):
    """SCD-MC as released (q' = the old row where the old draft was kept) on the engine: its TV to the exact law
    is measured and printed (it is not lossless, section 12); at this sample size it must stay within 0.1 TV
    (a gross bug in the coupling would be far off) and the lossless scd-mc-p is run on the same seed."""
    t, proc, T, law = law6
    N = 6000
    c, _ = _counts(t, Jacobi(4, coupling="scd-mc"), rules.vanilla(), N, 50, T, proc, 3)
    p, _ = _chi2(c, law, N)
    print(f"scd-mc (release): p={p:.3g} TV={_tv(c, law, N):.4f}")
    assert _tv(c, law, N) < 0.1


# ----------------------------------------------------------------------------- recorded rows

def test_recorded_rows_predict_vanilla_acceptance(mnist):
    """The rows of a Jacobi run (drafts, the q rows they were drawn from, the current p rows) feed
    theory.likelihood.recorded.predict_rounds unchanged: under the rule that ran (vanilla) T10 is an unbiased estimate of
    the accepted drafts per round, so the means agree within 3 standard errors of the difference."""
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    spec = Jacobi(6)
    gens = engine.generate(mnist, None, list(range(10)) * 2, num_tokens=49, verifier=rules.vanilla(), drafting=spec,
                           processing=proc, seed=5, record_rows=True)
    recs = [r for g in gens for r in g.rounds if r.drafted > 0]
    p, q, d, nd = engine.records_to_arrays(recs, spec.slots)
    pred = predict_rounds(p.astype(np.float64), q.astype(np.float64), d, rules.vanilla(), nd)
    acc = np.array([r.accepted for r in recs], float)
    diff = pred.accepted - acc
    assert abs(diff.mean()) < 3 * diff.std(ddof=1) / np.sqrt(len(diff))
    assert acc.mean() > 0.2


# ----------------------------------------------------------------------------- bad input

def test_jacobi_bad_input(mnist):
    run = dict(num_tokens=49, verifier=rules.vanilla(), processing=Processing(cfg_scale=2.0))
    for spec, msg in [(Jacobi(0), "window must be an int >= 1"), (Jacobi(50), "larger than the image"),
                      (Jacobi(4, init="zeros"), "init must be one of"),
                      (Jacobi(4, init="repeat_horizon"), "needs the image row width"),
                      (Jacobi(4, coupling="bogus"), "coupling must be one of")]:
        with pytest.raises(ValueError, match=msg):
            engine.generate(mnist, None, [0], drafting=spec, **run)
    with pytest.raises(ValueError, match="greedy decoding has one-hot rows"):
        engine.generate(mnist, None, [0], num_tokens=49, verifier=rules.greedy(), drafting=Jacobi(4, coupling="scd-gs"),
                        processing=Processing(temperature=0.0))
    with pytest.raises(ValueError, match="no draft model"):
        engine.generate(mnist, mnist, [0], drafting=Jacobi(4), **run)
    with pytest.raises(TypeError, match="verifier must be"):
        engine.generate(mnist, None, [0], num_tokens=49, drafting=Jacobi(4))


# ----------------------------------------------------------------------------- the command line (issue 27's contract)

def _cli(capsys, *argv) -> dict:
    import json

    from coolsd.cli import main

    assert main(["generate", *argv, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    return json.loads(out[0])


@pytest.mark.parametrize("method", ["vanilla", "cool-sd"])
def test_cli_contract_jacobi(capsys, tmp_path, method):
    """coolsd generate --model mnist --draft jacobi --window W --method M --num-images N --batch-size B --seed S
    --json --save out.npz: the JSON keeps tokens_per_target_call and seconds, the npz keeps tokens (N, 49);
    at most W tokens per call."""
    out = tmp_path / "out.npz"
    d = _cli(capsys, "--model", "mnist", "--draft", "jacobi", "--window", "6", "--method", method, "--num-images", "3",
             "--batch-size", "2", "--seed", "4", "--save", str(out))
    assert 1.0 < d["tokens_per_target_call"] <= 6 and d["seconds"] > 0
    assert d["jacobi"]["window"] == 6 and d["L"] == 5
    assert np.load(out)["tokens"].shape == (3, 49)


def test_cli_greedy_jacobi_equals_greedy_ar(capsys, tmp_path):
    """--method greedy --draft jacobi == plain greedy decoding (--method ar --temperature 0), through the CLI."""
    a, b = tmp_path / "j.npz", tmp_path / "a.npz"
    _cli(capsys, "--model", "mnist", "--draft", "jacobi", "--method", "greedy", "--num-images", "3", "--save", str(a))
    _cli(capsys, "--model", "mnist", "--method", "ar", "--temperature", "0", "--num-images", "3", "--save", str(b))
    assert np.array_equal(np.load(a)["tokens"], np.load(b)["tokens"])


def test_sjd_on_chameleon_tiny_batch1(capsys, tmp_path):
    """SJD on the Chameleon / Lumina-mGPT layout adapter (batch 1: the transformers adapters have no per-row
    lengths): greedy equals plain greedy, and sampled SJD runs with at most W tokens per call."""
    a, b = tmp_path / "j.npz", tmp_path / "a.npz"
    _cli(capsys, "--model", "chameleon-tiny", "--draft", "jacobi", "--method", "greedy", "--num-images", "2",
         "--batch-size", "1", "--save", str(a))
    _cli(capsys, "--model", "chameleon-tiny", "--method", "ar", "--temperature", "0", "--num-images", "2",
         "--batch-size", "1", "--save", str(b))
    assert np.array_equal(np.load(a)["tokens"], np.load(b)["tokens"])
    d = _cli(capsys, "--model", "chameleon-tiny", "--draft", "jacobi", "--window", "16", "--method", "vanilla",
             "--num-images", "1", "--batch-size", "1")
    assert 1.0 < d["tokens_per_target_call"] <= 16
    assert d["info"]["draft"] == "none"              # no drafter was built for Jacobi drafting


@pytest.mark.parametrize("model", ["llamagen-tiny", "chameleon-tiny", "mnist"])
def test_build_without_a_draft(model, monkeypatch):
    """draft="none" (what --draft jacobi builds): no draft in the bundle, whatever the model's default draft
    needs (llamagen's default small draft needs a checkpoint; lumina-mgpt's EAGLE a drafter directory)."""
    from real import registry

    b = registry.build(model, draft="none")
    assert b.draft is None and b.info["draft"] == "none"
    assert registry.build(model).draft is not None      # the control: the default still builds one


@pytest.mark.parametrize("argv,msg", [
    (["--draft", "jacobi", "--window", "0"], "--window"),
    (["--draft", "jacobi", "--window", "50"], "--window 50 is larger than the image"),
    (["--draft", "jacobi", "--window", "9", "--num-tokens", "8"], "--window 9 is larger than the image"),
    (["--draft", "jacobi", "--drafter-dir", "."], "--drafter-dir"),
    (["--draft", "jacobi", "--draft-ckpt", "x.pt"], "--draft-ckpt"),
    (["--draft", "jacobi", "--L", "3"], "--L"),
    (["--draft", "jacobi", "--method", "ar"], "not ar"),
    (["--draft", "jacobi", "--method", "greedy", "--coupling", "scd-gs"], "coupling 'scd-gs' couples sampled drafts"),
    (["--window", "4"], "add --mode jacobi"),
    (["--coupling", "scd-mc"], "add --mode jacobi"),
    (["--draft", "jacobi", "--method", "cool-sd", "--fidelity"], "--fidelity with --draft jacobi: exact likelihood"),
])
def test_cli_jacobi_bad_input(argv, msg):
    """Each bad --draft jacobi input is a ValueError naming the option, raised by validation before any model is
    built (the window against the image: once the model is known, before generation)."""
    import argparse

    from coolsd.commands import generate as g

    sub = argparse.ArgumentParser().add_subparsers()
    g.register(sub)
    args = sub.choices["generate"].parse_args(["--model", "mnist", *argv])
    with pytest.raises(ValueError, match=msg.replace("-", r"\-")):
        g.generate(args)


def test_cli_gsd_on_jacobi_and_gsd_without_a_codebook(capsys, tmp_path):
    """--method gsd --draft jacobi runs (GSD's distance test on the target's input embeddings, as released); a model
    without a codebook is refused under --gsd-table codebook before any work, naming the way out."""
    out = tmp_path / "g.npz"
    d = _cli(capsys, "--model", "mnist", "--draft", "jacobi", "--window", "8", "--method", "gsd", "--num-images", "2",
             "--batch-size", "2", "--seed", "1", "--save", str(out))
    assert d["verifier"] == "gsd" and d["params"]["d_threshold"] == 0.5 and 1.0 < d["tokens_per_target_call"] <= 8
    assert np.load(out)["tokens"].shape == (2, 49)
    import argparse

    from coolsd.commands import generate as g

    sub = argparse.ArgumentParser().add_subparsers()
    g.register(sub)
    args = sub.choices["generate"].parse_args(["--model", "hf-llama-tiny", "--method", "gsd", "--gsd-table", "codebook"])
    with pytest.raises(ValueError, match="--gsd-table codebook needs the VQ codebook"):
        g.generate(args)


def test_sweep_draft_jacobi(tmp_path):
    """coolsd sweep --draft jacobi: drafter-free units (at most W tokens per call), predictions from the vanilla
    SJD rows, the report says jacobi drafting with L = W - 1."""
    import json

    from coolsd.cli import main

    out = tmp_path / "sw"
    assert main(["sweep", "--model", "mnist", "--draft", "jacobi", "--window", "6", "--grid", "vanilla", "gsd",
                 "--images", "4", "--unit-images", "2", "--no-progress", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert [m["name"] for m in rep["methods"]] == ["vanilla", "gsd"]
    for m in rep["methods"]:
        assert m["drafting"] == "jacobi" and m["L"] == 5
        assert 1.0 < m["accepted_length"]["measured"] <= 6 and m["accepted_length"]["predicted"] > 1.0
    assert rep["methods"][0]["tv_bound"] < 1e-6
    for m in rep["methods"]:          # no exact likelihood for Jacobi drafts: no TV / KL, a stated reason
        assert m["tv_to_target"] is None and "exact likelihood of Jacobi drafting is not tractable" in m["fidelity_reason"]
