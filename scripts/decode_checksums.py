"""Token checksums of every drafting mode x method on the shipped MNIST models, through ``coolsd generate``.

A refactor of the decoder must leave these unchanged for the same seed (issue 36, "Behaviour unchanged"):

  python scripts/decode_checksums.py --out before.json      # on the old commit
  python scripts/decode_checksums.py --compare before.json  # on the new one: exit 1 on any difference

Each run: 6 images in batches of 3 (ragged rounds), the model's CFG, seed 7. The checksum is the first 16 hex
digits of the SHA-256 of the (images, T) int64 token array.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
from contextlib import redirect_stdout

MODES = {
    "ar": ["--draft", "small"],
    "chain-small": ["--draft", "small", "--L", "4"],
    "chain-eagle": ["--draft", "eagle", "--L", "4"],
    "static-tree-eagle": ["--draft", "eagle", "--tree", "eagle25"],
    "static-tree-small": ["--draft", "small", "--tree", "eagle25"],
    "dynamic-lossless": ["--draft", "eagle", "--tree", "dynamic", "--tree-sampling", "lossless"],
    "dynamic-release": ["--draft", "eagle", "--tree", "dynamic", "--tree-sampling", "release"],
    "jacobi": ["--draft", "jacobi", "--window", "8"],
    "sjd-pac": ["--draft", "sjd-pac", "--window", "16"],
    "sjd-pac-p": ["--draft", "sjd-pac-p", "--window", "16"],
}
METHODS = {"vanilla": [], "cool-sd": ["--delta", "4"], "lantern++": [], "greedy": []}
# the other relaxed rules (issue 55: a speed change must leave their tokens unchanged), on the modes that run them
EXTRA_METHODS = {"lantern": ["--lantern-delta", "0.1"], "typical": [], "gsd": []}
EXTRA_MODES = ("chain-eagle", "static-tree-eagle", "dynamic-release", "jacobi")


def run_one(args: list[str]) -> str:
    """The checksum of the tokens ``coolsd generate`` writes for ``args`` (in this process)."""
    import tempfile

    import numpy as np

    from coolsd.cli import main

    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/t.npz"
        with redirect_stdout(io.StringIO()):
            rc = main(["generate", "--model", "mnist", "--num-images", "6", "--batch-size", "3", "--seed", "7",
                       "--json", "--save", out, *args])
        if rc != 0:
            raise SystemExit(f"coolsd generate {' '.join(args)} exited {rc}")
        tok = np.load(out)["tokens"].astype(np.int64)
    return hashlib.sha256(np.ascontiguousarray(tok).tobytes()).hexdigest()[:16]


def table() -> dict:
    out = {}
    for mode, margs in MODES.items():
        for method, xargs in METHODS.items():
            if mode == "ar":
                if method != "vanilla":
                    continue
                key, args = "ar", ["--method", "ar"]
            else:
                key, args = f"{mode} / {method}", [*margs, "--method", method, *xargs]
            _entry(out, key, args)
    for mode in EXTRA_MODES:
        for method, xargs in EXTRA_METHODS.items():
            _entry(out, f"{mode} / {method}", [*MODES[mode], "--method", method, *xargs])
    return out


def _entry(out: dict, key: str, args: list[str]) -> None:
    """One row of the table: the checksum, or the refusal's message for a combination that is refused."""
    t0 = time.perf_counter()
    try:
        out[key] = run_one(args)
    except SystemExit as e:
        out[key] = f"refused: {e}"
    print(f"{key:36s} {out[key]}  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the table to this JSON file")
    ap.add_argument("--compare", default=None, help="compare with a table written earlier; exit 1 on a difference")
    a = ap.parse_args(argv)
    t = table()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(t, f, indent=1)
    if a.compare:
        with open(a.compare) as f:
            old = json.load(f)
        print("| mode / method | before | after | same |\n|---|---|---|---|")
        bad = 0
        for k in sorted(set(old) | set(t)):
            same = old.get(k) == t.get(k)
            bad += not same
            print(f"| {k} | {old.get(k)} | {t.get(k)} | {'yes' if same else 'NO'} |")
        print(f"{len(t) - bad} of {len(t)} identical")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
