"""The decoder block's tensor arithmetic as pure functions, shared by LlamaGen (``real.models.llamagen``) and the
EAGLE-1 drafter (``real.models.eagle``), and its ``torch.compile``d variant.

A decoder layer of the engine is (i) ``block_pre``: norm, fused q/k/v projection and RoPE; (ii) the KV-cache
write (``real.nn.kvcache.KVCache.update``: host bookkeeping, never compiled); (iii) ``block_post``: attention
over the cached keys, output projection, residual, norm, SwiGLU, residual. (i) and (iii) hold every FLOP
and no state, so they are what ``compile_blocks`` compiles, with dynamic shapes (the block length S and the
key count K change from round to round) and one compiled graph shared by all layers (weights are
arguments, not captured modules). A compilation that fails (no C++ compiler, an unsupported op) warns
once and falls back to the eager functions for the rest of the process; results never depend on it.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import warnings
from types import SimpleNamespace

import torch

from .kvcache import static_keys
from .layers import gqa_heads, linear, rms_norm, rope_qkv, swiglu

__all__ = ["block_pre", "block_post", "EAGER", "compiled_functions", "compile_blocks", "compile_models", "compiled",
           "compile_problem", "MODES"]

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def block_pre(x: torch.Tensor, rot: torch.Tensor, norm_w: torch.Tensor | None, eps: float, wqkv,
              n_head: int, n_kv: int):
    """(i) of a decoder layer: x (B, S, dim), rot as ``apply_rope``, norm_w (dim,) or None (no input norm:
    EAGLE's layer 0), wqkv ((n_head + 2 n_kv) Dh, dim), or the q, k, v weights as a tuple (one fused GEMM,
    ``real.nn.layers.linear``) -> q (B, n_head, S, Dh), k, v (B, n_kv, S, Dh)."""
    h = x if norm_w is None else rms_norm(x, norm_w, eps)
    return rope_qkv(linear(h, wqkv), rot, n_head, n_kv)


def block_post(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               wo: torch.Tensor, norm_w: torch.Tensor, eps: float, w1: torch.Tensor, w3: torch.Tensor,
               w2: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """(iii) of a decoder layer: h = x + wo ``gqa_heads``(q, k, v, mask); h + ``swiglu``(rms_norm(h)).
    x (B, S, dim), q (B, H, S, Dh), k, v (B, Hkv, K, Dh) (cached keys included), wo (dim, H Dh), norm_w
    (dim,), w1/w3/w2 the SwiGLU gate/up/down weights -> (B, S, dim)."""
    h = x + linear(gqa_heads(q, k, v, mask, causal), wo)
    return h + swiglu(rms_norm(h, norm_w, eps), w1, w3, w2)


EAGER = SimpleNamespace(pre=block_pre, post=block_post)


class _WithFallback:
    """A compiled function that, the first time compiling or running it raises, warns once and calls the
    eager function instead from then on (an error of the inputs themselves is raised again by eager)."""

    def __init__(self, compiled, eager, name: str):
        self.compiled, self.eager, self.name, self.failed = compiled, eager, name, False

    def __call__(self, *args):
        if not self.failed:
            try:
                return self.compiled(*args)
            except Exception as e:  # any compiler failure: the eager function is always correct
                self.failed = True
                warnings.warn(f"torch.compile of {self.name} failed ({type(e).__name__}: {str(e)[:200]}); "
                              "running eager from now on", RuntimeWarning, stacklevel=2)
        return self.eager(*args)


@functools.lru_cache(maxsize=None)
def compiled_functions(mode: str | None = None, backend: str = "inductor", dynamic: bool = True) -> SimpleNamespace:
    """``block_pre`` and ``block_post`` through ``torch.compile(dynamic=dynamic, mode=mode, backend=backend)``
    with the eager fallback; one object per (mode, backend, dynamic), shared by every layer and model. ``dynamic``
    False: one graph per input shape (the static shapes of ``compiled(static=True)``)."""
    kw = dict(dynamic=dynamic, mode=mode, backend=backend)
    # one graph per (model's eps and widths, mask or none, S = 1 or more): a target and a drafter need ~8,
    # torch's default limit; beyond the limit dynamo silently runs eager, so leave room
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return SimpleNamespace(pre=_WithFallback(torch.compile(block_pre, **kw), block_pre, "block_pre"),
                           post=_WithFallback(torch.compile(block_post, **kw), block_post, "block_post"))


def compile_blocks(model: torch.nn.Module, enabled: bool = True, *, mode: str | None = None,
                   backend: str = "inductor", dynamic: bool = True) -> torch.nn.Module:
    """Route every decoder layer of ``model`` (modules with a ``fns`` attribute: LlamaGen blocks, EAGLE
    layers) through the compiled ``block_pre`` / ``block_post`` (``enabled``), or back to eager. ``mode``:
    torch.compile's (None = default; "reduce-overhead" adds CUDA graphs on GPU; "max-autotune-no-cudagraphs").
    Returns the model. Compilation happens at the first forward of each shape class (minutes on CPU)."""
    if mode not in MODES:
        raise ValueError(f"mode must be None, 'default', 'reduce-overhead', 'max-autotune' or "
                         f"'max-autotune-no-cudagraphs', got {mode!r}")
    fns = compiled_functions(None if mode == "default" else mode, backend, dynamic) if enabled else EAGER
    n = 0
    for m in (model.modules() if isinstance(model, torch.nn.Module) else ()):
        if hasattr(m, "fns"):
            m.fns = fns
            n += 1
    if n == 0:
        raise ValueError(f"{type(model).__name__} has no decoder layers that can be compiled")
    return model


def compile_models(models: dict, mode: str, device="cpu") -> None:
    """``coolsd generate --compile``: ``compile_blocks`` over ``models`` ({name: module or None}, e.g. the target and
    the draft; None skipped) with torch.compile's ``mode``, announced first on stderr (the first images wait for the
    compiler on ``device``). ValueError naming the model without compilable decoder layers."""
    import sys

    on_cuda = str(device).startswith("cuda")
    print(f"coolsd: --compile {mode}: compiling the decoder blocks with torch.compile; the first images wait for it "
          f"(expect {'under a minute on CUDA' if on_cuda else 'about 2-5 minutes on a CPU'}; torch caches the "
          "compiled code for later runs)", file=sys.stderr, flush=True)
    for name, m in models.items():
        if m is None:
            continue
        try:
            compile_blocks(m, mode=mode)
        except ValueError as e:
            raise ValueError(f"--compile: the {name}: {e} (supported: LlamaGen targets and drafts, EAGLE-1 "
                             "drafters)") from None


@contextlib.contextmanager
def compiled(models, mode: str | None, *, backend: str = "inductor", device="cpu", static: bool | None = None):
    """For the duration of the block, the decoder layers of ``models`` (None entries skipped) run through the compiled
    ``block_pre`` / ``block_post`` (``compile_blocks``); on exit every layer gets back the functions it had. ``mode``
    None: nothing changes. ``static`` (default: mode "reduce-overhead", whose CUDA graphs replay one shape): static
    shapes, i.e. graphs compiled per input shape (``dynamic=False``) and the KV caches attending over all their slots
    (``real.nn.kvcache.static_keys``), so a layer sees one shape per block length for the whole generation (the
    device path keeps one block length per run: ``real.decode.drafting.static_depth``). ValueError before anything
    changes when the compiler cannot work on ``device`` (``compile_problem``) or a model has no compilable decoder
    layers (naming it)."""
    if mode is None:
        yield
        return
    static = mode == "reduce-overhead" if static is None else bool(static)
    problem = compile_problem(device, backend, None if mode == "default" else mode)
    if problem:
        raise ValueError(f"compile={mode!r}: {problem}")
    ms = [m for m in models if m is not None]
    for m in ms:
        if not any(hasattr(x, "fns") for x in (m.modules() if isinstance(m, torch.nn.Module) else ())):
            raise ValueError(f"compile={mode!r}: {type(m).__name__} has no decoder layers real.nn.blocks can compile "
                             "(LlamaGen targets and drafts, EAGLE-1 drafters)")
    saved = [(x, x.fns) for m in ms for x in m.modules() if hasattr(x, "fns")]
    try:
        for m in ms:
            compile_blocks(m, mode=mode, backend=backend, dynamic=not static)
        with static_keys(static):
            yield
    finally:
        for x, f in saved:
            x.fns = f


def _cpp_compiler() -> str:
    """The C++ compiler inductor's CPU backend would use (raises when there is none)."""
    from torch._inductor import cpp_builder

    return cpp_builder.get_cpp_compiler()


