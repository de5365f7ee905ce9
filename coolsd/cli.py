"""`coolsd` command line. Each command group lives in ``coolsd/commands/<group>.py`` and registers
its subcommands; heavy imports happen inside the handlers so `coolsd --help` stays fast.

Errors: every expected failure (bad input, files, checkpoints, the Hugging Face hub or the network,
CUDA, out of memory) is printed as one line ``coolsd: error: ...`` with exit code 2; Ctrl-C prints one
line and exits with 130. ``--debug`` (or ``COOLSD_DEBUG=1``) shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

GROUPS = ["theory", "sim", "generate", "demo", "sweep", "tune", "train_drafter"]
DEBUG_ENV = "COOLSD_DEBUG"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="coolsd", description="Relaxed speculative decoding toolkit (Cool-SD, LANTERN, UniformRSD).")
    ap.add_argument("--debug", action="store_true",
                    help=f"show the full traceback on errors (also: {DEBUG_ENV}=1)")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in GROUPS:
        importlib.import_module(f"coolsd.commands.{name}").register(sub)
    return ap


def _module_of(e: BaseException) -> str:
    return type(e).__module__ or ""


def describe_error(e: BaseException) -> str | None:
    """One line naming the cause of an expected failure, or None for an unexpected one (a bug: the
    traceback is shown)."""
    mod = _module_of(e)
    name = type(e).__name__
    if isinstance(e, ValueError) and not mod.startswith(("huggingface_hub", "requests", "urllib3", "safetensors")):
        return str(e)
    if name == "OutOfMemoryError" or isinstance(e, MemoryError):
        return (f"out of memory ({str(e).splitlines()[0] if str(e) else name}); try a smaller problem "
                "(fewer images or tokens, a smaller model or vocabulary, --dtype bfloat16)")
    if mod.startswith(("huggingface_hub", "requests", "urllib3", "httpx")):
        first = str(e).splitlines()[0] if str(e) else name
        return (f"could not fetch from the Hugging Face hub ({name}: {first}); check the network, the repo id "
                "or pass a local path")
    if mod.startswith("safetensors") or name == "SafetensorError":
        return f"could not read a safetensors file: {e}"
    if name == "UnpicklingError":
        return f"could not read a checkpoint (pickle): {e}"
    if isinstance(e, OSError):
        what = e.strerror or str(e) or name
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        return f"{what}{where}"
    if isinstance(e, RuntimeError) and any(k in str(e) for k in ("CUDA", "cuDNN", "NCCL", "out of memory")):
        return f"device error: {str(e).splitlines()[0]}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print("coolsd: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # expected failures: one clear line, no traceback
        msg = describe_error(e)
        if msg is None or debug:
            raise
        msg = " ".join(ln.strip() for ln in msg.splitlines() if ln.strip())   # one line, whatever the source
        print(f"coolsd: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
