"""Every notebook executes (small settings) and its committed copy holds a figure and no error."""
from __future__ import annotations

import pathlib
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRCS = sorted((ROOT / "notebooks" / "src").glob("*.py"))
sys.path.insert(0, str(ROOT / "notebooks"))


@pytest.mark.parametrize("src", SRCS, ids=lambda p: p.stem)
def test_notebook_runs_in_small_settings(src, monkeypatch):
    import build

    monkeypatch.setenv("COOLSD_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = build.execute(build.parse(src.read_text()), timeout=600)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


@pytest.mark.parametrize("src", SRCS, ids=lambda p: p.stem)
def test_committed_notebook_has_outputs_and_a_figure(src):
    nb = nbformat.read(ROOT / "notebooks" / f"{src.stem}.ipynb", as_version=4)
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outs), "no rendered figure"
