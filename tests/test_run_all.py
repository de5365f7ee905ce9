"""benchmarks/run_all.py's confirm-before-flag rule: a ratio that flags on its first run is judged on the median of
that run and its confirming reruns, so a one-off slow run passes and a regression that reproduces still fails."""
from __future__ import annotations

import json

import pytest

from scriptload import load

run_all = load("benchmarks/run_all.py")

HIGH = {"value": 1.0, "tolerance": 0.1, "better": "higher"}     # regression: below 0.9
LOW = {"value": 1.0, "tolerance": 0.1, "better": "lower"}       # regression: above 1.1


def test_judge_within_tolerance_needs_no_rerun():
    assert run_all.judge([0.95], [], HIGH) == "ok"
    assert run_all.judge([1.05], [], LOW) == "ok"


def test_judge_one_slow_run_is_transient():
    # the case: 0.750 on one run, 0.988 and 1.079 on the reruns
    assert run_all.judge([0.75], [0.988, 1.079], HIGH) == "transient"
    assert run_all.judge([1.5], [1.02, 0.97], LOW) == "transient"


def test_judge_a_reproducible_regression_is_confirmed():
    # control: a real slow-down reproduces in the reruns and must still be flagged
    assert run_all.judge([0.75], [0.80, 0.78], HIGH) == "confirmed"
    assert run_all.judge([1.3], [1.25, 1.4], LOW) == "confirmed"
    # one fast rerun among slow ones does not clear it: the median of the three decides
    assert run_all.judge([0.75], [0.70, 1.05], HIGH) == "confirmed"


def _fake_main(monkeypatch, tmp_path, sequence):
    """run_all.main with a one-ratio baseline (HIGH) and a fake benchmark returning ``sequence`` run by run;
    (exit code, number of runs made)."""
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps({"machine": run_all.machine(), "ratios": {
        "r": {**HIGH, "benchmark": "fake", "what": "a ratio", "runs": [1.0, 1.0]}}}))
    monkeypatch.setattr(run_all, "BASELINE", base)
    monkeypatch.setattr(run_all, "BENCHMARKS", {"fake": ("fake.py", [])})
    values = iter(sequence)
    calls = []

    def run_one(name):
        calls.append(name)
        return "ok", {"r": {"value": next(values), "better": "higher", "what": "a ratio"}}, 0.0, ""

    monkeypatch.setattr(run_all, "run_one", run_one)
    return run_all.main([]), len(calls)


@pytest.mark.parametrize("sequence, rc, n_runs", [
    ([0.95], 0, 1),                   # ok: no reruns
    ([0.75, 0.988, 1.079], 0, 3),     # flagged, transient: exit 0
    ([0.75, 0.80, 0.78], 1, 3),       # flagged, confirmed: exit 1 (the control)
])
def test_main_reruns_a_flagged_benchmark_and_exits_on_the_median(monkeypatch, tmp_path, capsys, sequence, rc, n_runs):
    assert _fake_main(monkeypatch, tmp_path, sequence) == (rc, n_runs)
    out = capsys.readouterr().out
    assert ("confirmed" in out) == (rc == 1) and ("transient" in out) == (n_runs == 3 and rc == 0)


def test_update_keeps_an_exact_count_s_own_tolerance(monkeypatch, tmp_path, capsys):
    """An exact count (bench_ops.py) carries its tolerance (0) and --update keeps it, where a timed ratio's comes from
    the spread with the 10% floor (the control)."""
    base = tmp_path / "baseline.json"
    monkeypatch.setattr(run_all, "BASELINE", base)
    monkeypatch.setattr(run_all, "ROOT", tmp_path)
    monkeypatch.setattr(run_all, "BENCHMARKS", {"fake": ("fake.py", [])})
    monkeypatch.setattr(run_all, "run_one", lambda name: ("ok", {
        "count": {"value": 7.0, "better": "lower", "what": "syncs", "tolerance": 0.0},
        "timed": {"value": 7.0, "better": "lower", "what": "a ratio"}}, 0.0, ""))
    assert run_all.main(["--update", "--runs", "2"]) == 0
    r = json.loads(base.read_text())["ratios"]
    assert r["count"]["tolerance"] == 0.0 and r["timed"]["tolerance"] == pytest.approx(0.7)
    monkeypatch.setattr(run_all, "run_one", lambda name: ("ok", {
        "count": {"value": 8.0, "better": "lower", "what": "syncs", "tolerance": 0.0}}, 0.0, ""))
    capsys.readouterr()
    assert run_all.main(["--only", "fake"]) == 2          # "timed" now missing: exit 2
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("count")][0]
    assert "REGRESSION, confirmed" in line                # one sync more than the baseline's 7, tolerance 0
