"""Exact counts of aten operations and of sync-inducing operations, by phase of the round (issue 42).

``OpCounter`` is a context manager: a ``TorchDispatchMode`` sees every aten call (each one a kernel launch on CUDA,
in-place ones included, except views and the no-ops listed in ``NOT_KERNELS``), a ``TorchFunctionMode`` the Python calls that move data
between host and device, and ``real.decode.phases`` tells it which phase of the round is running. Counts are
exact and independent of the machine's load. On the CPU nothing actually waits, so the operations that WOULD
synchronise the host with a CUDA device are counted by type:

* device -> host reads (``d2h``): ``aten.item`` / ``aten._local_scalar_dense`` / ``aten.is_nonzero`` /
  ``aten.equal`` (``.item()``, ``int(t)``, ``bool(t)``, Python ``if`` on a tensor, ``torch.equal``), and
  ``Tensor.cpu()``, ``.numpy()``, ``.tolist()``, ``np.asarray(t)``, ``.to("cpu")`` of a tensor (on the device path
  every tensor is taken to live on the device, except those made from host data: ``torch.from_numpy``, or
  ``torch.as_tensor`` / ``torch.tensor`` of host data without a device);
* data-dependent output shapes (``shape``): ``aten.nonzero``, ``masked_select``, ``unique*``, ``bincount``,
  ``repeat_interleave`` without ``output_size``, ``aten.index`` / ``index_put`` with a boolean index (masks);
* host -> device copies (``h2d``): ``torch.as_tensor`` / ``torch.tensor`` / ``torch.asarray`` of host data with a
  ``device`` given, ``.to(device)`` of a host tensor, and indexing a tensor with a numpy
  array or a list (torch copies the index to the device). A pageable host -> device copy is a blocking
  ``cudaMemcpy`` that waits for the stream's queued kernels: on CUDA it costs the round a sync as a read does.

``syncs`` = d2h + shape + h2d. Not syncs, counted apart (``h2d_async``): ``.to(device, non_blocking=True)`` of host
data, as ``real.nn.devpath.to_device`` sends it (from pinned memory on CUDA: the copy waits for nothing). Usage::

    with OpCounter() as c:
        engine.generate(..., device_path=True)
    c.table()   # {phase: {"ops": .., "syncs": .., "d2h": .., "shape": .., "h2d": ..}}, c.rounds
"""
from __future__ import annotations

import os
import sys
import weakref
from collections import Counter, defaultdict

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import phases

__all__ = ["OpCounter", "D2H_ATEN", "SHAPE_ATEN", "NOT_KERNELS"]

aten = torch.ops.aten
D2H_ATEN = {"item", "_local_scalar_dense", "is_nonzero", "equal", "allclose"}
SHAPE_ATEN = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
              "unique_dim_consecutive", "bincount"}
NOT_KERNELS = {"lift_fresh", "lift_fresh_copy", "detach", "detach_", "resolve_conj", "resolve_neg", "alias",
               "_reshape_alias", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
               "set_", "_to_copy_noop"}
_D2H_METHODS = {"cpu", "numpy", "tolist", "__array__"}
_FACTORIES = {"as_tensor", "tensor", "asarray"}


def _bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _host_index(idx) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, (np.ndarray, list)) for i in items)


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        o = self.owner
        if name in D2H_ATEN:
            o.add("d2h", name)
        elif name in SHAPE_ATEN:
            o.add("shape", name)
        elif name == "repeat_interleave" and func._overloadname in ("Tensor", "self_Tensor") \
                and kwargs.get("output_size") is None:
            o.add("shape", name)
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and _bool_index(args[1]):
            o.add("shape", name + "[bool]")
        elif func.is_view or name in NOT_KERNELS or (args and out is args[0] and not func._schema.is_mutable):
            return out      # (an in-place op, ``add_``, ``copy_``, ``index_put_``..., returns its input: a kernel)
        else:
            o.add("ops", name)
        return out


