"""Teacher-forced rows and exact likelihoods of generated images (real.decode.score).

The consistency test: on every position a recorded run visited (``generate(..., record_rows=True)``), the
teacher-forced rows equal the rows the engine verified, for every draft kind (independent, layer-skip,
EAGLE), with CFG and top-k/temperature processing, ragged batches, the LlamaGen family (tiny c2i / t2i) and
the shipped MNIST zoo. A negative control: treating the EAGLE drafter's rows as offset-independent (its
offset-1 rows at every offset) must be caught by the same comparison.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import theory.rules.methods as tm
from real.decode import engine
from real.decode.sampling import Processing
from real.decode.score import Rows, score, teacher_forced_rows
from real.protocol import Caption
from real.registry import build, tiny_llamagen_pair
from theory.tree import chain_tree

torch.set_num_threads(1)

# float32 rows from forwards over different blocks (the engine's rounds vs one teacher-forced pass) agree to
# a few float32 ulps of the logits; observed max |diff| ~ 4e-6 on the MNIST models
TOL = 2e-5


def visited(gens, rows: Rows):
    """Max |recorded - teacher-forced| over the visited target and draft rows, and the rows compared. A round
    starting at n with tau accepted visits target rows n + j (j <= min(tau, L')) and draft rows for tokens
    n + i - 1 at offset i (i <= min(tau + 1, L'))."""
    P, Q = rows.p.numpy(), rows.q.numpy()
    ep = eq = 0.0
    k = 0
    for b, g in enumerate(gens):                   # a loop over images and their rounds (test only)
        n = 0
        for r in g.rounds:
            m = min(r.accepted, r.drafted)
            ep = max(ep, float(np.abs(r.p[:m + 1] - P[b, n:n + m + 1]).max()))
            for i in range(1, min(r.accepted + 1, r.drafted) + 1):
                q = Q[b, n + i - 1, i - 1] if Q.ndim == 4 else Q[b, n + i - 1]
                eq = max(eq, float(np.abs(r.q[i - 1] - q).max()))
                k += 1
            assert np.array_equal(r.drafts[:r.accepted], g.tokens[n:n + r.accepted].numpy())
            n += r.accepted + 1
        assert n == g.tokens.numel()
    return ep, eq, k


def run(target, draft, conds, T, L, proc, method="cool-sd", params=None, bs=3, seed=5):
    v = tm.build(method, L, params=params or ({"delta": 4} if method == "cool-sd" else {}))
    gens = engine.generate(target, draft, conds, num_tokens=T, verifier=v, drafting=L, processing=proc, seed=seed,
                           record_rows=True, batch_size=bs)
    tok = torch.stack([g.tokens for g in gens])
    return gens, tok, v


@pytest.fixture(scope="module")
def mnist():
    return {k: build("mnist", draft=k, num_images=6, seed=1) for k in ("small", "eagle", "layerskip")}


@pytest.mark.parametrize("kind", ["small", "eagle", "layerskip"])
@pytest.mark.parametrize("proc", [Processing(cfg_scale=2.0), Processing(temperature=0.8, top_k=40)])
def test_mnist_rows_equal_recorded(mnist, kind, proc):
    b = mnist[kind]
    gens, tok, _ = run(b.target, b.draft, b.conds, b.num_tokens, 4, proc)
    rows = teacher_forced_rows(b.target, b.draft, b.conds, tok, L=4, processing=proc)
    assert rows.convention == ("eagle" if kind == "eagle" else "theory")
    assert rows.q.shape == ((6, 49, 4, 512) if kind == "eagle" else (6, 49, 512))
    ep, eq, k = visited(gens, rows)
    assert k > 6 * 10 and ep < TOL and eq < TOL


def test_eagle_offsets_matter_negative_control(mnist):
    """The same comparison catches rows that ignore the round offset (the EAGLE drafter's offset-1 row used at
    every offset) and the wrong convention (the drafter drafting in round 0)."""
    b = mnist["eagle"]
    proc = Processing(cfg_scale=2.0)
    gens, tok, _ = run(b.target, b.draft, b.conds, b.num_tokens, 4, proc, method="vanilla")
    rows = teacher_forced_rows(b.target, b.draft, b.conds, tok, L=4, processing=proc)
    wrong = Rows(rows.p, rows.q[:, :, :1].expand(-1, -1, 4, -1).clone(), "eagle")
    assert visited(gens, rows)[1] < TOL
    assert visited(gens, wrong)[1] > 100 * TOL
    assert all(g.rounds[0].drafted == 0 and g.rounds[0].accepted == 0 for g in gens)


@pytest.mark.parametrize("kind", ["layerskip", "small", "eagle"])
@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_tiny_llamagen_rows_equal_recorded(kind, model_type):
    t, d = tiny_llamagen_pair(seed=0, draft=kind, model_type=model_type)
    if model_type == "c2i":
        conds = [3, 7, 1, 0, 5]
    else:
        g = torch.Generator().manual_seed(0)
        conds = [Caption(torch.randn(t.config.cls_token_num, t.config.caption_dim, generator=g)) for _ in range(5)]
    proc = Processing(cfg_scale=3.0, top_p=0.9)
    gens, tok, _ = run(t, d, conds, 20, 3, proc, bs=2)
    rows = teacher_forced_rows(t, d, conds, tok, L=3, processing=proc)
    ep, eq, k = visited(gens, rows)
    assert k > 5 and ep < TOL and eq < TOL


@pytest.mark.parametrize("kind", ["small", "eagle"])
def test_vanilla_likelihood_is_the_target_likelihood(mnist, kind):
    """Vanilla SD is lossless: log P^ = log P per image, to float32 rounding of the rows (T = 49 tokens, each row
    summing to 1 within ~1e-7); relaxed rules are not (a negative control: cool-sd moves log P^ by nats)."""
    b = mnist[kind]
    proc = Processing(cfg_scale=2.0)
    _, tok, v = run(b.target, b.draft, b.conds, b.num_tokens, 4, proc)
    s = score(b.target, b.draft, b.conds, tok, verifier=tm.build("vanilla", 4), drafting=4, processing=proc, batch_size=4)
    assert s["log_p"].shape == (6,) and np.all(np.isfinite(s["log_p"]))
    assert np.abs(s["log_p_hat"] - s["log_p"]).max() < 1e-4
    r = score(b.target, b.draft, b.conds, tok, verifier=v, drafting=4, processing=proc)
    assert np.abs(r["log_p"] - s["log_p"]).max() < 1e-6
    assert np.abs(r["log_p_hat"] - r["log_p"]).max() > 1.0


def test_plain_ar_rows_equal_recorded(mnist):
    b = mnist["small"]
    proc = Processing(cfg_scale=2.0)
    gens = engine.generate(b.target, None, b.conds, num_tokens=49, processing=proc, seed=2, record_rows=True)
    tok = torch.stack([g.tokens for g in gens])
    rows = teacher_forced_rows(b.target, None, b.conds, tok, processing=proc)
    assert rows.q is None
    rec = np.stack([np.concatenate([r.p for r in g.rounds]) for g in gens])
    assert np.abs(rec - rows.p.numpy()).max() < TOL


def test_bad_input(mnist):
    b = mnist["small"]
    v = tm.build("vanilla", 4)
    tok = torch.zeros(6, 49, dtype=torch.long)
    with pytest.raises(ValueError, match="tokens must lie in"):
        score(b.target, b.draft, b.conds, tok + 512, verifier=v, drafting=4)
    with pytest.raises(ValueError, match="tokens has 5 images"):
        score(b.target, b.draft, b.conds, tok[:5], verifier=v, drafting=4)
    with pytest.raises(ValueError, match="tokens must be an int"):
        score(b.target, b.draft, b.conds, tok.float(), verifier=v, drafting=4)
    with pytest.raises(ValueError, match="chain rule"):
        score(b.target, b.draft, b.conds, tok, verifier=object(), drafting=4)
    with pytest.raises(ValueError, match="drafting must be an int L >= 1"):
        score(b.target, b.draft, b.conds, tok, verifier=v, drafting=0)
    with pytest.raises(ValueError, match="drafting must be an int L >= 1"):       # a draft needs its drafting
        score(b.target, b.draft, b.conds, tok, verifier=v)
    with pytest.raises(ValueError, match="L must be"):
        teacher_forced_rows(b.target, mnist["eagle"].draft, b.conds, tok, L=None)
    with pytest.raises(ValueError, match="indexed by round start"):     # trees: real.decode.score_tree
        teacher_forced_rows(b.target, b.draft, b.conds, tok, L=2, tree=chain_tree(2))
    with pytest.raises(ValueError, match="drafting must be an int L, a Chain or a tree mode"):
        score(b.target, b.draft, b.conds, tok, verifier=v, drafting="chain")


def test_generate_fidelity_cli(tmp_path, capsys):
    import json

    from coolsd.cli import main

    out = tmp_path / "g.npz"
    assert main(["generate", "--model", "mnist", "--draft", "eagle", "--method", "vanilla", "--num-images", "3",
                 "--fidelity", "--json", "--save", str(out)]) == 0
    r = json.loads(capsys.readouterr().out)
    z = np.load(out)
    assert z["log_p_hat"].shape == z["log_p"].shape == (3,)
    assert np.abs(z["log_p_hat"] - z["log_p"]).max() < 1e-4                  # vanilla: P^ = P
    assert abs(r["fidelity"]["tv_to_target"]["measured"]) < 1e-4 and r["fidelity"]["nll_per_token"] > 0
    # sampled candidates, 4 at the root at V = 512: above the exact path's cost guard, estimated (T14)
    assert main(["generate", "--model", "mnist", "--tree", "eagle25", "--method", "cool-sd", "--num-images", "2",
                 "--fidelity", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)["fidelity"]
    assert f["kl_method"] == "mc" and f["mc"]["groups"] >= 2 and np.isfinite(f["mc"]["se_log_p_hat_max"])
    kl = f["kl_to_target"]
    assert kl["ci"][0] <= kl["measured"] <= kl["ci"][1]
    assert r["fidelity"]["kl_method"] == "exact"
