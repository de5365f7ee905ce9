"""Timers shared by the benchmark scripts (imported as ``_timing``: a script's own folder is on sys.path)."""
from __future__ import annotations

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
