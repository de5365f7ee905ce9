"""Batch sizing of ``real.decode.engine.generate``: the memory a batch needs (both KV caches and the per-round rows) and
the default batch size that fits half of the device's free memory.
"""
from __future__ import annotations

import numpy as np
import torch

from .sampling import Processing

__all__ = ["MAX_BATCH", "default_batch_size", "check_batch", "device_of", "record_bytes", "return_freed"]

MAX_BATCH = 64          # default images per batch (``generate(batch_size=None)``), lowered to fit memory


def device_of(model) -> torch.device:
    d = getattr(model, "device", None)
    return torch.device(d) if d is not None else torch.device("cpu")


def _available_bytes(device: torch.device) -> int:
    """Free memory on the device (CUDA: free GPU memory; CPU: available RAM)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):   # not Linux: assume the cap alone applies
        return 1 << 62


def _batch_bytes(target, draft, images: int, rows_per_image: int, V: int) -> int:
    """Estimated memory of a batch: both KV caches (``cache_bytes``: a feature drafter's sized by the target's
    ``prefix_len``) and the per-round probability rows (a few (rows, 64, V) float32 arrays). A model that generates
    one image at a time (``batched`` false: its single-length cache grows with the prompt) is not estimated: it counts
    no cache bytes, and a feature drafter beside it is sized from a prefix of 1."""
    R = images * rows_per_image
    caches = int(target.cache_bytes(R)) if target.batched else 0
    if draft is not None and draft.batched:
        P = target.prefix_len if target.batched else 1
        caches += int(draft.cache_bytes(R, P) if draft.needs_features else draft.cache_bytes(R))
    return caches + 8 * R * 64 * V * 4


def record_bytes(mode, num_tokens: int, V: int) -> int:
    """An upper estimate of one image's recorded rows (``generate(record_rows=True)``, held until its batch is
    streamed: ``generate(on_batch=...)``): at most ``num_tokens`` rounds, each with a target and a draft row per node
    and the root, float32: T * 2 * (nodes + 1) * V * 4 bytes, nodes the mode's tree nodes or its depth."""
    nodes = getattr(mode, "n_nodes", None) or getattr(getattr(mode, "tree", None), "n_nodes", None) or mode.max_depth
    return int(num_tokens) * 2 * (int(nodes) + 1) * int(V) * 4


def default_batch_size(target, draft, n_images: int, processing: Processing = Processing(), extra: int = 0) -> int:
    """Images per batch when none is asked: all of them, at most ``MAX_BATCH``, and at most what half of
    the device's free memory holds (``_batch_bytes``, plus ``extra`` bytes per image: a recording run's rows,
    ``record_bytes``); 1 for a model that generates one image at a time (``batched`` false: the transformers
    adapters), as ``engine.generate`` documents."""
    if any(m is not None and not getattr(m, "batched", True) for m in (target, draft)):
        return 1
    dev, V = device_of(target), int(target.vocab_size)
    per = max(1, _batch_bytes(target, draft, 1, processing.batch, V) + int(extra))
    return int(max(1, min(n_images, MAX_BATCH, _available_bytes(dev) // 2 // per)))


def check_batch(target, draft, n_images: int, batch_size, processing: Processing, extra: int = 0) -> int:
    """The batch size (``batch_size`` checked, or the default) whose memory, ``extra`` bytes per image included
    (``record_bytes``), fits the device; ValueError otherwise."""
    if batch_size is None:
        bs = default_batch_size(target, draft, n_images, processing, extra)
    else:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        bs = int(batch_size)
        if bs < 1:
            raise ValueError(f"batch_size must be >= 1, got {bs}")
        if bs > n_images:
            raise ValueError(f"batch_size {bs} is larger than the {n_images} images asked")
    for m in (target, draft):
        if m is not None and bs > 1 and not m.batched:
            raise ValueError(f"{type(m).__name__} generates one image at a time (its cache has no per-row lengths): "
                             f"use batch size 1, got {bs}")
    need = _batch_bytes(target, draft, bs, processing.batch, int(target.vocab_size))
    need += bs * int(extra)
    free = _available_bytes(device_of(target))
    if need > free:
        raise ValueError(f"a batch of {bs} images needs about {need / 2**30:.2f} GiB (KV caches and rows), "
                         f"{free / 2**30:.2f} GiB is free: lower the batch size"
                         + (" (recorded rows included: --record streams each batch to disk)" if extra else ""))
    return bs


MMAP_THRESHOLD = 1 << 20   # bytes: a recording run's row blocks (MBs) are mapped, the small temporaries are not
_FIXED = False
_LIBC = None        # the C library, once looked up (False: none with malloc_trim)


def return_freed() -> None:
    """Give freed heap pages back to the system (glibc: the mmap threshold fixed at ``MMAP_THRESHOLD`` from the first
    call on, then ``malloc_trim``; a no-op without glibc). With glibc's adaptive threshold a recording run's next batch
    came from a fragmented heap and the peak grew 15% from 10 to 100 batches, 13% with the trim alone, 0.3% with a
    fixed threshold (benchmarks/bench_record_memory.py; docs/guide/records.md)."""
    global _FIXED
    libc = _libc()
    if libc:
        if not _FIXED and hasattr(libc, "mallopt"):
            libc.mallopt(-3, MMAP_THRESHOLD)     # M_MMAP_THRESHOLD: blocks above it are mapped, and unmapped when freed
            _FIXED = True
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


def _libc():
    import ctypes
    import ctypes.util

    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
    return _LIBC
