"""coolsd sweep --predict (issue 37): the frontier predicted from plain-AR images and the recorded vanilla run alone.

Checked against a measured sweep of the same grid in the same store: the predicted sweep generates only the AR and
recorded vanilla units; its tokens per call are the measured sweep's predictions; its KL(P||P^) and TV from the AR
images are exactly the measured sweep's (the same images, the same exact likelihood, an independent code path: cached
chunks vs per-setting files); the recursion on torch tensors (the CUDA path) equals numpy's; a damaged chunk is
recomputed alone; the comparison table counts what it says."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from coolsd.cli import main

BASE = ["--model", "mnist", "--draft", "eagle", "--grid", "vanilla", "cool-sd:delta=3", "lantern++:lambda=2",
        "--images", "20", "--unit-images", "10", "--record-images", "10", "--no-progress", "--batch-size", "10"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    pred = root / "p"
    assert main(["sweep", *BASE, "--predict", "--out", str(pred)]) == 0
    units_after_predict = sorted(os.listdir(pred / "units"))
    meas = root / "m"
    assert main(["sweep", *BASE, "--out", str(meas)]) == 0
    assert main(["sweep", *BASE, "--predict", "--measured", str(meas / "report.json"), "--out", str(meas)]) == 0
    return pred, meas, units_after_predict


def test_only_ar_and_recorded_vanilla_units_are_generated(stores):
    pred, _, units = stores
    slugs = {u.split(".")[0].rsplit("-b", 1)[0] for u in units}
    assert any(u.startswith("ar") for u in units) and any(u.startswith("vanilla") for u in units)
    assert not any("cool-sd" in u or "lantern" in u for u in units), units
    assert not (pred / "report.json").exists() and (pred / "predicted.json").exists() and slugs


def test_predictions_are_the_measured_sweeps_own(stores):
    pred, meas, _ = stores
    p = json.loads((pred / "predicted.json").read_text())
    m = json.loads((meas / "report.json").read_text())
    both = json.loads((meas / "predicted.json").read_text())
    mm = {e["key"]: e for e in m["methods"]}
    for e in p["methods"]:
        me = mm[e["key"]]
        assert e["tokens_per_call"]["predicted"] == pytest.approx(me["accepted_length"]["predicted"], rel=1e-12)
        kl = me["kl_from_ar"]["per_token"]["measured"]
        assert e["kl_ar_per_token"]["predicted"] == pytest.approx(kl, rel=1e-9, abs=1e-12)
        assert e["tv"]["predicted"] == pytest.approx(me["tv_to_target"]["from_ar"], rel=1e-9, abs=1e-12)
    van = next(e for e in p["methods"] if e["name"] == "vanilla")
    assert abs(van["kl_ar_per_token"]["predicted"]) < 1e-6
    relaxed = next(e for e in p["methods"] if e["name"] == "cool-sd")
    assert relaxed["kl_ar_per_token"]["predicted"] > 1e-3 and relaxed["tokens_per_call"]["predicted"] > \
        van["tokens_per_call"]["predicted"]
    c = both["comparison"]
    assert len(c["settings"]) == 3 and c["tv_compared"] == 3
    assert c["tv_inside_measured_ci"] == sum(r["tv_inside"] for r in c["settings"])
    assert (meas / "predicted_vs_measured.png").exists()


def test_torch_recursion_equals_numpy_and_a_damaged_chunk_is_recomputed_alone(stores, tmp_path, monkeypatch):
    import shutil

    from coolsd.studies.sweep import predict

    pred, _, _ = stores
    work = tmp_path / "w"
    shutil.copytree(pred, work)
    ref = json.loads((work / "predicted.json").read_text())
    chunk = work / "predict" / "ar_0.npz"
    chunk.write_bytes(b"damaged")
    monkeypatch.setattr(predict, "DEVICE_RECURSION", True)        # the CUDA path (torch tensors), on CPU
    assert main(["sweep", *BASE, "--predict", "--out", str(work)]) == 0
    got = json.loads((work / "predicted.json").read_text())
    for a, b in zip(ref["methods"], got["methods"]):
        assert b["kl_ar_per_token"]["predicted"] == pytest.approx(a["kl_ar_per_token"]["predicted"], rel=1e-9, abs=1e-12)
        assert b["tv"]["predicted"] == pytest.approx(a["tv"]["predicted"], rel=1e-9, abs=1e-12)
    with np.load(chunk) as z:
        assert "log_p_hat" in z.files


def test_refusals_before_any_work(tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["sweep", *BASE, "--measured", str(tmp_path), "--out", str(out)]) == 2
    assert "add --predict" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["sweep", *BASE, "--predict", "--measured", str(bad), "--out", str(out)]) == 2
    assert "not a sweep report" in capsys.readouterr().err
    assert main(["sweep", *BASE[:-5], "--record-images", "0", "--no-progress", "--predict", "--out", str(out)]) == 2
    assert not out.exists()


def test_cost_estimate_counts_only_the_images_a_predicted_sweep_draws(tmp_path, capsys):
    """--predict draws the plain-AR images and the recorded vanilla units only: its estimate (refused here by
    --max-seconds 1, before any work) counts those, not every setting of the grid; the measured sweep's (control)
    counts every setting."""
    grid = ["--grid", "vanilla", "cool-sd:delta=2,4,8", "uniform-rsd:c=2"]
    common = ["--model", "mnist", "--images", "400", "--unit-images", "100", "--max-seconds", "1", *grid]
    out = tmp_path / "x"
    assert main(["sweep", *common, "--predict", "--record-images", "150", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "400 plain-AR + 200 vanilla images x 49 tokens" in err, err      # 2 units of 100 cover 150
    assert main(["sweep", *common, "--out", str(out)]) == 2
    assert "--images 400 x 6 settings (AR included) x 49 tokens" in capsys.readouterr().err
    assert not out.exists()


def test_predictions_on_recorded_float32_rows_equal_those_on_float64_rows():
    """The sweep hands the predictions its rows as recorded (float32) and they convert a chunk of rounds at a time
    (``analysis._vanilla_source``): the chain and tree predictions equal those on rows converted whole, exactly, over
    several chunks. Control: a changed row changes the bound."""
    from coolsd.studies.demo import predict as P
    from theory import rules
    from theory.tree import Tree

    rng = np.random.default_rng(3)
    R, L, V = 150, 3, 32
    p = rng.dirichlet(np.ones(V), (R, L + 1)).astype(np.float32)
    q = rng.dirichlet(np.ones(V), (R, L)).astype(np.float32)
    d, nd, start = rng.integers(0, V, (R, L)), rng.integers(1, L + 1, R), rng.integers(0, 40, R)
    v = rules.cool_sd(3.0)
    a = P.chain_prediction((p, q, d, nd, start), v, L, True, T=40, per_row=8)
    assert a == P.chain_prediction((p.astype(np.float64), q.astype(np.float64), d, nd, start), v, L, True, T=40,
                                   per_row=8)
    p2 = p.copy()
    p2[0, 0] = np.roll(p2[0, 0], 1)
    assert P.chain_prediction((p2, q, d, nd, start), v, L, True, T=40, per_row=8)["tv_bound"] != a["tv_bound"]
    tree = Tree(((0,), (1,), (0, 0)))
    toks = rng.integers(0, V, (R, 4))
    g32 = {2: (rng.dirichlet(np.ones(V), (R, 4)).astype(np.float32), rng.dirichlet(np.ones(V), (R, 4)).astype(np.float32),
               toks, start)}
    g64 = {2: (g32[2][0].astype(np.float64), g32[2][1].astype(np.float64), toks, start)}
    assert P.tree_prediction(g32, v, tree, T=40, per_row=8) == P.tree_prediction(g64, v, tree, T=40, per_row=8)


def _lantern_record(seed=5, R=120, L=3, V=40):
    from theory import rules

    rng = np.random.default_rng(seed)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    p = rng.dirichlet(np.full(V, 0.3), (R, L + 1)).astype(np.float32)
    q = rng.dirichlet(np.full(V, 0.3), (R, L)).astype(np.float32)
    arrays = (p, q, rng.integers(0, V, (R, L)), rng.integers(1, L + 1, R), rng.integers(0, 40, R))
    vs = {f"{lam}:{res}": rules.lantern_pp(nb, 6, lam, resample=res) for lam in (1.5, 3.0) for res in ("lantern", "optimal")}
    vs["cool-sd"] = rules.cool_sd(3.0)
    return arrays, vs


def test_grid_predictions_equal_each_rules_own():
    """coolsd.studies.demo.predict.chain_predictions (the record read once; LANTERN's acceptance rows shared by rules
    with equal memo_key) gives each rule's own chain_prediction exactly."""
    from coolsd.studies.demo import predict as P

    arrays, vs = _lantern_record()
    got = P.chain_predictions(arrays, vs, 3, True, T=40, per_row=8)
    for k, v in vs.items():
        assert got[k] == P.chain_prediction(arrays, v, 3, True, T=40, per_row=8), k


