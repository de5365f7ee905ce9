"""Write the generated reference pages of the documentation site (docs/reference/): the CLI reference from
``coolsd.cli.build_parser()`` (the ``--help`` of every command and subcommand) and the API reference stubs
(one page per package room, rendered from the docstrings by mkdocstrings).

    python scripts/docs_reference.py            # regenerate (run after changing a flag or adding a package)
    python scripts/docs_reference.py --check    # exit 1 if the committed pages differ (tests/test_docs.py)
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
REF = ROOT / "docs" / "reference"
WIDTH = "100"  # argparse wraps at $COLUMNS: fixed so the page does not depend on the terminal

# API pages: (page, title, packages rendered on it). Every package of theory / sim / real / coolsd is on exactly
# one page (tests/test_docs.py checks that a new package directory is not left out).
API_PAGES = [
    ("theory", "theory: the exact theory", ["theory", "theory.core", "theory.rules", "theory.tree", "theory.markov",
                                            "theory.likelihood"]),
    ("sim", "sim: Monte-Carlo simulation", ["sim"]),
    ("real", "real: protocol, registry, specs", ["real"]),
    ("real-decode", "real.decode: the decoder", ["real.decode", "real.decode.modes"]),
    ("real-nn", "real.nn: network pieces", ["real.nn"]),
    ("real-models", "real.models: our models", ["real.models"]),
    ("real-adapters", "real.adapters: transformers families", ["real.adapters"]),
    ("real-drafter", "real.drafter: training EAGLE-1 drafters", ["real.drafter"]),
    ("real-zoo", "real.zoo: the shipped models", ["real.zoo"]),
    ("coolsd", "coolsd: the command line", ["coolsd", "coolsd.commands"]),
    ("coolsd-studies", "coolsd.studies: demo, sweep, anneal", ["coolsd.studies"]),
    ("coolsd-quality", "coolsd.quality: image quality", ["coolsd.quality"]),
]


def _subparsers(ap):
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def parsers():
    """(command path, parser) for ``coolsd`` and every subcommand below it, depth first."""
    os.environ["COLUMNS"] = WIDTH
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from coolsd import cli

    out = []

    def walk(ap, path):
        out.append((path, ap))
        for name, sp in _subparsers(ap).items():
            walk(sp, path + [name])

    walk(cli.build_parser(), ["coolsd"])
    return out


def cli_page() -> str:
    out = ["# CLI reference", "",
           "Generated from `coolsd.cli.build_parser()` by `python scripts/docs_reference.py` "
           f"(Python {sys.version_info.major}.{sys.version_info.minor}, whose argparse formats the help); "
           "`tests/test_docs.py` fails when a flag changes without regenerating. Do not edit by hand.", ""]
    for path, ap in parsers():
        out.extend([f"{'#' * min(len(path) + 1, 4)} `{' '.join(path)}`", "", "```text",
                    ap.format_help().rstrip(), "```", ""])
    return "\n".join(out)


def missing_from_page(page: str) -> list[str]:
    """Every command and every option string of the parsers that the page's section for that command lacks
    (independent of how a Python version's argparse lays the help out)."""
    missing = []
    sections = {}
    for block in page.split("\n#")[1:]:
        head, _, body = block.partition("\n")
        sections[head.strip("# `")] = body
    for path, ap in parsers():
        name = " ".join(path)
        body = sections.get(name)
        if body is None:
            missing.append(f"{name} (no section)")
            continue
        for a in ap._actions:
            missing += [f"{name} {o}" for o in a.option_strings if o not in body]
    return missing


def _listed() -> set[str]:
    return {pkg for _, _, pkgs in API_PAGES for pkg in pkgs}


def _modules(pkg: str) -> list[str]:
    """``pkg`` and every public module below it, nested packages included, except packages listed on a page of
    their own."""
    d = ROOT.joinpath(*pkg.split("."))
    mods = [pkg]
    for f in sorted(d.iterdir()):
        if f.name.startswith("_") or f.name == "__pycache__":
            continue
        if f.suffix == ".py":
            mods.append(f"{pkg}.{f.stem}")
        elif f.is_dir() and (f / "__init__.py").exists() and f"{pkg}.{f.name}" not in _listed():
            mods += _modules(f"{pkg}.{f.name}")
    return mods


def api_page(title: str, packages: list[str]) -> str:
    out = [f"# {title}", "",
           "Rendered from the docstrings by mkdocstrings (page list: `scripts/docs_reference.py`).", ""]
    for pkg in packages:
        for mod in _modules(pkg):
            out += [f"::: {mod}", "    options:", "      heading_level: 2", ""]
    return "\n".join(out)


def pages() -> dict[pathlib.Path, str]:
    res = {REF / "cli.md": cli_page() + "\n"}
    for name, title, pkgs in API_PAGES:
        res[REF / "api" / f"{name}.md"] = api_page(title, pkgs)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed pages, write nothing")
    args = ap.parse_args(argv)
    stale = []
    for path, text in pages().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.relative_to(ROOT).as_posix())
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale generated pages: " + ", ".join(stale) + "; regenerate with: python scripts/docs_reference.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
