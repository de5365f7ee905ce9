"""scripts/sweep_reverdict.py: a committed sweep report's claims recomputed from its report.json alone."""
from __future__ import annotations

import json
import shutil

import pytest

from scriptload import ROOT, load


def _script():
    return load("scripts/sweep_reverdict.py")


def test_reverdict_rewrites_claims_with_both_axes_errors(tmp_path):
    """On a copy of the committed MNIST frontier report with its claims planted from the y-only SE (tokens per call
    taken as exact: a_xse = b_xse = None), the script restores the SEs that count the tokens per call's error: every
    testable claim's SE grows back (control: the planted SEs are smaller), and report.md is rewritten from the json."""
    from coolsd.studies.sweep import analysis, metrics

    d = tmp_path / "frontier"
    shutil.copytree(ROOT / "docs" / "results" / "frontier", d)
    rep = json.loads((d / "report.json").read_text())
    planted = json.loads(json.dumps(rep["claims"]))
    for c in planted:   # y-only SEs: what the verdicts used before the change
        ea = [e for e in rep["methods"] if e["family"] == c["a"]]
        eb = [e for e in rep["methods"] if e["family"] == c["b"]]
        for m, get in analysis.MEASURES.items():
            if "se" in c.get(m, {}):
                ya, yb = [get(e) for e in ea], [get(e) for e in eb]
                r = metrics.frontier_difference([e["accepted_length"]["measured"] for e in ea], [v[0] for v in ya],
                                                [v[1] for v in ya], [e["accepted_length"]["measured"] for e in eb],
                                                [v[0] for v in yb], [v[1] for v in yb])
                c[m] = {**c[m], "se": r["se"]}
    rep["claims"] = planted
    (d / "report.json").write_text(json.dumps(rep))
    (d / "report.md").write_text("stale")
    _script().main([str(d)])
    new = json.loads((d / "report.json").read_text())
    pairs = [(p[m]["se"], n[m]["se"]) for p, n in zip(planted, new["claims"]) for m in analysis.MEASURES
             if "se" in p.get(m, {})]
    assert len(pairs) >= 6 and all(b > a for a, b in pairs)
    assert new["claims"] == json.loads(json.dumps(analysis.claims(new["methods"]), default=float))
    assert "claims_recomputed" in new and (d / "report.md").read_text().startswith("# coolsd sweep")


def test_reverdict_refuses_a_directory_without_a_report(tmp_path):
    with pytest.raises(SystemExit, match="report.json does not exist"):
        _script().main([str(tmp_path)])
