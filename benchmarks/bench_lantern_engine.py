"""LANTERN(++) in the engine at LlamaGen-like shapes (issue 55): a tiny random LlamaGen c2i target (dim 256, 6
layers, V = 1,024 codes, 256 tokens per image, CFG 3, temperature 1) with a layer-skip draft (its first 2 layers),
the release's k = 1,000 neighbours of a random codebook. For the EAGLE-1 25-node static tree and a chain of 4:
tokens per second, tokens per target call and the verifier's share of the wall (``real.decode.engine.summarize``),
vanilla / Cool-SD (delta = 2) / LANTERN++ (lambda = 2) / LANTERN (delta = 0.1). Goals: LANTERN++'s verify share on
the tree at most 0.15, and its tokens per second within 10% of Cool-SD's at equal tokens per call (reported as
tokens/s per token-per-call, a same-run ratio).

  python benchmarks/bench_lantern_engine.py [--short] [--images 4] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _timing import write_ratios  # noqa: E402

import torch  # noqa: E402

from real.decode import engine  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.models import llamagen as lg  # noqa: E402
from theory import rules  # noqa: E402
from theory.tree import EAGLE_25, Tree  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", action="store_true", help="2 images")
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    n = a.images or (2 if a.short else 4)
    V, T, k = 1024, 256, 1000
    cfg = lg.config("tiny", dim=256, n_layer=6, n_head=8, vocab_size=V, block_size=T)
    t = lg.LlamaGen(cfg).random_init(0, std=0.05, output_std=0.2, embed_std=1.0).eval()
    d = lg.truncated(t, 2)
    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(V, 8)), k + 1)
    proc = Processing(temperature=1.0, cfg_scale=3.0)
    verifiers = {"vanilla": rules.vanilla(), "cool-sd": rules.cool_sd(2.0), "lantern++": rules.lantern_pp(nb, k, 2.0),
                 "lantern": rules.lantern(nb, k, 0.1)}
    out, ratios = {}, {}
    for shape, drafting in (("tree25", Tree(EAGLE_25)), ("chain4", 4)):
        engine.speculative_generate(t, d, 0, num_tokens=8, verifier=verifiers["vanilla"], drafting=drafting,
                                    processing=proc)                                              # warm-up
        for name, v in verifiers.items():
            gens = [engine.speculative_generate(t, d, c % 10, num_tokens=T, verifier=v, drafting=drafting,
                                                processing=proc, seed=c) for c in range(n)]
            s = engine.summarize(gens)
            tps = s["tokens"] / s["seconds"]
            out[(shape, name)] = (tps, s["tokens_per_target_call"], s["verify_share"])
            print(f"{shape:7s} {name:10s} {tps:8.1f} tokens/s  {s['tokens_per_target_call']:5.2f} per call  "
                  f"verify share {s['verify_share']:.3f}", flush=True)
        eff = {m: out[(shape, m)][0] / out[(shape, m)][1] for m in verifiers}
        ratios[f"lantern++_verify_share_{shape}"] = {
            "value": out[(shape, "lantern++")][2], "better": "lower",
            "what": f"LANTERN++ (k = {k}) verify share of the wall, {shape}, V = {V}, {T} tokens"}
        ratios[f"lantern++_over_cool-sd_per_call_{shape}"] = {
            "value": eff["lantern++"] / eff["cool-sd"], "better": "higher",
            "what": f"(tokens/s / tokens per call), LANTERN++ / Cool-SD, {shape}, V = {V}"}
    share = out[("tree25", "lantern++")][2]
    rel = ratios["lantern++_over_cool-sd_per_call_tree25"]["value"]
    print(f"LANTERN++ on the 25-node tree: verify share {share:.3f} (goal <= 0.15: {'met' if share <= 0.15 else 'NOT met'});"
          f" tokens/s per token-per-call vs Cool-SD {rel:.2f} (goal >= 0.90: {'met' if rel >= 0.9 else 'NOT met'})")
    write_ratios(a.json, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
