"""Profile of the engine with ``real.models.llama.FastLlama`` on the setting of bench_engine_vs_hf.py part 1
(random tiny Llama target, 4 layers, hidden 128, V = 256, its first layer as the draft, greedy, L = 4, 256
tokens, one thread): tokens/s, the share of time inside the two models' forwards, and cProfile's top
functions by own time. benchmarks/results/fastllama_profile_{before,after}.txt are its output (issue 30).

  python benchmarks/profile_fastllama.py [--tokens 256]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _timing import profile_text  # noqa: E402  (benchmarks/_timing.py)

import torch  # noqa: E402

from real.decode import engine  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.models.llama import FastLlama  # noqa: E402
from real.protocol import Prompt  # noqa: E402
from real.adapters.hf import hf_llama_pair  # noqa: E402
from theory import rules  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    tgt, drf = hf_llama_pair(seed=0)
    prompt = torch.randint(0, tgt.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    T, D = FastLlama.from_hf(tgt), FastLlama.from_hf(drf)
    inside = [0.0]

    def timed(m):
        fwd = m.forward

        def f(*a, **k):
            t0 = time.perf_counter()
            out = fwd(*a, **k)
            inside[0] += time.perf_counter() - t0
            return out
        return f

    def run():
        return engine.speculative_generate(T, D, Prompt(prompt[0]), num_tokens=args.tokens, verifier=rules.greedy(),
                                           drafting=4, processing=Processing(temperature=0.0))
    run()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        g = run()
        ts.append(time.perf_counter() - t0)
    T.forward, D.forward = timed(T), timed(D)
    inside[0] = 0.0
    t0 = time.perf_counter()
    run()
    share = inside[0] / (time.perf_counter() - t0)
    del T.forward, D.forward
    t = statistics.median(ts)
    print(f"engine + FastLlama at {commit}: {args.tokens} tokens, greedy, L = 4, 1 thread: {args.tokens / t:.1f} tokens/s "
          f"(median of 5), {len(g.rounds)} rounds, {100 * share:.0f}% of the time inside the models' forward calls")
    print("cProfile of one generation, by own time:")
    print(profile_text(run, 30))


if __name__ == "__main__":
    main()
