"""Engine speed at batch 1 on the setting of the LANTERN comparison: a tiny random LlamaGen c2i target (dim 256,
6 layers, V = 1024, 16 x 16 tokens, CFG 3) with a random EAGLE-1 drafter, temperature 1 and greedy, chain drafts
(L = 4) and EAGLE-1's 25-node tree: tokens/s and tokens per target call of the engine, its time split (draft,
target, verify, the rest), against plain AR in the same run. ``--target B`` uses a LlamaGen-B-sized target
(dim 768, 12 layers, V = 16384) instead. ``--compile`` adds the same runs with the decoder blocks compiled
(``real.nn.blocks.compile_blocks``; compilation is done in a warm-up outside the timing). ``--profile`` adds, for
one tree image at temperature 1, the torch profiler's top operators and a per-function breakdown of the round
(cProfile, cumulative seconds of the engine's own functions: draft levels, target forward, mask construction
in ``KVCache.begin``, cache compaction in ``KVCache.keep``, ``verify_tree``, host syncs).

Random weights: the drafter rarely agrees with the target, so tokens per call are low; the figures measure the
engine's cost per round, not acceptance.

  python benchmarks/bench_engine.py [--images 8] [--threads 1] [--target tiny|B] [--compile] [--profile]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from real.decode import engine
from real.models import llamagen as lg  # noqa: E402
from real.nn.blocks import compile_blocks  # noqa: E402
from real.models.eagle import EagleDrafter  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from theory import rules  # noqa: E402
from theory.tree import EAGLE_25, Tree  # noqa: E402


def _row(name: str, s: dict) -> str:
    other = s["seconds"] - s["time_draft_s"] - s["time_target_s"] - s["time_verify_s"]
    return (f"{name:32s} {s['tokens_per_second']:9.1f} {s['tokens_per_target_call']:8.2f} "
            + " ".join(f"{100 * x / s['seconds']:6.1f}%" for x in (s["time_draft_s"], s["time_target_s"],
                                                                   s["time_verify_s"], other)))


def _measure(t, d, conds, T: int, label: str) -> None:
    for temp in (1.0, 0.0):
        proc = Processing(temperature=temp, cfg_scale=3.0)
        v = rules.greedy() if temp == 0 else rules.vanilla()
        engine.generate(t, None, conds[:1], num_tokens=16, processing=proc, batch_size=1)           # warm-up
        ar = engine.summarize(engine.generate(t, None, conds, num_tokens=T, processing=proc, batch_size=1))
        print(f"{label + 'plain AR t=' + str(temp):32s} {ar['tokens_per_second']:9.1f} {1.0:8.2f}")
        for name, kw in (("chain L=4", dict(drafting=4)), ("tree eagle25", dict(drafting=Tree(EAGLE_25)))):
            engine.generate(t, d, conds[:1], num_tokens=T, verifier=v, processing=proc, batch_size=1, **kw)  # warm-up
            s = engine.summarize(engine.generate(t, d, conds, num_tokens=T, verifier=v, processing=proc,
                                                 batch_size=1, **kw))
            print(_row(f"{label}{name} t={temp}", s))


def _profile(t, d, conds, T: int) -> None:
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    proc = Processing(temperature=1.0, cfg_scale=3.0)
    kw = dict(num_tokens=T, verifier=rules.vanilla(), tree=Tree(EAGLE_25), processing=proc, batch_size=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.generate(t, d, conds[:1], **kw)
    print(f"\none tree image under the torch profiler ({time.perf_counter() - t0:.2f} s):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    gens = engine.generate(t, d, conds[:1], **kw)
    pr.disable()
    wall = time.perf_counter() - t0
    rounds = len(gens[0].rounds)
    st = pstats.Stats(pr)
    print(f"one tree image under cProfile ({wall:.2f} s, {rounds} rounds; cumulative s and ms per round of the "
          "engine's functions):")
    want = ("steps.py", "kvcache.py", "verify.py", "tree.py", "engine.py", "llamagen.py", "eagle.py", "blocks.py",
            "sampling.py")
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, callers) in st.stats.items():
        if file.endswith(want) and not fn.startswith("<"):
            rows.append((ct, tt, nc, f"{os.path.basename(file)}:{fn}"))
    for ct, tt, nc, name in sorted(rows, reverse=True)[:22]:
        print(f"  {name:38s} {ct:7.3f} s  {1e3 * ct / rounds:7.2f} ms/round  (self {tt:6.3f} s, {nc} calls)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also measure with real.nn.blocks.compile_blocks")
    ap.add_argument("--target", choices=["tiny", "B"], default="tiny")
    a = ap.parse_args(argv)
    if a.images < 1 or a.threads < 1:
        ap.error("--images and --threads must be >= 1")
    torch.set_num_threads(a.threads)
    if a.target == "tiny":
        c = lg.config("tiny", dim=256, n_layer=6, n_head=4, vocab_size=1024, block_size=256, num_classes=10)
        desc = "tiny LlamaGen c2i (dim 256, 6 layers, V 1024"
    else:
        c = lg.config("B", num_classes=10)
        desc = f"LlamaGen-B-sized c2i (dim {c.dim}, {c.n_layer} layers, V {c.vocab_size}"
    t = lg.LlamaGen(c).random_init(0, std=0.05, output_std=0.2, embed_std=1.0).eval()
    d = EagleDrafter.from_target(t, seed=1).eval()
    conds = [i % 10 for i in range(a.images)]
    T = c.block_size
    print(f"{desc}, {T} tokens), random EAGLE-1 drafter, CFG 3, {a.images} images, batch 1, {a.threads} thread(s)")
    print(f"{'run':32s} {'tokens/s':>9s} {'tok/call':>8s} {'draft':>7s} {'target':>7s} {'verify':>7s} {'other':>7s}")
    _measure(t, d, conds, T, "")
    if a.compile:
        compile_blocks(t)
        compile_blocks(d)
        t0 = time.perf_counter()
        for temp in (1.0, 0.0):          # compile every shape class outside the timing
            proc = Processing(temperature=temp, cfg_scale=3.0)
            for kw in (dict(drafting=4), dict(drafting=Tree(EAGLE_25))):
                engine.generate(t, d, conds[:1], num_tokens=T, verifier=rules.vanilla() if temp else rules.greedy(),
                                processing=proc, batch_size=1, **kw)
            engine.generate(t, None, conds[:1], num_tokens=16, processing=proc, batch_size=1)
        print(f"(compilation and warm-up {time.perf_counter() - t0:.0f} s)")
        _measure(t, d, conds, T, "compiled ")
        compile_blocks(t, enabled=False)
        compile_blocks(d, enabled=False)
    if a.profile:
        _profile(t, d, conds, T)


if __name__ == "__main__":
    main()
