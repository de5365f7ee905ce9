"""Timers shared by the benchmark scripts (imported as ``_timing``: a script's own folder is on sys.path)."""
from __future__ import annotations

import statistics
import time


def best_of(fn, repeat: int = 5):
    """(fastest wall time in seconds over ``repeat`` calls, the last call's result)."""
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), out


def median_time(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time in seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
