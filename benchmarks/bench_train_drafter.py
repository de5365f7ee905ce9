"""``coolsd train-drafter``'s two speed goals (issue 48), as same-run ratios.

1. Feature extraction against plain-AR generation of the same sequences: one shard of ``--sequences`` sequences of
   the model (default natural256: 256 tokens, CFG 2), timed as (a) the target's own samples (``generate_shard``, plain
   AR under the inference processing) and (b) the features along them (``extract_shard``: one prefill of [cond; null]
   rows). Ratio ``(a + b) / a``: what ``--data generate`` pays for its features over the generation alone (goal <= 1.2),
   and ``b / a``. Interleaved best-of, CPU time of one thread.
2. Training samples per second under ``torchrun --nproc-per-node 2`` against one process (one torch thread per
   process; the training loop's wall time from each drafter's manifest; the same global batch, seed and data). Goal
   >= 1.6. Run it on an otherwise idle machine: on a shared one the ratio measures the other load.

  python benchmarks/bench_train_drafter.py [--short] [--model natural256] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _timing import interleaved_best, write_ratios  # noqa: E402


def extraction(model: str, n: int, repeat: int) -> dict:
    import time

    import torch

    from real.decode.sampling import Processing
    from real.drafter import features as fx
    from real.protocol import NO_DRAFT
    from real.registry import build

    torch.set_num_threads(1)
    b = build(model, num_images=n, draft=NO_DRAFT)
    proc = Processing(cfg_scale=b.cfg_scale, top_k=b.top_k)
    toks = fx.generate_shard(b.target, b.conds, b.num_tokens, proc, seed=0)
    t = interleaved_best({"generate": lambda: fx.generate_shard(b.target, b.conds, b.num_tokens, proc, seed=0),
                          "extract": lambda: fx.extract_shard(b.target, b.conds, toks, cfg=b.cfg_scale != 1.0,
                                                              null_frac=0.1, seed=0, shard=0)},
                         repeat, clock=time.thread_time)
    return {"generate_s": t["generate"], "extract_s": t["extract"], "sequences": n, "tokens": b.num_tokens}


def _train_cmd(out, steps: int, batch: int, n: int) -> list[str]:
    return ["-m", "coolsd", "train-drafter", "--model", "llamagen-tiny", "--data", "generate", "--num-sequences", str(n),
            "--steps", str(steps), "--batch-size", str(batch), "--eval-every", "0", "--save-every", "0", "--threads",
            "1", "--quiet", "--out", str(out)]


def ranks(steps: int, batch: int, n: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as d:
        one, two = pathlib.Path(d) / "one", pathlib.Path(d) / "two"
        subprocess.run([sys.executable, *_train_cmd(one, steps, batch, n)], check=True, env=env, capture_output=True)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533",
                        *_train_cmd(two, steps, batch, n)[1:]], check=True, env=env, capture_output=True)
        s1 = json.loads((one / "coolsd_drafter.json").read_text())["seconds"]["training"]
        s2 = json.loads((two / "coolsd_drafter.json").read_text())["seconds"]["training"]
    return {"one_process_samples_per_s": steps * batch / s1, "two_ranks_samples_per_s": steps * batch / s2}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", action="store_true", help="16 sequences, 2 repeats; 60 training steps")
    p.add_argument("--model", default="natural256")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    n, rep, steps = (16, 2, 60) if a.short else (64, 3, 200)
    e = extraction(a.model, n, rep)
    r = ranks(steps, 64, 128)
    ratio = (e["generate_s"] + e["extract_s"]) / e["generate_s"]
    speed = r["two_ranks_samples_per_s"] / r["one_process_samples_per_s"]
    print(f"{a.model}: {n} sequences x {e['tokens']} tokens: generate {e['generate_s']:.2f} s, extract "
          f"{e['extract_s']:.2f} s -> (generate + extract) / generate = {ratio:.3f} (goal <= 1.2)")
    print(f"training, llamagen-tiny: 1 process {r['one_process_samples_per_s']:.1f} samples/s, 2 ranks "
          f"{r['two_ranks_samples_per_s']:.1f} -> {speed:.2f}x (goal >= 1.6)")
    write_ratios(a.json, {
        "train_drafter_extract_over_generate": {"value": ratio, "better": "lower",
                                                "what": "(AR generation + feature extraction) / AR generation"},
        "train_drafter_two_ranks_speedup": {"value": speed, "better": "higher",
                                            "what": "training samples/s, torchrun 2 ranks / 1 process"}},
        extra={"extraction": e, "ranks": r})


if __name__ == "__main__":
    main()
