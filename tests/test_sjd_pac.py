"""SJD-PAC (real.decode.sjd_pac; docs/theory.md section 12b): the release's tree layout, its exact output law by
enumeration (tests/pac_enumerate.py: sjd-pac-p is lossless, the release is not, each of its four departures biased on
its own), the engine against the enumerated laws (a Markov-chain target) and against plain sampling (a tiny LlamaGen,
chi-square with negative controls), greedy == plain greedy, per-image streams, recorded rows, the command line."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import pac_enumerate as pe
from real.decode import engine
from real.decode import sjd_pac as SP
from real.decode.sjd_pac import SJDPAC, pac_tree, tree_nodes
from real.decode.sampling import Processing
from real.protocol import ModelOutput
from theory import rules

from test_jacobi import _counts, _law_model, _tv
from test_real_engine import _chi2, _exact_law

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- the layout

def test_release_layout():
    """W = 16, K = 3, D = 3 (eval_model.py's window, the code's tree): 13 tree nodes, the main branch reaching depth 5
    (M = 6: at most 6 tokens per call); K = 1 or D = 1: a chain of W - 1 drafts; the tree must fit the window."""
    t = pac_tree(16, 3, 3)
    assert t.n_nodes == 15 and t.depth == 5 and tree_nodes(3, 3) == 13
    assert [p for p in t.paths if len(p) >= 3] == [(0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)]
    assert sum(len(p) == 2 for p in t.paths) == 9 and SJDPAC(16).max_depth == 5
    assert pac_tree(8, 1, 3).paths == tuple((0,) * d for d in range(1, 8)) and SJDPAC(8, 1, 3).max_depth == 7
    assert SJDPAC(8, 4, 1).max_depth == 7
    assert SJDPAC().window == 64 and (SJDPAC().tree_width, SJDPAC().tree_depth) == (3, 3)     # as released
    for spec, msg in [(SJDPAC(12, 3, 3), "does not fit the window"), (SJDPAC(0), "window must be an int >= 1"),
                      (SJDPAC(8, 0, 2), "tree_width must be"), (SJDPAC(8, 2, 1.5), "tree_depth must be")]:
        with pytest.raises(ValueError, match=msg):
            SP.check_sjd_pac(spec, 49)
    with pytest.raises(ValueError, match="larger than the vocabulary"):
        SP.check_sjd_pac(SJDPAC(8, 4, 2), 49, vocab_size=3)


# ----------------------------------------------------------------------------- exact laws by enumeration

def _chain(V, seed, conc=0.5):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(V)).tolist(), rng.dirichlet(np.full(V, conc), size=V).tolist()


@pytest.mark.parametrize("V,T,W,K,D,seed", [(3, 4, 4, 2, 2, 0), (3, 4, 5, 3, 2, 1), (3, 4, 7, 2, 3, 2),
                                            (2, 7, 8, 2, 3, 3), (3, 5, 4, 1, 2, 4)])
def test_exact_law_of_the_corrected_variant_is_the_target(V, T, W, K, D, seed):
    """sjd-pac-p's output law, every outcome of every draw enumerated (tree, walk, coupled continuation, fresh
    levels), equals the Markov chain's law to float round-off: lossless, exactly."""
    init, M = _chain(V, seed)
    law = pe.pac_law(pe.markov_target(init, M), V, T, W, K, D, release=False)
    assert pe.tv(law, pe.markov_law(init, M, T)) < 1e-12


def test_exact_law_of_the_release_is_not_the_target_and_each_departure_biases():
    """The release, enumerated exactly (V = 3, T = 4, W = 7, K = 2, D = 3; docs/theory.md section 12b): TV 0.22 to
    the chain's law. Each departure alone (the others as in sjd-pac-p) biases the law, far above round-off (1e-16 for
    sjd-pac-p): the longest-path verdict (TV 0.026), the uniform token after a full main branch (0.22) and the
    siblings drawn from [p - q]_+ (2.2e-5); the residual of all siblings needs a level carried twice (T = 5:
    scripts/sjd_pac_deviation.py)."""
    init, M = _chain(3, 1)
    target, ref = pe.markov_target(init, M), pe.markov_law(init, M, 4)
    got = {name: pe.tv(pe.pac_law(target, 3, 4, 7, 2, 3, release=fl), ref)
           for name, fl in (("release", True), ("verdict", {"verdict"}), ("bonus", {"bonus"}),
                            ("siblings", {"siblings"}))}
    print({k: f"{v:.3g}" for k, v in got.items()})
    assert got["release"] > 0.1 and got["bonus"] > 0.1
    assert got["verdict"] > 1e-2 and got["siblings"] > 1e-6


