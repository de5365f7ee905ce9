"""`coolsd sweep` (coolsd.studies.sweep): grid parsing, the results store (resume, refusal), one process
vs torchrun with two ranks, and the metrics against independent computations."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from coolsd.cli import build_parser, main
from coolsd.commands.sweep import config
from coolsd.quality import estimators
from coolsd.studies.sweep import grid, metrics, plan_units, sweep

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--model", "mnist", "--grid", "cool-sd:delta=4", "vanilla", "--images", "4", "--unit-images", "2",
        "--no-progress"]


def _cfg(*argv):
    return config(build_parser().parse_args(["sweep", *argv]))


# --------------------------------------------------------------------------- grid

def test_grid_items_expand_and_are_checked_against_the_registry(tmp_path):
    s, ar = grid.parse_grid(["cool-sd:delta=2,4", "lantern++:lam=2,3:resampler=lantern,optimal", "vanilla", "ar"])
    assert ar and [x.key for x in s[:2]] == ["cool-sd:delta=2", "cool-sd:delta=4"] and len(s) == 7
    assert s[0].params_dict == {"delta": 2.0} and isinstance(s[0].params_dict["delta"], float)
    assert {x.key for x in s[2:6]} == {f"lantern++:lambda={v}:resampler={r}" for v in (2, 3) for r in ("lantern", "optimal")}
    assert s[2].family == "lantern++ resampler=lantern" and s[0].family == "cool-sd"
    for item, match in [("cool-sdd:delta=2", "unknown method 'cool-sdd'"), ("cool-sd:dleta=2", "unknown parameter 'dleta'"),
                        ("cool-sd:delta=0", "'delta' must be > 0"), ("cool-sd:delta", "is not NAME=V1,V2"),
                        ("cool-sd:delta=2,", "empty value"), ("uniform-rsd:c=x", "'c' must be float")]:
        with pytest.raises(ValueError, match=match):
            grid.parse_grid([item])
    with pytest.raises(ValueError, match="more than once"):
        grid.parse_grid(["cool-sd:delta=2", "cool-sd:delta=2.0"])
    f = tmp_path / "g.toml"
    f.write_text('grid = ["vanilla"]\n[[setting]]\nmethod = "uniform-rsd"\nc = [1.5, 2]\n')
    t, _ = grid.parse_grid(grid_from := grid.grid_from_toml(f))
    assert [x.key for x in t] == ["vanilla", "uniform-rsd:c=1.5", "uniform-rsd:c=2"] and len(grid_from) == 2
    f.write_text('grd = ["vanilla"]\n')
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['grd'\]"):
        grid.grid_from_toml(f)
    d, _ = grid.parse_grid(list(grid.DEFAULT_GRID))       # the paper's three comparisons, >= 20 settings
    assert len(d) >= 20 and {x.method for x in d} >= {"vanilla", "cool-sd", "uniform-rsd", "linear-rsd", "lantern++"}


def test_cli_names_a_bad_grid_item_before_any_work(capsys, tmp_path):
    assert main(["sweep", "--grid", "cool-sd:nu=0.5:lam=2", "--out", str(tmp_path / "x")]) == 2
    assert "cool-sd: unknown parameter 'lam'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- runs

@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep1")
    assert main(["sweep", *TINY, "--out", str(out)]) == 0
    return out


def _units(out: pathlib.Path) -> dict:
    return {str(p.relative_to(out)): dict(np.load(p)) for p in sorted(out.glob("units/*/*.npz"))}


def _same_units(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        for name, v in a[k].items():
            if name.startswith(("round_t_", "image_seconds")) or name == "meta":
                continue                                  # timings differ between runs
            assert np.array_equal(v, b[k][name]), (k, name)


def _timing_free(rep: dict) -> list:
    keep = ("name", "params", "images", "accepted_length", "frechet_distance", "frechet_distance_ci", "class_accuracy",
            "nll_per_token", "precision", "recall", "tv_bound", "tv_to_target", "kl_to_target", "tv_bound_image")
    out = []
    for m in rep["methods"]:
        e = {k: m[k] for k in keep}
        e["accepted_length"] = {k: v for k, v in m["accepted_length"].items()}
        out.append(e)
    return out


def test_report_follows_the_contract(one_process):
    rep = json.loads((one_process / "report.json").read_text())
    assert [m["name"] for m in rep["methods"]] == ["cool-sd", "vanilla"]
    assert rep["methods"][0]["params"] == {"delta": 4.0}
    for m in rep["methods"]:
        assert m["drafting"] == "chain" and m["images"] == 4
        for k in ("predicted", "measured", "measured_se"):
            assert isinstance(m["accepted_length"][k], float)
        assert m["speedup"]["measured"] > 0 and m["speedup"]["predicted"] > 0
        assert m["frechet_distance"] >= 0 and len(m["frechet_distance_ci"]) == 2
        assert 0 <= m["class_accuracy"] <= 1 and m["nll_per_token"] > 0 and m["tv_bound"] >= 0
    assert rep["methods"][1]["tv_bound"] < 1e-6                   # vanilla is lossless (float32 rows)
    for m in rep["methods"]:                                       # CONTRACT: measured fidelity with intervals
        tv, kl = m["tv_to_target"], m["kl_to_target"]
        for k in ("measured", "ci", "from_ar", "from_ar_ci"):
            assert k in tv
        assert tv["ci"][0] <= tv["measured"] <= tv["ci"][1] and tv["from_ar_ci"][0] <= tv["from_ar"] <= tv["from_ar_ci"][1]
        assert kl["ci"][0] <= kl["measured"] <= kl["ci"][1]
        assert m["tv_bound_image"]["measured"] >= 0
    van, cool = rep["methods"][1], rep["methods"][0]
    assert abs(van["tv_to_target"]["measured"]) < 1e-5 and abs(van["kl_to_target"]["measured"]) < 1e-5
    assert cool["tv_to_target"]["measured"] > 0.1 and cool["kl_to_target"]["measured"] > 0.1   # relaxation is seen
    assert all(k in c for c in rep["claims"] for k in ("tv_to_target", "kl_to_target"))
    assert len(list(one_process.glob("fidelity/*.npz"))) == 2
    units = _units(one_process)
    assert len(units) == len(plan_units(_cfg(*TINY, "--out", "x"))) == 6      # (AR + 2 settings) x 2 blocks
    assert all(u["tokens"].shape == (2, 49) for u in units.values())
    for f in ("report.md", *rep["figures"].values()):
        assert (one_process / f).stat().st_size > 1000
    assert not list(one_process.rglob("*.tmp"))


def test_sweep_runs_dynamic_trees_and_greedy_equals_chain_greedy(tmp_path):
    """``coolsd sweep --tree dynamic``: the engine gets the DynamicTree of the flags (a vanilla run drafts more than
    one token per call), the report says so, and greedy decoding through dynamic trees gives the same images as
    greedy through chains and through the static 25-node tree (all are plain greedy decoding; an error in the tree
    wiring changes the codes)."""
    base = ["--model", "mnist", "--grid", "greedy", "--images", "4", "--unit-images", "2", "--no-progress"]
    dyn = ["--tree", "dynamic", "--tree-total", "8", "--tree-depth", "2", "--tree-topk", "3"]
    cfg = _cfg(*base, *dyn, "--out", "x")
    assert cfg.dynamic == (8, 2, 3, "lossless") and cfg.tree is None
    assert cfg.identity()["drafting"]["dynamic"] == [8, 2, 3, "lossless"]
    assert _cfg(*TINY, "--out", "x").identity()["drafting"]["dynamic"] is None
    assert main(["sweep", *base, *dyn, "--out", str(tmp_path / "d")]) == 0
    assert main(["sweep", *base, "--out", str(tmp_path / "c")]) == 0
    assert main(["sweep", *base, "--tree", "eagle25", "--out", str(tmp_path / "s")]) == 0   # static trees too
    rep = json.loads((tmp_path / "d" / "report.json").read_text())
    assert rep["config"]["drafting"] == "dynamic-tree" and rep["config"]["dynamic"] == [8, 2, 3, "lossless"]
    van = next(m for m in rep["methods"] if m["name"] == "vanilla")
    assert van["drafting"] == "dynamic-tree" and van["L"] == 3 and van["accepted_length"]["measured"] > 1.2
    assert van["accepted_length"]["predicted"] is None and not rep["predictions"]["available"]
    d, c, st = _units(tmp_path / "d"), _units(tmp_path / "c"), _units(tmp_path / "s")
    greedy = [k for k in d if k.startswith("units/greedy")]
    assert len(greedy) == 2 and all(np.array_equal(d[k]["tokens"], c[k]["tokens"]) for k in greedy)
    assert all(np.array_equal(st[k]["tokens"], c[k]["tokens"]) for k in greedy)
    assert (d[greedy[0]]["round_depth"] >= 0).all() and d[greedy[0]]["round_depth"].max() <= 3


def test_sweep_dynamic_tree_flags_are_checked_before_any_work(tmp_path):
    for extra, match in [(["--tree-total", "8"], "--tree-total configures dynamic trees: add --mode dynamic"),
                         (["--tree", "eagle25", "--tree-topk", "3"], "--tree-topk configures dynamic trees"),
                         (["--tree", "dynamic", "--tree-depth", "0"], "--tree-depth must be an integer >= 1, got 0"),
                         (["--tree", "dynamic", "--tree-total", "500", "--tree-depth", "1", "--tree-topk", "2"],
                          "exceeds the 7 nodes")]:
        with pytest.raises(ValueError, match=match):
            _cfg(*TINY, *extra, "--out", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_torchrun_two_ranks_gives_the_same_results(one_process, tmp_path):
    out = tmp_path / "sweep2"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "coolsd", "sweep",
                        *TINY, "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    _same_units(_units(one_process), _units(out))
    a, b = (json.loads((d / "report.json").read_text()) for d in (one_process, out))
    assert _timing_free(a) == _timing_free(b) and b["config"]["world_size"] == 2


def test_killed_sweep_resumes_without_duplicates(one_process, tmp_path):
    out = tmp_path / "killed"
    cfg = _cfg(*TINY, "--out", str(out))
    seen = []

    def boom(u):
        seen.append(u)
        if len(seen) == 4:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        sweep(cfg, out, after_unit=boom)
    assert len(list(out.glob("units/*/*.npz"))) == 4 and not list(out.rglob("*.tmp"))
    assert not (out / "report.json").exists()
    part = sweep(cfg, out, max_units=1)             # a run in chunks: one more unit, no report
    assert not part["complete"] and part["done_here"] == 1 and part["missing"] == 1
    rest = sweep(cfg, out)
    assert rest["complete"] and rest["done_here"] == 1 and rest["remaining_before"] == 1
    _same_units(_units(one_process), _units(out))              # same as the uninterrupted run, no extra file
    a, b = (json.loads((d / "report.json").read_text()) for d in (one_process, out))
    assert _timing_free(a) == _timing_free(b)
    again = sweep(cfg, out)                         # complete: nothing recomputed
    assert again["done_here"] == 0 and again["remaining_before"] == 0


def test_interrupted_merge_keeps_the_quality_it_finished(one_process, tmp_path, monkeypatch):
    """The merge stops after the per-setting quality of AR (the first of 3): rerunning computes only the
    other two (cached quality/<slug>.json is reused) and writes the report of the uninterrupted run."""
    import shutil

    from coolsd.studies.sweep import quality

    out = tmp_path / "merge"
    shutil.copytree(one_process, out, ignore=shutil.ignore_patterns("report*", "*.png", "quality"))
    real, calls, armed = quality._measure, [], [True]

    def counted(*a, **k):
        calls.append(1)
        if armed[0] and len(calls) == 2:
            raise KeyboardInterrupt("killed during the merge")
        return real(*a, **k)

    monkeypatch.setattr(quality, "_measure", counted)
    cfg = _cfg(*TINY, "--out", str(out))
    with pytest.raises(KeyboardInterrupt):
        sweep(cfg, out)
    assert len(list(out.glob("quality/*.json"))) == 1 and not (out / "report.json").exists()
    calls.clear()
    armed[0] = False
    res = sweep(cfg, out)
    assert res["complete"] and len(calls) == 2 and len(list(out.glob("quality/*.json"))) == 3
    a, b = (json.loads((d / "report.json").read_text()) for d in (one_process, out))
    assert _timing_free(a) == _timing_free(b)


def test_another_grid_or_model_is_refused(one_process, capsys, tmp_path):
    before = sorted(one_process.rglob("*"))
    for argv in (["--grid", "cool-sd:delta=2", "vanilla"], ["--model", "llamagen-tiny"], ["--seed", "1"],
                 ["--unit-images", "4"]):
        args = [*TINY, "--out", str(one_process)]
        i = args.index(argv[0]) if argv[0] in args else None
        if i is not None:
            j = i + 1
            while j < len(args) and not args[j].startswith("--"):
                j += 1
            args = args[:i] + args[j:]
        assert main(["sweep", *args, *argv]) == 2
        err = capsys.readouterr().err
        assert "another configuration" in err and "start fresh" in err
    assert sorted(one_process.rglob("*")) == before              # nothing written or removed
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    assert main(["sweep", *TINY, "--out", str(tmp_path / "other")]) == 2
    assert "without a sweep manifest" in capsys.readouterr().err


# --------------------------------------------------------------------------- metrics

def test_tokens_per_call_and_its_se_over_images():
    v, se = metrics.tokens_per_call([10, 20], 49)
    assert v == pytest.approx(49 / 15) and se == pytest.approx(49 * (math.sqrt(50) / math.sqrt(2)) / 15**2)
    # the SE matches the spread of the estimate over independent repetitions (n = 40 images each)
    rng = np.random.default_rng(0)
    reps = [metrics.tokens_per_call(1 + rng.poisson(15, 40), 49) for _ in range(2000)]
    est, ses = np.array([r[0] for r in reps]), np.array([r[1] for r in reps])
    assert abs(ses.mean() / est.std() - 1) < 0.1
    with pytest.raises(ValueError):
        metrics.tokens_per_call([3, 0], 49)


def test_fd_interval_covers_the_closed_form_of_two_gaussians():
    """FD between N(m1, diag s1) and N(m2, diag s2) is |m1 - m2|^2 + sum (sqrt s1 - sqrt s2)^2 (commuting
    covariances). The 95% interval from n = 400 samples covers it in most of 40 seeded repetitions
    (binomial SD of the coverage ~0.035); negative control: samples of another law are far outside."""
    m1, s1, m2, s2 = np.array([0.0, 1.0]), np.array([1.0, 4.0]), np.array([0.5, 0.0]), np.array([2.0, 1.0])
    truth = ((m1 - m2) ** 2).sum() + ((np.sqrt(s1) - np.sqrt(s2)) ** 2).sum()
    ref = (m2, np.diag(s2))
    rng = np.random.default_rng(1)
    cover = []
    for _ in range(40):
        out = estimators.fd_with_ci(m1 + np.sqrt(s1) * rng.standard_normal((400, 2)), ref)
        cover.append(out["ci"][0] <= truth <= out["ci"][1])
        assert out["ci"][0] < out["fd"] < out["ci"][1] and out["se"] > 0
    assert np.mean(cover) >= 0.8
    other = estimators.fd_with_ci(m1 + 1.0 + np.sqrt(s1) * rng.standard_normal((400, 2)), ref)
    assert other["ci"][0] > truth + 1.0


def test_fd_jackknife_se_is_the_refit_jackknife_and_is_calibrated():
    """(a) The rank-one leave-one-out statistics give the jackknife of n refits (brute force here);
    (b) the SE matches the spread of FD over 150 independent samples (d = 8, n = 200; the SD estimate
    has a relative SE of ~6%, the tolerance is 20%)."""
    from real.zoo.metrics import frechet_distance_stats

    rng = np.random.default_rng(3)
    A = rng.standard_normal((8, 8)) / 3
    ref_x = rng.standard_normal((5000, 8))
    ref = (ref_x.mean(0), np.cov(ref_x, rowvar=False))
    f = rng.standard_normal((30, 8)) @ A + 0.3
    jk = np.array([frechet_distance_stats(*(lambda g: (g.mean(0), np.cov(g, rowvar=False)))(np.delete(f, i, 0)), *ref)
                   for i in range(30)])
    assert estimators.fd_with_ci(f, ref)["se"] == pytest.approx(np.sqrt(29 / 30 * ((jk - jk.mean()) ** 2).sum()), rel=1e-9)
    runs = [estimators.fd_with_ci(rng.standard_normal((200, 8)) @ A + 0.3, ref) for _ in range(150)]
    sd = np.std([r["fd"] for r in runs], ddof=1)
    assert 0.8 < np.mean([r["se"] for r in runs]) / sd < 1.25


def test_precision_recall_on_a_hand_made_point_set():
    real = np.array([[0, 0], [1, 0], [0, 1], [1, 1]], float)          # k = 1: every radius is 1
    gen = np.array([[0.5, 0.5], [0.1, 0], [5, 5], [6, 5]], float)      # two inside, two far away
    # generated radii (k = 1): 0.640, 0.640, 1, 1; only (0, 0) lies within one of them (0.1 from (0.1, 0))
    assert estimators.precision_recall(real, gen, k=1) == {"precision": 0.5, "recall": 0.25, "k": 1}
    assert estimators.precision_recall(real, real, k=1)["precision"] == 1.0
    with pytest.raises(ValueError, match="k must be"):
        estimators.precision_recall(real, gen, k=4)


def test_frontier_difference_by_interpolation():
    r = metrics.frontier_difference([1, 2, 3], [10, 20, 30], [1, 1, 1], [1.5, 2.5, 5], [14, 26, 0], [2, 2, 2])
    # A at 1.5 and 2.5 is 15 and 25 (B's point at 5 lies outside A's range): mean difference 0;
    # weights on A (0.25, 0.5, 0.25), on B (-0.5, -0.5): variance 0.375 * 1 + 0.5 * 4
    assert r["points"] == 2 and r["difference"] == pytest.approx(0.0) and r["se"] == pytest.approx(math.sqrt(2.375))
    lower = metrics.frontier_difference([1, 2, 3], [10, 20, 30], [0.1] * 3, [2], [25], [0.1])
    assert lower["difference"] == pytest.approx(-5) and lower["z"] < -2
    assert metrics.frontier_difference([1, 2], [1, 2], [1, 1], [3], [1], [1]) is None


def test_frontier_difference_se_counts_the_tokens_per_call_error():
    """The delta-method SE (y's and x's) against the spread of the difference over 4,000 simulated re-measurements
    of every point (x's and y's drawn around a steep frontier with their SEs, small against the points' spacing):
    equal within 6% (the SD of 4,000 draws has a relative SE of about 1.1%); control: the y-only SE misses the x error, below 0.7 of the spread."""
    rng = np.random.default_rng(7)
    ax, ay = np.array([2.5, 3.7, 4.9]), np.array([0.02, 0.18, 0.49])
    bx, by = np.array([4.3]), np.array([0.30])       # mid-segment: the linearisation's regime (|x errors| << spacing)
    a_se, b_se, a_xse, b_xse = np.full(3, 0.01), np.array([0.01]), np.full(3, 0.06), np.array([0.1])
    r = metrics.frontier_difference(ax, ay, a_se, bx, by, b_se, a_xse, b_xse)
    n = 4000
    draws = [metrics.frontier_difference(ax + rng.normal(size=3) * a_xse, ay + rng.normal(size=3) * a_se,
                                         a_se, bx + rng.normal(size=1) * b_xse, by + rng.normal(size=1) * b_se,
                                         b_se)["difference"] for _ in range(n)]   # a loop over replicates (a test)
    sd = float(np.std(draws, ddof=1))
    assert abs(r["se"] / sd - 1) < 0.06, (r["se"], sd)
    assert r["se_y"] / sd < 0.7 and r["se_x"] > r["se_y"]                 # control: x error left out
    assert math.isclose(r["se"] ** 2, r["se_x"] ** 2 + r["se_y"] ** 2)
    with pytest.raises(ValueError, match="x SEs must match"):
        metrics.frontier_difference(ax, ay, a_se, bx, by, b_se, a_xse[:2], b_xse)
    # extrapolate: a point past A's end is compared along the continued last segment (slope 0.3 / 1.2 per unit);
    # control: without it the point is left out
    past = metrics.frontier_difference(ax, ay, a_se, [5.3], [0.6], b_se, a_xse, b_xse, extrapolate=True)
    assert past["difference"] == pytest.approx(0.49 + 0.31 / 1.2 * 0.4 - 0.6)
    assert metrics.frontier_difference(ax, ay, a_se, [5.3], [0.6], b_se, a_xse, b_xse) is None


def test_disk_full_keeps_the_stored_units(tmp_path, monkeypatch):
    import errno

    from coolsd.studies.sweep import store as st

    out = tmp_path / "full"
    cfg = _cfg("--model", "mnist", "--grid", "vanilla", "--images", "2", "--unit-images", "1", "--out", str(out))
    real_write, calls = st.atomic_write_bytes, []

    def write(path, data):
        calls.append(path)
        if len(calls) > 2:                                   # manifest and one unit, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(st, "atomic_write_bytes", write)
    with pytest.raises(ValueError, match="No space left on device.*already stored are kept"):
        sweep(cfg, out)
    assert len(list(out.glob("units/*/*.npz"))) == 1 and not list(out.rglob("*.tmp"))


def test_blocked_precision_recall_and_batched_fd_equal_the_unblocked_computation(monkeypatch):
    """Blocks of 7 rows (so blocks are ragged) give the brute-force k-NN precision/recall written here
    with full distance matrices, and the batched FD of m Gaussians equals m separate FDs."""
    from real.zoo.metrics import frechet_distance_stats, frechet_distances_to

    rng = np.random.default_rng(5)
    real, gen = rng.standard_normal((40, 3)), rng.standard_normal((53, 3)) * 0.7 + 0.6
    monkeypatch.setattr(estimators, "_DISTANCE_ROWS", 7)
    monkeypatch.setattr(estimators, "_JACKKNIFE_BLOCK", 7)

    def brute(a, b, k):
        da = np.linalg.norm(a[:, None] - a[None], axis=-1)
        np.fill_diagonal(da, np.inf)
        rad = np.sort(da, axis=1)[:, k - 1]
        return (np.linalg.norm(b[:, None] - a[None], axis=-1) <= rad[None]).any(1).mean()

    out = estimators.precision_recall(real, gen, k=3)
    assert out["precision"] == pytest.approx(brute(real, gen, 3), abs=1e-12)
    assert out["recall"] == pytest.approx(brute(gen, real, 3), abs=1e-12)
    assert 0 < out["precision"] < 1 and 0 < out["recall"] < 1          # neither trivially 0 nor 1
    mus = rng.standard_normal((5, 3))
    sig = np.stack([np.cov(rng.standard_normal((20, 3)), rowvar=False) for _ in range(5)])
    ref = (np.zeros(3), np.cov(rng.standard_normal((30, 3)), rowvar=False))
    np.testing.assert_allclose(frechet_distances_to(mus, sig, *ref),
                               [frechet_distance_stats(m, s, *ref) for m, s in zip(mus, sig)], rtol=1e-12)
    f = rng.standard_normal((30, 3))
    jk = np.array([frechet_distance_stats(np.delete(f, i, 0).mean(0), np.cov(np.delete(f, i, 0), rowvar=False), *ref)
                   for i in range(30)])
    assert estimators.fd_with_ci(f, ref)["se"] == pytest.approx(np.sqrt(29 / 30 * ((jk - jk.mean()) ** 2).sum()), rel=1e-9)


def test_mnist_report_fd_is_the_library_fid_of_the_old_fd(one_process):
    """The MNIST frontier's FD (now torchmetrics' FID through coolsd.quality) equals the sweep's former FD
    (real.zoo.metrics on the classifier features of the decoded codes) for every setting, within the round-off
    bound of the two eigen-solvers (4 images in 64 dims: singular covariances, coolsd.quality.metrics.fd_agreement),
    the jackknife SE to the FD's relative round-off (the same estimator on features recomputed here: float32
    convolutions in another process and batching agree to round-off, which the singular covariances magnify to
    ~1e-7 relative; a different jackknife, delete-a-group, moves it by percent), and the report carries the
    classifier's stamp."""
    pytest.importorskip("torchmetrics")
    import torch

    from coolsd.quality.metrics import fd_agreement

    from real.zoo import vq
    from real.zoo.metrics import image_features, reference_stats

    rep = json.loads((one_process / "report.json").read_text())
    for m in [rep["baseline"], *rep["methods"]]:
        slug = "ar" if m["name"] == "ar" else next(p.parent.name for p in one_process.glob("units/*/*.npz")
                                                    if p.parent.name.startswith(m["name"]))
        toks = np.concatenate([np.load(p)["tokens"] for p in sorted((one_process / "units" / slug).glob("*.npz"))])
        f = image_features(vq.decode(torch.as_tensor(toks))).numpy()
        old = estimators.fd_with_ci(f, reference_stats())
        assert abs(m["frechet_distance"] - old["fd"]) <= fd_agreement(f, reference_stats()[1])
        assert m["frechet_distance"] == pytest.approx(old["fd"], rel=1e-6)
        assert m["frechet_distance_se"] == pytest.approx(old["se"], rel=1e-6)
        assert m["quality_stamp"]["fid"]["extractor"] == "mnist-classifier zoo"
    assert rep["quality_stamp"]["fid"]["images"] == 4
