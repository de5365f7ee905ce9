"""``coolsd sweep --predict --measured REPORT``: the measured sweep's report.json checked against the predicted sweep
before any work (issue 50). The report must be a measured sweep's (a ``config`` and a ``methods`` list) of the same
model, grid, drafting (mode, L, tree), draft, temperature and CFG scale: a difference is refused in one line naming
it. Its size does not matter (a 4-image sweep is compared as well as a 1,000-image one); what it lacks (a CI, a
field) is said in the comparison, never a crash."""
from __future__ import annotations

import os

__all__ = ["measured_report"]


def _keys(grid) -> list:
    """The setting keys of a grid with vanilla added (a predicted sweep always runs vanilla: ``ensure_vanilla``)."""
    keys = [str(k) for k in grid]
    return sorted(set(keys) | {"vanilla"})


def measured_report(path, *, model: str, settings, drafting, draft, temperature, cfg_scale) -> str:
    """The path of the measured report.json (``path`` itself or ``path/report.json``), checked now: readable JSON with
    a ``methods`` list and a ``config`` matching this sweep (module docstring). ValueError naming the difference."""
    from coolsd.io import check_input_file

    p = os.path.join(path, "report.json") if os.path.isdir(path) else path
    if not os.path.lexists(p):
        raise ValueError(f"--measured: {path!r} is not a report.json (or a sweep directory holding one)")
    rep = check_input_file("--measured", p, "json", hint="give a sweep's report.json")
    if not isinstance(rep, dict) or not isinstance(rep.get("methods"), list):
        raise ValueError(f"--measured: {p!r} is not a sweep report (no 'methods' list)")
    if rep.get("predicted"):
        raise ValueError(f"--measured: {p!r} is a predicted report (predicted.json); give a measured sweep's report.json")
    c = rep.get("config")
    if not isinstance(c, dict):
        raise ValueError(f"--measured: {p!r} has no 'config' (written before sweeps stored theirs): the grid, model and "
                         "drafting it measured cannot be checked; rerun that sweep")
    ours = {"model": model, "grid": _keys(s.key for s in settings), "drafting": drafting.mode.label,
            "L": drafting.max_depth, "tree": drafting.opts.get("tree")}
    theirs = {"model": c.get("model"), "grid": _keys(c.get("grid") or []), "drafting": c.get("drafting"),
              "L": c.get("L"), "tree": c.get("tree")}
    if draft is not None:
        ours["draft"], theirs["draft"] = draft, c.get("draft")
    ours["temperature"], theirs["temperature"] = float(temperature), c.get("temperature")
    if cfg_scale is not None:
        ours["cfg_scale"], theirs["cfg_scale"] = float(cfg_scale), c.get("cfg_scale")
    for k, v in ours.items():
        if theirs[k] != v:
            what = "grid" if k == "grid" else k
            raise ValueError(f"--measured: {p!r} measured another {what} ({theirs[k]!r}; this sweep: {v!r}); compare a "
                             "predicted sweep with a measured sweep of the same model, grid, drafting, draft, "
                             "temperature and CFG scale")
    return p
