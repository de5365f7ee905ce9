"""JAX plumbing shared by the optimisers (``theory.markov``, ``theory.likelihood.tune``): float64 for the duration
of a block, and jitted functions built once per process. JAX is imported on use (an optional extra).
"""
from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["jax64", "jitted"]


@contextlib.contextmanager
def jax64():
    """(jax, jax.numpy) with float64 enabled for the duration of the block only."""
    try:
        import jax
    except ImportError as e:  # pragma: no cover - jax is an optional extra
        raise ImportError("theory.optimize needs JAX for gradients: pip install 'coolsd[jax]'") from e
    with jax.enable_x64(True):
        yield jax, jax.numpy


_JIT: dict[str, Any] = {}


def jitted(name: str, builder):
    """Build a jitted function once per process (JAX retraces per input shape by itself)."""
    if name not in _JIT:
        _JIT[name] = builder()
    return _JIT[name]
