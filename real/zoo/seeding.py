"""Bitwise-reproducible CPU training: a context that fixes threads, seed and deterministic kernels."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def reproducible(seed: int, threads: int):
    """Seed torch, use ``threads`` threads and deterministic algorithms (with 2 threads the codebook
    lookup backward is not bitwise reproducible otherwise); restores threads and the determinism
    flag on exit so callers (e.g. a test session) are left as they were."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)