# ----------------------------------------------------------------------------- the engine on a Markov chain

class MarkovTarget:
    """A first-order Markov chain as a batched target (``real.protocol.BatchedTarget``): the logits after a token are
    log M[token] whatever the context (tree masks and positions are irrelevant), log init after the prefix."""
    batched, needs_features, row_masks, extra_slots, prefix_len = True, False, False, None, 1

    def __init__(self, init, M):
        self.init = torch.log(torch.as_tensor(init, dtype=torch.float64)).float()
        self.M = torch.log(torch.as_tensor(M, dtype=torch.float64)).float()
        self.vocab_size = len(init)
        self._lens = np.zeros(1, np.int64)
        self._last = 0

    @property
    def cache_lens(self):
        return self._lens

    def cache_bytes(self, rows):
        return 0

    def prefill(self, conds, tokens=None, *, cfg=False, return_hidden=False):
        B = len(conds)
        S = 0 if tokens is None else tokens.shape[1]
        lg = self.init.expand(B, 1, -1)
        if S:
            lg = torch.cat([lg, self.M[tokens]], 1)
        self._lens = np.full(B, 1 + S, np.int64)
        self._last = S
        return ModelOutput(lg.clone())

    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden=False):
        self._lens = self._lens + tokens.shape[1]
        self._last = tokens.shape[1]
        return ModelOutput(self.M[tokens].clone())

    def rollback(self, counts):
        self._lens = self._lens - np.broadcast_to(np.asarray(counts), self._lens.shape)

    def keep(self, indices, counts=None):
        k = np.asarray(indices).shape[-1] if counts is None else np.asarray(counts)
        self._lens = self._lens - self._last + k


@pytest.fixture(scope="module")
def markov5():
    """V = 3, T = 5 chain; the release's and sjd-pac-p's exact laws for W = 7, K = 2, D = 3 (every departure acts)."""
    init, M = _chain(3, 1)
    target = pe.markov_target(init, M)
    laws = {rel: pe.pac_law(target, 3, 5, 7, 2, 3, release=rel) for rel in (True, False)}
    return MarkovTarget(init, M), pe.markov_law(init, M, 5), laws


def _markov_counts(model, spec, N, seed):
    gens = engine.generate(model, None, [0] * N, num_tokens=5, verifier=rules.vanilla(), drafting=spec, seed=seed,
                           batch_size=50)
    return dict(Counter(tuple(g.tokens.tolist()) for g in gens)), gens


def test_engine_follows_the_enumerated_laws_on_a_markov_chain(markov5):
    """The engine's sjd-pac samples the enumerated law of the release (which is off the chain's law by TV 0.24: the
    release's own deviation, reproduced) and sjd-pac-p the chain's law (chi-square, N = 6000 at B = 50, windows cut
    ragged at the image end); negative control: the release's samples against the chain's law, p < 1e-6."""
    model, ref, laws = markov5
    N = 6000
    c_rel, gens = _markov_counts(model, SJDPAC(7, 2, 3, release=True), N, 1)
    c_ok, _ = _markov_counts(model, SJDPAC(7, 2, 3, release=False), N, 2)
    assert max(r.accepted for g in gens for r in g.rounds) >= 2                   # the tree's deep nodes accepted
    p_rel, _ = _chi2(c_rel, laws[True], N)
    p_ok, _ = _chi2(c_ok, ref, N)
    p_bad, _ = _chi2(c_rel, ref, N)
    print(f"release vs its enumerated law p={p_rel:.3g}; sjd-pac-p vs chain p={p_ok:.3g}; release vs chain "
          f"p={p_bad:.3g} (exact TV {pe.tv(laws[True], ref):.3f}, sampled {_tv(c_rel, ref, N):.3f})")
    assert pe.tv(laws[False], ref) < 1e-12 and pe.tv(laws[True], ref) > 0.1
    assert p_rel > 1e-3 and p_ok > 1e-3 and p_bad < 1e-6


# ----------------------------------------------------------------------------- the law on a tiny model

@pytest.fixture(scope="module")
def law5():
    T = 5
    t = _law_model(T)
    proc = Processing(temperature=1.0, cfg_scale=1.5)
    return t, proc, T, _exact_law(t, 1, T, proc)


