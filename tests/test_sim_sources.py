"""Image-like sources (sim.sources): the grid source's context and rows, the latent codebook's neighbour
structure, and the method comparison (small runs) with its figure and CLI."""
from __future__ import annotations

import math

import numpy as np
import pytest

from coolsd.cli import main
from sim import sources as so


def _entropy(P):
    with np.errstate(divide="ignore", invalid="ignore"):
        return -(np.where(P > 0, P * np.log(P), 0.0)).sum(1)


def test_grid_context_on_a_hand_made_buffer():
    g = so.grid_source(V=5, H=3, W=4, seed=0)
    B = 6                                          # V + 1 symbols: 5 = boundary
    buf = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 9, 9, 9, 9, 9]])
    rows = np.zeros(6, np.int64)
    pos = np.array([0, 1, 3, 4, 5, 11])
    # (left, up): pos 0 (B,B); 1 (0,B); 3 (2,B); 4 first column of row 1: (B, buf[0]=0); 5 (4, buf[1]=1);
    # 11: (buf[10]=0, buf[7]=2)
    want = [(5, 5), (0, 5), (2, 5), (5, 0), (4, 1), (0, 2)]
    got = g.context(buf, rows, pos, np.zeros(1, np.int64))
    assert got.tolist() == [l * B + u for l, u in want]


def test_grid_rows_and_ambiguity():
    flat = so.grid_source(V=16, ambiguity=4.0, seed=1)
    sharp = so.grid_source(V=16, ambiguity=0.7, seed=1)
    for g in (flat, sharp):
        assert g.P.shape == g.Q.shape == (17 * 17, 16)
        assert np.allclose(g.P.sum(1), 1) and np.allclose(g.Q.sum(1), 1)
        assert g.neighbors.shape == (16, 15)
    # tunable ambiguity: flatter rows (higher entropy) with a larger bump width
    assert _entropy(flat.P).mean() > _entropy(sharp.P).mean() + 0.5
    # the draft is a perturbed copy: close to P but not equal
    tv = 0.5 * np.abs(flat.P - flat.Q).sum(1)
    assert 0.02 < tv.mean() < 0.6
    with pytest.raises(ValueError, match="ambiguity > 0"):
        so.grid_source(ambiguity=0.0)
    with pytest.raises(ValueError, match="V >= 4"):
        so.grid_source(V=2)


def test_codebook_puts_similar_mass_on_latent_neighbours():
    c = so.codebook_source(V=24, d=2, seed=2)
    assert np.allclose(c.P.sum(1), 1) and np.allclose(c.Q.sum(1), 1)
    assert np.allclose(c.init @ c.P, c.init) and abs(c.init.sum() - 1) < 1e-12
    # the neighbour table comes from the embeddings: nearest first
    d = np.linalg.norm(c.embeddings[:, None] - c.embeddings[None], axis=-1)
    assert np.all(np.diff(np.take_along_axis(d, c.neighbors, 1), axis=1) >= -1e-12)
    # token selection ambiguity: a token's nearest latent neighbour carries mass much closer to its own
    # than a random other token does (relative difference, averaged over rows and tokens)
    P = c.P
    rel = lambda a, b: np.abs(a - b) / (a + b)  # noqa: E731
    near = rel(P, P[:, c.neighbors[:, 0]]).mean()
    far = rel(P, P[:, c.neighbors[:, -1]]).mean()
    assert near < 0.6 * far, (near, far)


def test_compare_small_run_and_theory_relations():
    rows = so.compare(("codebook",), L=3, n_rounds=4000, seed=1)
    methods = {r["method"] for r in rows}
    assert methods == {"vanilla", "uniform-rsd", "cool-sd", "lantern", "lantern++", "lantern+G*"}
    for r in rows:
        # simulated tokens per call within 4 SE of the exact E[tau] + 1
        assert abs(r["tokens_per_call"] - r["exact_tokens_per_call"]) <= 4 * r["tokens_per_call_se"], r
        assert r["tv"] <= r["bound"] + 1e-12
    van = next(r for r in rows if r["method"] == "vanilla")
    assert van["tv"] < 1e-12 and van["bound"] < 1e-12
    # Theorem 2(c): with the same acceptance, G* never has a larger bound than LANTERN's own resampler
    lan = {r["param"]: r for r in rows if r["method"] == "lantern"}
    opt = {r["param"]: r for r in rows if r["method"] == "lantern+G*"}
    for d in lan:
        assert opt[d]["bound"] <= lan[d]["bound"] + 1e-12
        assert opt[d]["exact_tokens_per_call"] == pytest.approx(lan[d]["exact_tokens_per_call"], abs=1e-12)


def test_compare_grid_small_run():
    g = so.grid_source(V=8, H=4, W=5, seed=3)
    rows = so.compare(("grid",), L=3, n_images=12, seed=2, grid=g)
    assert len(rows) == len(so.method_grid(g.neighbors, 3))
    van = next(r for r in rows if r["method"] == "vanilla")
    assert van["bound"] < 1e-12 and van["image_bound"] < 1e-12
    for r in rows:
        assert 1.0 <= r["tokens_per_call"] <= 4.0
        assert r["bound"] >= 0 and math.isfinite(r["bound_se"])


def test_plot_and_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    fig = tmp_path / "acc_vs_tv.png"
    rc = main(["sim", "sources", "--which", "codebook", "--L", "2", "--n-rounds", "2000", "--figure", str(fig)])
    out = capsys.readouterr().out
    assert rc == 0 and "lantern+G*" in out and "cool-sd" in out
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and fig.stat().st_size > 10_000
    assert main(["sim", "sources", "--which", "nothing"]) == 2
    assert "--which takes codebook and/or grid" in capsys.readouterr().err
