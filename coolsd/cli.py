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
INT64_MAX = 2**63 - 1


class Parser(argparse.ArgumentParser):
    """The parser of every command and subcommand (argparse makes the subparsers of this class): what the option's
    declaration alone says is checked for every option, so a flag added tomorrow is covered without being named
    (issue 50): a ``type=float`` value must be finite, a ``type=int`` one within int64, a text value not empty. An error
    is one line (``coolsd: error: ...``, exit 2), the usage left to ``--help``."""

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        for a in self._actions:
            if not a.option_strings or a.nargs == 0 or not hasattr(ns, a.dest):
                continue
            v = getattr(ns, a.dest)
            if v is a.default:
                continue
            for x in v if isinstance(v, list) else [v]:
                why = _bad_value(a, x)
                if why:
                    self.error(f"argument {'/'.join(a.option_strings)}: {why}")
        return ns, rest

    def error(self, message):
        self.exit(2, f"{self.prog.split()[0]}: error: {' '.join(str(message).split())} (see {self.prog} --help)\n")


def _bad_value(action, x) -> str | None:
    """Why a parsed option value cannot be right whatever the option means, or None."""
    import math

    if action.type is float and isinstance(x, float) and not math.isfinite(x):
        return f"must be a finite number, got {x!r}"
    if action.type is int and isinstance(x, int) and abs(x) > INT64_MAX:
        return f"must be an integer within int64, got {x}"
    if isinstance(x, str) and action.choices is None and not x.strip():
        return "empty value"
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="coolsd", description="Relaxed speculative decoding toolkit (Cool-SD, LANTERN, UniformRSD).")
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
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:            # --help (0) or a parse error (2, one line printed): returned, as every error is
        return e.code if isinstance(e.code, int) else 2
    from theory.core.checks import boolean

    try:                               # the documented spellings only (issue 50): COOLSD_DEBUG=banana is refused
        debug = args.debug or boolean(DEBUG_ENV, os.environ.get(DEBUG_ENV, ""))
    except ValueError as e:
        print(f"coolsd: error: {e}", file=sys.stderr)
        return 2
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
