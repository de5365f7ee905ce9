"""coolsd sweep --predict --measured on a tiny sweep (issue 50): the predicted-vs-measured report completes on a
2-image measured report, says what a partial report lacks instead of crashing, and a report of another grid, model,
drafting or temperature (or a predicted report) is refused before any work, naming the difference."""
from __future__ import annotations

import json

import numpy as np
import pytest

from coolsd.cli import main

GRID = ["--grid", "vanilla", "cool-sd:delta=2"]
BASE = ["--model", "mnist", *GRID, "--images", "2", "--unit-images", "2", "--record-images", "2", "--no-progress"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("measured")
    assert main(["sweep", *BASE, "--out", str(root / "m")]) == 0
    return root / "m" / "report.json"


def _predicted(out, report, capsys):
    rc = main(["sweep", *BASE, "--predict", "--measured", str(report), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    return json.loads((out / "predicted.json").read_text()), (out / "predicted.md").read_text()


def test_predicted_against_a_tiny_measured_sweep_completes(measured, tmp_path, capsys):
    rep, md = _predicted(tmp_path / "p", measured, capsys)
    c = rep["comparison"]
    assert [r["key"] for r in c["settings"]] == ["vanilla", "cool-sd:delta=2"]
    assert all(r["tokens_per_call_measured"] > 1 and r["tokens_per_call_predicted"] > 1 for r in c["settings"])
    assert c["kl_rank_correlation"] is None and c["kl_compared"] == 2          # two settings: no rank correlation
    assert "KL rank correlation: not computed" in md and "Against the measured sweep" in md
    assert (tmp_path / "p" / "predicted_vs_measured.png").exists()


def test_a_measured_report_missing_fields_is_reported_not_a_crash(measured, tmp_path, capsys):
    m = json.loads(measured.read_text())
    for e in m["methods"]:
        e.pop("accepted_length", None)
        (e.get("tv_to_target") or {}).pop("ci", None)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(m))
    rep, md = _predicted(tmp_path / "p", partial, capsys)
    c = rep["comparison"]
    assert c["tokens_per_call_max_rel"] is None and c["tv_compared"] == 0
    assert all("measured tokens per call" in r["missing"] and "measured TV's 95% CI" in r["missing"]
               for r in c["settings"])
    assert "tokens per call: not compared" in md and "TV: not compared" in md
    assert "measured tokens per call, measured TV's 95% CI" in md


@pytest.mark.parametrize("change,argv,named", [
    ({"grid": ["vanilla", "cool-sd:delta=3"]}, [], "another grid"),
    ({"model": "natural256"}, [], "another model"),
    ({}, ["--tree", "eagle25"], "another drafting"),
    ({}, ["--L", "3"], "another L"),
    ({}, ["--temperature", "0.5"], "another temperature"),
    ({"predicted": True}, [], "is a predicted report"),
    ({"config": None}, [], "has no 'config'"),
])
def test_another_sweeps_report_is_refused_before_any_work(measured, tmp_path, capsys, change, argv, named):
    m = json.loads(measured.read_text())
    for k, v in change.items():
        if k in ("predicted", "config"):
            m[k] = v
        else:
            m["config"][k] = v
    other = tmp_path / "other.json"
    other.write_text(json.dumps(m))
    out = tmp_path / "p"
    rc = main(["sweep", *BASE, *argv, "--predict", "--measured", str(other), "--out", str(out)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("coolsd: warning")]
    assert rc == 2 and len(lines) == 1 and named in lines[0], lines
    assert not out.exists()                                    # nothing made: refused before the store


def test_the_same_report_as_a_control_is_accepted(measured, tmp_path, capsys):
    """Control for the refusals: the unchanged report (rewritten the same way) passes the same checks."""
    other = tmp_path / "same.json"
    other.write_text(measured.read_text())
    rep, _ = _predicted(tmp_path / "p", other, capsys)
    assert rep["comparison"]["measured_settings"] == 2


def test_predict_with_lossless_dynamic_trees_scores_ar_images_by_monte_carlo(tmp_path, capsys):
    """Lossless dynamic trees have T15's estimate (docs/theory/likelihood.md 11d), so --predict scores the AR images
    with it, as the release construction's exactly: KL(P||P^) per token with an interval for every setting."""
    out = tmp_path / "p"
    assert main(["sweep", *BASE, "--predict", "--mode", "dynamic", "--out", str(out)]) == 0
    rep = json.loads((out / "predicted.json").read_text())
    for e in rep["methods"]:
        k = e["kl_ar_per_token"]
        assert e["drafting"] == "dynamic-tree" and np.isfinite(k["predicted"]) and k["ci"][0] <= k["ci"][1], e


def test_a_unit_cut_short_is_named_before_any_work(measured, tmp_path, capsys):
    """A damaged stored unit (tokens cut short) is refused when the sweep opens its store, naming the file (it failed
    in the merge with numpy's error before)."""
    import shutil

    import numpy as np

    out = tmp_path / "m"
    shutil.copytree(measured.parent, out)
    unit = sorted((out / "units").glob("cool-sd*/u*.npz"))[0]
    z = dict(np.load(unit))
    z["tokens"] = z["tokens"][:, :30]
    np.savez(unit, **z)
    assert main(["sweep", *BASE, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(unit.name) in err and "tokens have shape (2, 30), not (2, 49)" in err