def test_law_of_sjd_pac_p_equals_plain_sampling_batched(law5, monkeypatch):
    """sjd-pac-p (W = 5, K = 2, D = 2: a tree level and a chain of 2, continuation carried) at B = 50 has the exact
    law of plain sampling (chi-square over the 243 sequences; N = 6000). Negative control: sjd-pac-p with every
    level's draft row forgotten (the uniform row instead of the stale rows its carried tokens were drawn from) is
    rejected at p < 1e-6. (The release on a tiny target: test_engine_follows_the_enumerated_laws_on_a_markov_chain.)"""
    t, proc, T, law = law5
    N = 6000
    c, gens = _counts(t, SJDPAC(5, 2, 2, release=False), rules.vanilla(), N, 50, T, proc, 1)
    assert max(r.accepted for g in gens for r in g.rounds) >= 2
    p_ok, _ = _chi2(c, law, N)
    real_fresh = SP._fresh

    def stale_as_uniform(run, win, first_free, *rest):      # every level's q forgotten: the uniform row
        real_fresh(run, win, first_free, *rest)
        win.q = torch.full_like(win.q, 1.0 / win.q.shape[-1])
    monkeypatch.setattr(SP, "_fresh", stale_as_uniform)
    bad, _ = _counts(t, SJDPAC(5, 2, 2, release=False), rules.vanilla(), N, 50, T, proc, 3)
    p_bad, _ = _chi2(bad, law, N)
    print(f"sjd-pac-p p={p_ok:.3g} TV={_tv(c, law, N):.4f}; q = uniform p={p_bad:.3g} TV={_tv(bad, law, N):.4f}")
    assert p_ok > 1e-3
    assert p_bad < 1e-6


# ----------------------------------------------------------------------------- greedy and batch invariance

@pytest.fixture(scope="module")
def mnist():
    from real.zoo import gpt

    return gpt.load_target()


def _tokens(gens):
    return torch.stack([g.tokens for g in gens])


@pytest.mark.parametrize("release", [True, False])
def test_greedy_equals_plain_greedy(mnist, release):
    """--method greedy with SJD-PAC gives plain greedy decoding token for token (B = 5 with CFG, ragged rows, and
    batch 1), with more than one token per call (the release's uniform token after a full branch is not drawn in
    greedy decoding, which the release does not have)."""
    proc = Processing(temperature=0.0, cfg_scale=2.0)
    conds = [0, 3, 7, 3, 9]
    ref = _tokens(engine.generate(mnist, None, conds, num_tokens=49, processing=proc, batch_size=5))
    spec = SJDPAC(16, 3, 3, release=release)
    gens = engine.generate(mnist, None, conds, num_tokens=49, verifier=rules.greedy(), drafting=spec,
                           processing=proc, batch_size=5)
    assert torch.equal(_tokens(gens), ref)
    one = engine.generate(mnist, None, conds[:2], num_tokens=49, verifier=rules.greedy(), drafting=spec,
                          processing=proc, batch_size=1)
    assert torch.equal(_tokens(one), ref[:2])
    assert engine.summarize(gens)["tokens_per_target_call"] > 1.3
    assert len({tuple(r.accepted for r in g.rounds) for g in gens}) > 1


