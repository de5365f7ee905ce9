"""Engine speed at batch 1 on the setting of the LANTERN comparison: a tiny random LlamaGen c2i target (dim 256,
6 layers, V = 1024, 16 x 16 tokens, CFG 3) with a random EAGLE-1 drafter, temperature 1 and greedy, chain drafts
(L = 4) and EAGLE-1's 25-node tree: tokens/s and tokens per target call of the engine, its time split (draft,
target, verify, the rest), against plain AR in the same run. ``--profile`` adds the torch profiler's top
operators of one tree image.

Random weights: the drafter rarely agrees with the target, so tokens per call are low; the figures measure the
engine's cost per round, not acceptance.

  python benchmarks/bench_engine.py [--images 8] [--threads 1] [--profile]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from real import engine, llamagen as lg  # noqa: E402
from real.eagle import EagleDrafter  # noqa: E402
from real.sampling import Processing  # noqa: E402
from theory import rules  # noqa: E402
from theory.tree import EAGLE_25, Tree  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    c = lg.config("tiny", dim=256, n_layer=6, n_head=4, vocab_size=1024, block_size=256, num_classes=10)
    t = lg.LlamaGen(c).random_init(0, std=0.05, output_std=0.2, embed_std=1.0).eval()
    d = EagleDrafter.from_target(t, seed=1).eval()
    conds = [i % 10 for i in range(a.images)]
    T = c.block_size
    print(f"tiny LlamaGen c2i (dim 256, 6 layers, V 1024, {T} tokens), random EAGLE-1 drafter, CFG 3, "
          f"{a.images} images, batch 1, {a.threads} thread(s)")
    print(f"{'run':24s} {'tokens/s':>9s} {'tok/call':>8s} {'draft':>7s} {'target':>7s} {'verify':>7s} {'other':>7s}")
    for temp in (1.0, 0.0):
        proc = Processing(temperature=temp, cfg_scale=3.0)
        v = rules.greedy() if temp == 0 else rules.vanilla()
        ar = engine.summarize(engine.generate(t, None, conds, num_tokens=T, processing=proc, batch_size=1))
        print(f"{'plain AR t=' + str(temp):24s} {ar['tokens_per_second']:9.1f} {1.0:8.2f}")
        for name, kw in (("chain L=4", dict(L=4)), ("tree eagle25", dict(tree=Tree(EAGLE_25)))):
            engine.generate(t, d, conds[:1], num_tokens=16, verifier=v, processing=proc, batch_size=1, **kw)  # warm-up
            s = engine.summarize(engine.generate(t, d, conds, num_tokens=T, verifier=v, processing=proc,
                                                 batch_size=1, **kw))
            other = s["seconds"] - s["time_draft_s"] - s["time_target_s"] - s["time_verify_s"]
            print(f"{name + ' t=' + str(temp):24s} {s['tokens_per_second']:9.1f} {s['tokens_per_target_call']:8.2f} "
                  + " ".join(f"{100 * x / s['seconds']:6.1f}%" for x in (s["time_draft_s"], s["time_target_s"],
                                                                         s["time_verify_s"], other)))
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        proc = Processing(temperature=1.0, cfg_scale=3.0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            engine.generate(t, d, conds[:1], num_tokens=T, verifier=rules.vanilla(), tree=Tree(EAGLE_25),
                            processing=proc, batch_size=1)
        print(f"\none tree image under the profiler ({time.perf_counter() - t0:.2f} s):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
