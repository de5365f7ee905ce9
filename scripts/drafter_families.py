"""Trained against untrained EAGLE-1 heads on every tiny family (issue 48): ``coolsd train-drafter`` then ``coolsd
generate --draft eagle`` with and without ``--drafter-dir``, tokens per target call with standard errors and z.

  python scripts/drafter_families.py --out docs/results/drafters [--sequences 256] [--steps 200] [--images 32]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

FAMILIES = ("llamagen-tiny", "chameleon-tiny", "janus-tiny", "emu3-tiny", "glm-image-tiny")


def _json_of(argv: list[str]) -> dict:
    from coolsd.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    if rc != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {rc}")
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--sequences", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--images", type=int, default=32)
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for m in FAMILIES:
            t0 = time.perf_counter()
            tr = _json_of(["train-drafter", "--model", m, "--data", "generate", "--num-sequences", str(a.sequences),
                           "--steps", str(a.steps), "--eval-every", "0", "--quiet", "--out", f"{d}/{m}"])
            train_s = time.perf_counter() - t0
            g = ["generate", "--model", m, "--draft", "eagle", "--num-images", str(a.images), "--seed", "0", "--json"]
            x, y = _json_of(g + ["--drafter-dir", f"{d}/{m}"]), _json_of(g)
            tx, sx = x["tokens_per_target_call"], x["tokens_per_target_call_se"]
            ty, sy = y["tokens_per_target_call"], y["tokens_per_target_call_se"]
            rows.append({"model": m, "trained": [tx, sx], "untrained": [ty, sy], "z": (tx - ty) / math.hypot(sx, sy),
                         "validation": tr["validation"], "train_seconds": round(train_s, 1)})
            print(f"{m:16s} trained {tx:.3f} +- {sx:.3f}  untrained {ty:.3f} +- {sy:.3f}  z = {rows[-1]['z']:.1f}  "
                  f"(predicted {tr['validation']['tokens_per_call_L4']:.3f}; {train_s:.0f} s)", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "families.json").write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
