"""The one place that decides which code path tensors on a device take (issue 42).

The *host path* runs on a CPU device: the engine verifies on numpy views of the rows (``real.decode.round.on_host``),
draws its uniforms by numpy hashing (``real.decode.rng``), and the models use the CPU kernels (oneDNN-packed GEMMs,
written-out attention for small ragged blocks: ``real.nn.layers``). The *device path* is what runs when the tensors
are on CUDA: torch verification on device tensors, the uniforms hashed on the device, plain ``F.linear`` and
``scaled_dot_product_attention``. It never ran on this project's machines, so it can be forced on the CPU, where it
is tested and counted (``benchmarks/bench_ops.py``): ``COOLSD_DEVICE_PATH=1`` in the environment, or
``real.decode.engine.generate(..., device_path=True)`` (which wins over the environment for its call; ``False``
keeps the decision by device whatever the environment).
"""
from __future__ import annotations

import contextlib
import os

import torch

__all__ = ["ENV", "forced", "host_path", "force"]

ENV = "COOLSD_DEVICE_PATH"
_FORCED: list[bool] = []        # generate(device_path=...) overrides, innermost last


def forced() -> bool:
    """Whether the device path is forced on the CPU (the innermost ``force`` scope, else ``COOLSD_DEVICE_PATH``)."""
    if _FORCED:
        return _FORCED[-1]
    return os.environ.get(ENV, "0").strip().lower() not in ("", "0", "false", "no", "off")


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
    _FORCED.append(bool(on))
    try:
        yield
    finally:
        _FORCED.pop()
