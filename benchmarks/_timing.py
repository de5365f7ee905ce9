"""Timers shared by the benchmark scripts (imported as ``_timing``: a script's own folder is on sys.path),
and the machine-readable output that ``benchmarks/run_all.py`` reads (``write_ratios``)."""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import time

from coolsd.studies.batching import median_time  # noqa: F401  (one implementation, shared with the reports)


def best_of(fn, repeat: int = 5):
    """(fastest wall time in seconds over ``repeat`` calls, the last call's result)."""
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), out


def interleaved_best(fns: dict, repeat: int, clock=time.perf_counter) -> dict:
    """{name: fastest time in seconds} over ``repeat`` rounds that call every fn once in turn, so a load
    spike on a shared machine hits all of them alike. ``clock=time.thread_time``: CPU time of this thread
    (single-threaded work on a shared machine: time slices lost to other processes do not count)."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            best[name] = min(best[name], clock() - t0)
    return best


def single_thread_clock():
    """The clock for timing torch work in this process: ``time.thread_time`` (CPU time of the calling thread) at one
    torch thread, where the work runs on the calling thread (within 1% of wall time on an idle core) and the time
    slices other processes take on a shared machine do not count; ``time.perf_counter`` (wall) at more threads,
    whose work one thread's CPU time would not see. Call it after ``torch.set_num_threads``."""
    import torch
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def write_ratios(path: str | None, ratios: dict, extra: dict | None = None) -> None:
    """Write {"ratios": {name: {"value": float, "better": "higher" | "lower", "what": str}}} (and "tolerance": a
    fixed one, for exact counts) as JSON to ``path``
    (atomically; nothing when ``path`` is None): what ``--json`` of each ratio benchmark produces and
    ``benchmarks/run_all.py`` reads (a script with a JSON of its own puts the same "ratios" key in it, or passes
    its figures as ``extra``, written beside "ratios")."""
    if path is None:
        return
    for name, r in ratios.items():
        if set(r) - {"tolerance"} != {"value", "better", "what"} or r["better"] not in ("higher", "lower"):
            raise ValueError(f"ratio {name!r} must have value, better (higher/lower) and what (and optionally "
                             f"tolerance: exact counts), got {r}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump({**(extra or {}), "ratios": {k: {**v, "value": float(v["value"])} for k, v in ratios.items()}},
                  fh, indent=1)
    os.replace(tmp, path)


def profile_text(fn, top: int) -> str:
    """cProfile of one call of ``fn``: the ``top`` functions by own time, as text (the profile scripts' output)."""
    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return "\n".join(line for line in s.getvalue().splitlines()[4:] if line.strip())