def _has_triton() -> bool:
    from torch.utils._triton import has_triton

    return has_triton()


def compile_problem(device="cpu", backend: str = "inductor", mode: str | None = None) -> str | None:
    """Why ``compile_blocks(..., mode=mode, backend=backend)`` cannot work on ``device`` here, in one line
    naming what is missing, or None. Cheap (no compilation): torch.compile supported on this Python
    (dynamo), ``torch._inductor`` importable, and for inductor a C++ compiler on the CPU (looked up as
    inductor does, ``torch._inductor.cpp_builder.get_cpp_compiler``) or triton on CUDA; CUDA graphs
    ("reduce-overhead") need a CUDA device. Backends other than inductor (e.g. "eager", "aot_eager")
    need neither compiler."""
    dev = torch.device(device)
    if mode not in MODES:
        return f"unknown torch.compile mode {mode!r} (choose from {', '.join(str(m) for m in MODES[1:])})"
    if mode == "reduce-overhead" and dev.type != "cuda":
        return f"mode reduce-overhead captures CUDA graphs; device {dev} has none (use mode default)"
    try:
        dynamo = importlib.import_module("torch._dynamo")
    except Exception as e:  # noqa: BLE001 (a broken install: any import error)
        return f"torch.compile is unavailable: torch._dynamo does not import ({type(e).__name__}: {e})"
    if not dynamo.is_dynamo_supported():
        return f"torch.compile is not supported on this Python / platform (torch {torch.__version__})"
    if not isinstance(backend, str) or backend not in dynamo.list_backends(exclude_tags=()):
        return (f"unknown torch.compile backend {backend!r} (registered: "
                f"{', '.join(sorted(dynamo.list_backends(exclude_tags=())))})")
    if backend != "inductor":
        return None
    try:
        importlib.import_module("torch._inductor")
    except Exception as e:  # noqa: BLE001
        return f"torch.compile's inductor backend does not import ({type(e).__name__}: {e})"
    if dev.type == "cpu":
        try:
            _cpp_compiler()
        except Exception:  # noqa: BLE001 (InvalidCxxCompiler, a missing or failing executable)
            from torch._inductor import config

            return (f"no C++ compiler for torch.compile's inductor CPU backend (looked for "
                    f"{config.cpp.cxx!r}: install g++ or set CXX)")
    elif dev.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    elif dev.type == "cuda" and not _has_triton():
        return "torch.compile's inductor CUDA backend needs triton, which is not installed (pip install triton)"
    return None