@pytest.mark.parametrize("release", [True, False])
def test_image_depends_only_on_seed_and_index(mnist, release):
    """Image k of a sampled SJD-PAC run (Cool-SD on the tree) is the same at batch sizes 1, 3 and 4."""
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    conds = [1, 4, 8, 0]
    spec = SJDPAC(12, 2, 3, release=release)
    outs = [_tokens(engine.generate(mnist, None, conds, num_tokens=49, verifier=rules.cool_sd(2.0), drafting=spec,
                                    processing=proc, batch_size=b, seed=11)) for b in (1, 3, 4)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


# ----------------------------------------------------------------------------- recorded rows

def _tree_records(gens, tree):
    """Recorded tree rounds padded to the full tree: p, q (R, N+1, V), tokens (R, N+1), depth caps (R,), accepted."""
    recs = [r for g in gens for r in g.rounds if r.drafted > 0]
    N1, V = tree.n_nodes + 1, recs[0].p.shape[-1]
    p = np.full((len(recs), N1, V), 1.0 / V)
    q = np.full((len(recs), N1, V), 1.0 / V)
    tok = np.zeros((len(recs), N1), np.int64)
    for i, r in enumerate(recs):   # copying recorded rounds into padded arrays
        m = r.p.shape[0]
        p[i, :m], q[i, :m], tok[i, :m] = r.p, r.q, r.drafts
    return p, q, tok, np.array([r.depth for r in recs]), np.array([r.accepted for r in recs], float)


@pytest.mark.parametrize("rule", ["vanilla", "cool-sd"])
@pytest.mark.parametrize("release", [False, True])
def test_recorded_rows_predict_acceptance(mnist, release, rule):
    """The recorded tree rounds give, under the rule that ran (vanilla, or Cool-SD delta = 2: the predictions
    benchmarks/bench_jacobi.py makes for the other rules), unbiased estimates of the accepted drafts per round: the
    walk's T10 for trees (theory.likelihood.recorded.predict_tree_rounds) for sjd-pac-p, the longest path's
    (real.decode.sjd_pac.predict_longest) for the release; means within 3 standard errors."""
    from theory.likelihood.recorded import predict_tree_rounds

    proc = Processing(temperature=1.0, cfg_scale=2.0)
    spec = SJDPAC(10, 2, 3, release=release)
    ver = rules.vanilla() if rule == "vanilla" else rules.cool_sd(2.0)
    gens = engine.generate(mnist, None, list(range(10)) * 2, num_tokens=49, verifier=ver, drafting=spec,
                           processing=proc, seed=5, record_rows=True)
    p, q, tok, cap, acc = _tree_records(gens, spec.tree())
    if release:
        pred = SP.predict_longest(p, q, tok, spec.tree(), ver, cap)
    else:
        pred = np.asarray(predict_tree_rounds(p, q, tok, spec.tree(), ver, max_depth=cap).accepted)
    diff = pred - acc
    print(f"{rule}: measured {acc.mean():.3f} predicted {pred.mean():.3f}")
    assert abs(diff.mean()) < 3 * diff.std(ddof=1) / np.sqrt(len(diff))
    assert acc.mean() > 0.3


# ----------------------------------------------------------------------------- the command line

def _cli(capsys, *argv) -> dict:
    import json

    from coolsd.cli import main

    assert main(["generate", *argv, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_cli_contract(capsys, tmp_path):
    """coolsd generate --model mnist --draft sjd-pac (the release's window 64 exceeds the 49-token image: cut at its
    end) and --draft sjd-pac-p --window 16 --pac-width 2 --pac-depth 3 with GSD: at most M tokens per call, the
    options echoed, tokens saved, a tree record written."""
    d = _cli(capsys, "--model", "mnist", "--draft", "sjd-pac", "--num-images", "2", "--batch-size", "2")
    assert d["sjd-pac"]["window"] == 64 and d["sjd-pac"]["tree_width"] == 3 and d["L"] == 53
    assert 1.0 < d["tokens_per_target_call"] and d["info"]["draft"] == "none"
    out, rec = tmp_path / "o.npz", tmp_path / "r.npz"
    d = _cli(capsys, "--model", "mnist", "--draft", "sjd-pac-p", "--window", "16", "--pac-width", "2", "--pac-depth",
             "3", "--method", "gsd", "--num-images", "2", "--save", str(out), "--record", str(rec))
    assert d["L"] == 11 and d["verifier"] == "gsd" and 1.0 < d["tokens_per_target_call"] <= 12
    assert np.load(out)["tokens"].shape == (2, 49) and str(np.load(rec)["verdict"]) == "walk"


@pytest.mark.parametrize("argv,msg", [
    (["--draft", "sjd-pac", "--pac-width", "0"], "--pac-width must be an integer >= 1"),
    (["--draft", "sjd-pac", "--window", "16", "--pac-width", "4"], "does not fit the window of 16"),
    (["--pac-width", "2"], "SJD-PAC's proactive tree, a Jacobi-family draft: add --mode sjd-pac"),
    (["--draft", "eagle", "--pac-depth", "2"], "add --mode sjd-pac"),
    (["--draft", "jacobi", "--pac-depth", "2"], "do(es) not apply to --draft jacobi"),
    (["--draft", "sjd-pac", "--coupling", "scd-gs"], "--coupling do(es) not apply to --draft sjd-pac"),
    (["--draft", "sjd-pac-p", "--L", "3"], "--L"),
    (["--draft", "sjd-pac", "--method", "cool-sd", "--fidelity"], "Jacobi-family draft"),
    (["--draft", "sjd-pac-p", "--method", "gsd", "--fidelity"], "exact likelihood of Jacobi drafting is not tractable"),
])
def test_cli_bad_input(argv, msg):
    """Each bad SJD-PAC input is a ValueError naming the option, before any model is built."""
    import argparse
    import re

    from coolsd.commands import generate as g

    sub = argparse.ArgumentParser().add_subparsers()
    g.register(sub)
    args = sub.choices["generate"].parse_args(["--model", "mnist", *argv])
    with pytest.raises(ValueError, match=re.escape(msg)):
        g.generate(args)