class _Function(TorchFunctionMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner
        self.read = None                    # weak ref of the last tensor read by .cpu()
        self.made = {}                      # id -> weak ref of the tensors made from host memory (from_numpy, ...)

    def _host(self, t) -> bool:
        r = self.made.get(id(t))
        return r is not None and r() is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        o = self.owner
        first = args[0] if args else None
        tensor = isinstance(first, torch.Tensor)
        host = tensor and self._host(first)
        if name in _D2H_METHODS and tensor:
            read = self.read() if self.read is not None else None
            self.read = weakref.ref(first) if name == "cpu" else None
            if not host and read is not first:      # t.cpu().numpy(): one read (.cpu() returns t itself here)
                o.add("d2h", name)
        elif name in _FACTORIES and kwargs.get("device") is not None:
            if not tensor or host:              # as_tensor of a device tensor: no copy
                o.add("h2d", name)
        elif name == "to" and tensor:
            dev = kwargs.get("device", args[1] if len(args) > 1 else None)
            if host and isinstance(dev, (str, torch.device)):
                o.add("h2d_async" if kwargs.get("non_blocking") else "h2d", "to(device)")
            elif dev == "cpu":                  # the literal "cpu": a read-back (.to(run.dev) is not one)
                o.add("d2h", "to(cpu)")
        elif name in ("__getitem__", "__setitem__") and len(args) > 1 and _host_index(args[1]):
            o.add("h2d", name + "[host index]")
        out = func(*args, **kwargs)
        if name == "from_numpy" or (name == "pin_memory" and host) or (
                name in _FACTORIES and kwargs.get("device") is None and not tensor and isinstance(out, torch.Tensor)):
            self.made[id(out)] = weakref.ref(out)
        return out


def _caller() -> str:
    """file:line of the innermost frame of ours (real/, theory/) outside this module."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename.replace(os.sep, "/")
        if ("/real/" in fn or "/theory/" in fn) and not fn.endswith("/opcount.py"):
            return fn[fn.rindex("/real/" if "/real/" in fn else "/theory/") + 1:] + f":{f.f_lineno}"
        f = f.f_back
    return "?"


class OpCounter:
    """Counts by phase (module docstring); ``rounds`` counts ``phases.event("round")``."""

    def __init__(self, where: bool = False):
        self.where = defaultdict(Counter) if where else None   # phase -> Counter of "kind name file:line" (syncs)
        self.counts = defaultdict(Counter)      # phase -> Counter of kind ("ops", "d2h", "shape", "h2d")
        self.names = defaultdict(Counter)       # (phase, kind) -> Counter of op names
        self.stack: list[str] = []
        self.rounds = 0

    def push(self, name):
        self.stack.append(name)

    def pop(self):
        self.stack.pop()

    def event(self, name):
        if name == "round":
            self.rounds += 1

    def add(self, kind, name):
        ph = self.stack[-1] if self.stack else "bookkeeping"
        self.counts[ph][kind] += 1
        self.names[ph, kind][name] += 1
        if self.where is not None and kind != "ops":
            self.where[ph][f"{kind} {name} {_caller()}"] += 1

    def __enter__(self):
        self._ctx = [phases.listen(self), _Function(self), _Dispatch(self)]
        for c in self._ctx:
            c.__enter__()
        return self

    def __exit__(self, *exc):
        for c in reversed(self._ctx):
            c.__exit__(*exc)
        return False

    def table(self) -> dict:
        """{phase: {"ops", "syncs", "d2h", "shape", "h2d", "h2d_async"}} over every phase seen, plus "total"."""
        out = {}
        for ph in list(phases.PHASES) + sorted(set(self.counts) - set(phases.PHASES)):
            c = self.counts.get(ph, Counter())
            out[ph] = {"ops": c["ops"], "syncs": c["d2h"] + c["shape"] + c["h2d"], "d2h": c["d2h"],
                       "shape": c["shape"], "h2d": c["h2d"], "h2d_async": c["h2d_async"]}
        out["total"] = {k: sum(v[k] for v in out.values())
                        for k in ("ops", "syncs", "d2h", "shape", "h2d", "h2d_async")}
        return out

    def syncs(self, phase: str | None = None) -> int:
        """Sync-inducing operations in ``phase`` (None: all)."""
        t = self.table()
        return t["total" if phase is None else phase]["syncs"]