def test_control_grid_predictions_with_a_colliding_memo_key(monkeypatch):
    """Negative control: a memo key that ignored the threshold would hand lambda = 3 the lambda = 1.5 acceptance rows,
    and the grid's predictions would differ from the rules' own."""
    from coolsd.studies.demo import predict as P
    from theory import rules

    arrays, vs = _lantern_record()
    own = {k: P.chain_prediction(arrays, v, 3, True, T=40, per_row=8) for k, v in vs.items()}
    monkeypatch.setattr(rules.Lantern, "memo_key", property(lambda self: ("lantern", id(self.neighbors), self.k)))
    got = P.chain_predictions(arrays, vs, 3, True, T=40, per_row=8)
    assert got["3.0:lantern"] != own["3.0:lantern"] and got["cool-sd"] == own["cool-sd"]


def _lantern_ks_record():
    """_lantern_record's rows with LANTERN++ rules (its own "q" resampler) at two thresholds and two k."""
    from theory import rules

    arrays, vs = _lantern_record()
    nb = vs["1.5:lantern"].resample.neighbors
    return arrays, {f"{lam}:{k}": rules.lantern_pp(nb, k, lam, resample="lantern") for lam in (1.5, 3.0) for k in (3, 6)}


def test_grid_predictions_share_the_q_laws_parts_by_table_and_k():
    """The released "q" law's threshold-free parts (r, d, d's neighbour sums) are formed once per chunk for the rules of
    one table and k (``LanternResample._q_parts``, kept in predict_rounds' memo): each rule's grid prediction equals its
    own, with rules of two k in one grid; and the parts are kept (one entry per k)."""
    from coolsd.studies.demo import predict as P
    from theory.likelihood.recorded import predict_rounds

    arrays, vs = _lantern_ks_record()
    got = P.chain_predictions(arrays, vs, 3, True, T=40, per_row=8)
    for k, v in vs.items():
        assert got[k] == P.chain_prediction(arrays, v, 3, True, T=40, per_row=8), k
    p, q, d, nd, _ = arrays
    memo = {}
    for v in vs.values():
        predict_rounds(p.astype(np.float64), q.astype(np.float64), d, v, n_drafted=nd, memo=memo)
    assert sorted(k[2] for k in memo if k[0] == "lantern-q") == [3, 6]


def test_control_q_parts_keyed_without_k_are_caught(monkeypatch):
    """Negative control: a key for the "q" law's parts that ignored k would hand the k = 6 rules the k = 3 neighbour
    sums, and their predicted TV bounds would differ from their own."""
    from coolsd.studies.demo import predict as P
    from theory import rules

    arrays, vs = _lantern_ks_record()
    own = {k: P.chain_prediction(arrays, v, 3, True, T=40, per_row=8) for k, v in vs.items()}
    monkeypatch.setattr(rules.LanternResample, "q_memo_key", property(lambda self: ("lantern-q", id(self.neighbors))))
    got = P.chain_predictions(arrays, vs, 3, True, T=40, per_row=8)
    assert got["1.5:3"] == own["1.5:3"] and got["1.5:6"]["tv_bound"] != own["1.5:6"]["tv_bound"]
