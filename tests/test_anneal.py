"""The annealing study (``coolsd.studies.anneal``, ``coolsd theory anneal``): the sweep's cases obey
Theorem 2(b) and the optimum, its summary fractions are what the cases say, its chains hit the requested row
TVs, and the CLI writes the table, JSON and figure and refuses bad input."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

from coolsd.studies import anneal
from theory.markov import chains, optimize

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_anneal_study_small_sweep():
    st_ = anneal.anneal_study(tvs=(0.2, 0.6), Vs=(3,), Ls=(2,), seeds=(0,), fractions=(0.5,), progress=False)
    cases = st_["cases"]
    assert len(cases) == 2 * 2 * 2
    for r in cases:
        assert r["inside_assumption"] == (r["max_row_tv"] <= 0.4 + 1e-12)
        for name in optimize.STUDY_SCHEDULES:
            assert r[f"exact_tv_{name}"] <= r[f"bound_{name}"] + 1e-12  # Theorem 2(b)
        assert r["bound_optimal"] <= min(r[f"bound_{n}"] for n in ("uniform", "exponential", "linear")) + 1e-12
    s = st_["summary"]["bound"]
    assert s["inside_tv_le_2/5"]["n"] + s["outside_tv_gt_2/5"]["n"] == s["all"]["n"] == len(cases)
    # the fraction is what the cases say
    wins = np.mean([r["bound_exponential"] < r["bound_uniform"] * (1 - 1e-9) for r in cases])
    assert abs(s["all"]["exponential_beats_uniform"] - wins) < 1e-12


def test_study_chain_hits_the_requested_row_tvs():
    for kind in anneal.ROW_KINDS:
        P, Q = anneal.study_chain(kind, "equal", 6, 0.55, 0)
        assert np.allclose(chains.row_tv(P, Q), 0.55, atol=1e-9)
        P, Q = anneal.study_chain(kind, "mixed", 6, 0.4, 0)
        rtv = chains.row_tv(P, Q)
        assert rtv.min() < 0.2 and rtv.max() > 0.6 and abs(rtv.mean() - 0.4) < 0.05


def test_cli_anneal_writes_table_json_and_figure(tmp_path):
    out = tmp_path / "anneal"
    cmd = [sys.executable, "-m", "coolsd.cli", "theory", "anneal", "--out", str(out), "--tvs", "0.2", "0.6",
           "--Vs", "3", "--Ls", "2", "--seeds", "1", "--fractions", "0.5", "--points", "3", "--no-optimize",
           "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "exact_tv" in r.stdout and "inside" in r.stdout
    lines = (out / "anneal_cases.csv").read_text().splitlines()
    assert len(lines) == 1 + 8 and "bound_exponential" in lines[0]
    summary = json.loads((out / "anneal_summary.json").read_text())
    assert {"summary", "config", "pareto", "caption"} <= set(summary)
    assert (out / "anneal_pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(cmd[:-1] + ["--fractions", "1.5"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=ENV)
    assert bad.returncode == 2 and "fractions" in bad.stderr
