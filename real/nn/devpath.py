"""The one place that decides which code path tensors on a device take (issue 42).

The *host path* runs on a CPU device: the engine verifies on numpy views of the rows (``real.decode.round.on_host``),
draws its uniforms by numpy hashing (``real.decode.rng``), and the models use the CPU kernels (oneDNN-packed GEMMs,
written-out attention for small ragged blocks: ``real.nn.layers``). The *device path* is what runs when the tensors
are on CUDA: torch verification on device tensors, the uniforms hashed on the device, plain ``F.linear`` and
``scaled_dot_product_attention``. It never ran on this project's machines, so it can be forced on the CPU, where it
is tested and counted (``benchmarks/bench_ops.py``): ``COOLSD_DEVICE_PATH=1`` in the environment, or
``real.decode.engine.generate(..., device_path=True)`` (which wins over the environment for its call; ``False``
keeps the decision by device whatever the environment).

``to_device`` is the device path's one way to send small host data (indices, lengths, positions the host knows
after its one read-back per round) to the device without a host sync: pinned memory and a non-blocking copy.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

__all__ = ["ENV", "forced", "host_path", "force", "to_device", "host_verification", "holds_tensors"]

ENV = "COOLSD_DEVICE_PATH"
_FORCED: list[bool] = []        # generate(device_path=...) overrides, innermost last


# the spellings of a boolean, as ``theory.core.checks.TRUE_WORDS`` / ``FALSE_WORDS`` (real.nn imports only
# real.protocol; tests/test_fuzz_api.py checks the lists agree)
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


def _boolean(name: str, x) -> bool:
    """True / False, 0 / 1 or one of the words (any case); anything else is a one-line ValueError naming ``name``."""
    if isinstance(x, bool):
        return x
    if isinstance(x, int) and x in (0, 1):
        return bool(x)
    if isinstance(x, str) and x.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return x.strip().lower() in TRUE_WORDS
    raise ValueError(f"{name} must be a boolean (True / False, or one of {', '.join(TRUE_WORDS)} / "
                     f"{', '.join(w or repr(w) for w in FALSE_WORDS)}), got {str(x)[:40]!r}")


def forced() -> bool:
    """Whether the device path is forced on the CPU (the innermost ``force`` scope, else ``COOLSD_DEVICE_PATH``)."""
    if _FORCED:
        return _FORCED[-1]
    return _boolean(ENV, os.environ.get(ENV, "0"))      # its documented spellings only: "banana" is refused


def host_path(device) -> bool:
    """Whether work on ``device`` takes the host path: a CPU device, unless the device path is forced."""
    return torch.device(device).type == "cpu" and not forced()


@contextlib.contextmanager
def force(on: bool | None):
    """Within the scope, force the device path on (``True``) or off (``False``: the default decision by device,
    whatever the environment); ``None`` changes nothing."""
    if on is None:
        yield
        return
    _FORCED.append(_boolean("device_path", on))
    try:
        yield
    finally:
        _FORCED.pop()


def to_device(x, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host data ``x`` (numpy, a list, a CPU tensor) as a tensor on ``device`` without a host sync. On CUDA the data
    are copied into pinned memory (so ``x`` may change at once) and sent by a non-blocking copy, which waits for
    nothing (torch's caching host allocator keeps the pinned buffer until the copy has run); a pageable copy
    (``torch.as_tensor(x, device=cuda)``) is a blocking ``cudaMemcpy`` that waits for the stream's queued work. On
    the CPU (the device path forced there): a copy through the same non-blocking ``.to``, so that
    ``real.decode.opcount`` counts it as the asynchronous copy it is on CUDA (``h2d_async``: not a sync). On the
    host path (``host_path(device)``): ``torch.as_tensor(x, dtype, device)``, as ever."""
    dev = torch.device(device)
    if host_path(dev):
        return torch.as_tensor(x, dtype=dtype, device=dev)
    t = torch.as_tensor(x, dtype=dtype)
    if dev.type == "cuda":
        return t.pin_memory().to(dev, non_blocking=True)
    return t.to(dev, non_blocking=True, copy=True)      # the forced device path on the CPU: a copy, as on CUDA


def holds_tensors(obj, depth: int = 4) -> bool:
    """Whether ``obj`` (a verifier, its rules, their schedules...) keeps a torch tensor among its attributes,
    containers included, up to ``depth`` levels (e.g. LANTERN's neighbour table placed on the model device)."""
    if isinstance(obj, torch.Tensor):
        return True
    if depth == 0 or isinstance(obj, (str, bytes, int, float, np.ndarray)) or obj is None:
        return False
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = obj
    else:
        items = getattr(obj, "__dict__", {}).values()
    return any(holds_tensors(x, depth - 1) for x in items)


def host_verification(dev, verifier) -> bool:
    """Whether rounds on ``dev`` can be verified on numpy views of their rows: CPU rows and a verifier whose rules
    hold no torch tensors (``theory`` is array-API code). On (B, V) rows numpy's per-operation cost is about a third
    of torch's, and a tree walk is ~70 such operations per candidate."""
    return host_path(dev) and verifier is not None and not holds_tensors(verifier)
