"""Recompute a finished sweep's claim verdicts from its report.json, without its run directory.

``coolsd.studies.sweep.analysis.claims`` reads only the report's "methods" entries (quality values, their SEs and the
measured tokens per call with its SE), so a committed report can be brought up to a changed verdict rule (here: the
frontier SE counting the tokens per call's error, ``metrics.frontier_difference``) without regenerating the images.
Rewrites report.json's "claims" (and records the rule under "claims_recomputed") and report.md, atomically; the
figures are untouched. Prints each claim's verdicts before and after.

  python scripts/sweep_reverdict.py DIR [DIR ...]
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from coolsd.io import atomic_file  # noqa: E402
from coolsd.studies.sweep.analysis import MEASURES, claims  # noqa: E402
from coolsd.studies.sweep.report import markdown  # noqa: E402

RULE = ("frontier SE by the delta method over the KL / quality values and the measured tokens per call "
        "(coolsd.studies.sweep.metrics.frontier_difference, scripts/sweep_reverdict.py)")


def _verdicts(cl: list[dict]) -> list[str]:
    return [f"{c['a']} vs {c['b']}: " + ", ".join(f"{m} {c[m]['verdict']}"
                                                  + (f" (z {c[m]['z']:+.2f})" if c[m].get("z") is not None else "")
                                                  for m in MEASURES if m in c) for c in cl]


def main(argv=None) -> int:
    dirs = [pathlib.Path(d) for d in (argv if argv is not None else sys.argv[1:])]
    if not dirs:
        raise SystemExit("usage: python scripts/sweep_reverdict.py DIR [DIR ...] (sweep report directories)")
    for d in dirs:   # check every directory before rewriting any
        if not (d / "report.json").is_file():
            raise SystemExit(f"sweep_reverdict: {d / 'report.json'} does not exist")
    for d in dirs:   # a loop over report directories
        rep = json.loads((d / "report.json").read_text())
        old = rep.get("claims", [])
        rep["claims"] = claims(rep["methods"]) if old else []
        rep["claims_recomputed"] = RULE
        print(f"== {d}")
        for a, b in zip(_verdicts(old), _verdicts(rep["claims"])):
            print(f"  before: {a}\n  after:  {b}")
        with atomic_file(d / "report.json", "w") as f:
            f.write(json.dumps(rep, indent=1, default=float))
        with atomic_file(d / "report.md", "w") as f:
            f.write(markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
