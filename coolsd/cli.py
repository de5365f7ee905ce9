"""`coolsd` command line. Each command group lives in ``coolsd/commands/<group>.py`` and registers
its subcommands; heavy imports happen inside the handlers so `coolsd --help` stays fast."""
from __future__ import annotations

import argparse
import importlib
import sys

GROUPS = ["theory", "sim", "generate", "demo", "tune"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="coolsd", description="Relaxed speculative decoding toolkit (Cool-SD, LANTERN, UniformRSD).")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in GROUPS:
        importlib.import_module(f"coolsd.commands.{name}").register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"coolsd: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
