"""Build the notebooks from their sources and execute them, so they are committed with outputs.

Sources are plain Python files in notebooks/src/ with cells separated by lines starting with `# %%`
(`# %% [markdown]` cells hold markdown written as `# ` comment lines).

  python notebooks/build.py              # build + execute every notebook (full settings)
  python notebooks/build.py 01 03        # only these
  COOLSD_SMALL=1 python notebooks/build.py --check   # execute in small settings without writing (CI)
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent


def parse(src: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    blocks: list[tuple[str, list[str]]] = []
    for line in src.splitlines():
        if line.startswith("# %%"):
            blocks.append(("markdown" if "[markdown]" in line else "code", []))
        elif blocks:
            blocks[-1][1].append(line)
    for kind, lines in blocks:
        while lines and not lines[-1].strip():
            lines.pop()
        if kind == "markdown":
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in lines)
            nb.cells.append(nbformat.v4.new_markdown_cell(text))
        elif lines:
            nb.cells.append(nbformat.v4.new_code_cell("\n".join(lines)))
    return nb


def execute(nb, timeout=900):
    """Run every cell in a fresh kernel started in notebooks/, with this checkout first on the kernel's
    PYTHONPATH (the notebooks import theory/sim/real from the checkout whether or not it is installed)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE.parent)] + ([old] if old else []))
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    return nb


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("only", nargs="*", help="notebook number prefixes to build (default: all)")
    ap.add_argument("--check", action="store_true", help="execute without writing the .ipynb files")
    args = ap.parse_args(argv)
    srcs = sorted((HERE / "src").glob("*.py"))
    if args.only:
        srcs = [s for s in srcs if any(s.name.startswith(o) for o in args.only)]
    for s in srcs:
        print(f"executing {s.name} ...", flush=True)
        nb = execute(parse(s.read_text()))
        if not args.check:
            out = HERE / (s.stem + ".ipynb")
            nbformat.write(nb, out)
            print(f"  wrote {out.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
