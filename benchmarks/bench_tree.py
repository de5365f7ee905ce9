"""Chain vs static-tree drafting in the real engine, same models, same run.

Part 1: the tiny random LlamaGen pair of ``coolsd generate --model llamagen-tiny`` (CFG 2, temperature 1,
64 tokens per image, the draft given by --draft), for vanilla and Cool-SD (delta = 2, nu = 0.7):
tokens per target call (with its SE over rounds), draft forwards per token, wall time and the
verifier's share, for chains of L = 4 and 5 drafts, the 5-chain run by the tree engine (isolates the
engine's conventions: its first round is the prefill alone), and the EAGLE-1 trees of 25 and 57 nodes
(depth 5). Ratios are against the L = 4 chain measured in the same run. Random tiny models say
nothing about real acceptance rates; the MNIST zoo / LlamaGen checkpoints give the real comparison.

Part 2: cost of one verification call on torch CPU: ``theory.tree.verify_tree`` (25 and 57 nodes) vs
``theory.rules.chain.verify_chain`` (L = 5), at V = 256 and V = 16384 (LlamaGen's codebook), median of
--repeats calls.

  python benchmarks/bench_tree.py [--images 8] [--draft layerskip] [--repeats 20] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _timing import median_time  # noqa: E402  (benchmarks/_timing.py)

import torch  # noqa: E402

from real.decode import engine  # noqa: E402
from real.registry import tiny_llamagen_pair  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from theory import rules  # noqa: E402
from theory.tree import EAGLE_25, EAGLE_57, Tree, chain_tree, verify_tree  # noqa: E402
from theory.rules.chain import verify_chain  # noqa: E402


def part1(images: int, draft: str) -> None:
    t, d = tiny_llamagen_pair(seed=0, draft=draft)
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    shapes = [("chain L=4", dict(drafting=4)), ("chain L=5", dict(drafting=5)), ("chain-5 as tree", dict(drafting=chain_tree(5))),
              ("EAGLE tree 25", dict(drafting=Tree(EAGLE_25))), ("EAGLE tree 57", dict(drafting=Tree(EAGLE_57)))]
    print(f"Part 1: llamagen-tiny ({draft} draft), CFG 2, temperature 1, {images} images x 64 tokens")
    print(f"{'method':9s} {'drafting':16s} {'tokens/call':>14s} {'x chain4':>8s} {'draft fwd/tok':>13s} "
          f"{'seconds':>8s} {'x chain4':>8s} {'verify %':>8s}")
    for v in (rules.vanilla(), rules.cool_sd(2.0, 0.7)):
        engine.speculative_generate(t, d, 0, num_tokens=8, verifier=v, drafting=4, processing=proc)   # warm-up
        base = None
        for name, kw in shapes:
            gens = [engine.speculative_generate(t, d, c % 10, num_tokens=64, verifier=v, processing=proc, seed=c, **kw)
                    for c in range(images)]
            s = engine.summarize(gens)
            if base is None:
                base = s
            print(f"{v.name:9s} {name:16s} {s['tokens_per_target_call']:7.3f} +- {s['tokens_per_target_call_se']:.3f} "
                  f"{s['tokens_per_target_call'] / base['tokens_per_target_call']:8.2f} "
                  f"{s['draft_forwards'] / s['tokens']:13.2f} {s['seconds']:8.2f} {s['seconds'] / base['seconds']:8.2f} "
                  f"{100 * s['verify_share']:8.1f}")


def part2(repeats: int) -> None:
    print(f"\nPart 2: one verification call, torch CPU float32, median of {repeats} (ms)")
    print(f"{'V':>6s} {'chain L=5':>10s} {'tree 25':>10s} {'x chain':>8s} {'tree 57':>10s} {'x chain':>8s}")
    g = torch.Generator().manual_seed(0)
    v = rules.vanilla()
    for V in (256, 16384):
        def rows(n):
            return torch.softmax(torch.randn(1, n, V, generator=g) * 2, -1)

        L = 5
        p, q = rows(L + 1), rows(L)
        tok = torch.randint(0, V, (1, L), generator=g)
        chain = 1e3 * median_time(lambda: verify_chain(p, q, tok, torch.rand(1, L), torch.rand(1), v), repeats)
        out = [f"{V:6d} {chain:10.2f}"]
        for paths in (EAGLE_25, EAGLE_57):
            tree = Tree(paths)
            N = tree.n_nodes
            pt, qt = rows(N + 1), rows(N + 1)
            tt = torch.randint(0, V, (1, N + 1), generator=g)
            ms = 1e3 * median_time(lambda: verify_tree(pt, qt, tt, torch.rand(1, N + 1), torch.rand(1), tree, v), repeats)
            out.append(f"{ms:10.2f} {ms / chain:8.1f}")
        print(" ".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--draft", default="layerskip", choices=["layerskip", "small", "eagle"])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    part1(a.images, a.draft)
    part2(a.repeats)


if __name__ == "__main__":
    main()
