"""Our speculative engine vs transformers' assisted generation, same models, same run; and the
verifier's share of a round on the tiny LlamaGen config.

Part 1: a random LlamaForCausalLM target (hidden 128, 4 layers, V = 256) and its layer-skip draft (its
first layer, embeddings and head), CPU, greedy (lossless on both sides, so tokens per target call are
comparable), L = num_assistant_tokens = 4 with the constant schedule and no confidence-based early stop.
Both outputs are checked equal to plain greedy decoding; target forward calls are counted with a
forward hook on the target model; times are medians over --repeats runs after a warm-up.

Part 2: on the tiny LlamaGen pair of ``coolsd generate --model llamagen-tiny`` (CFG 2, temperature 1),
the verifier's share of the round time (draft + target + verify), per method.

  python benchmarks/bench_engine_vs_hf.py [--tokens 256] [--repeats 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from real import engine  # noqa: E402
from real.hf import HFCausalLM  # noqa: E402
from real.protocol import Prompt  # noqa: E402
from real.registry import hf_llama_pair, tiny_llamagen_pair  # noqa: E402
from real.sampling import Processing  # noqa: E402
from theory import rules  # noqa: E402


class Counter:
    def __init__(self, model):
        self.n = 0
        model.register_forward_hook(self)

    def __call__(self, *a):
        self.n += 1


def median_time(fn, repeats):
    fn()  # warm-up
    ts, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def part1(args):
    tgt, drf = hf_llama_pair(seed=0)
    for m in (tgt, drf):
        gc = m.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = args.L, "constant", 0.0
    calls = Counter(tgt)
    prompt = torch.randint(0, tgt.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    N = args.tokens

    with torch.no_grad():
        ref = tgt.generate(prompt, max_new_tokens=N, min_new_tokens=N, do_sample=False)[0, 8:]

    def hf():
        calls.n = 0
        with torch.no_grad():
            out = tgt.generate(prompt, assistant_model=drf, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                               num_assistant_tokens=args.L, num_assistant_tokens_schedule="constant",
                               assistant_confidence_threshold=0.0)[0, 8:]
        return out, calls.n

    T, D = HFCausalLM(tgt), HFCausalLM(drf)
    greedy = Processing(temperature=0.0)

    def ours():
        calls.n = 0
        g = engine.speculative_generate(T, D, Prompt(prompt[0]), num_tokens=N, verifier=rules.greedy(), L=args.L,
                                        processing=greedy)
        return g.tokens, calls.n

    t_hf, (tok_hf, n_hf) = median_time(hf, args.repeats)
    t_us, (tok_us, n_us) = median_time(ours, args.repeats)
    assert torch.equal(tok_us, ref), "engine output differs from greedy decoding"
    assert torch.equal(tok_hf, ref), "assisted generation output differs from greedy decoding"
    print(f"Part 1: {N} new tokens, greedy, L = num_assistant_tokens = {args.L}, CPU ({torch.get_num_threads()} thread(s))")
    print(f"  {'':28s} {'tokens/s':>10s} {'tokens/target call':>20s} {'target calls':>13s}")
    print(f"  {'transformers assisted gen.':28s} {N / t_hf:10.1f} {N / n_hf:20.3f} {n_hf:13d}")
    print(f"  {'coolsd engine (real.hf)':28s} {N / t_us:10.1f} {N / n_us:20.3f} {n_us:13d}")
    print(f"  ratio (ours / transformers): {t_hf / t_us:.2f}x tokens per second; outputs identical to greedy: yes")
    return t_hf / t_us


def part2(args):
    from real.methods import MethodParams, make_verifier
    from real.vq import VQModel, vq_config

    t, d = tiny_llamagen_pair(seed=0)
    vq = VQModel(vq_config("tiny", codebook_size=t.vocab_size)).random_init(0)
    nb = rules.lantern_neighbors(vq.quantize.codebook().detach().numpy())
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    print(f"Part 2: verifier share of a round, tiny LlamaGen (4 layers, dim 128, V = 256, 64 tokens), CFG 2, L = {args.L}, "
          f"{args.images} images per method")
    print(f"  {'method':12s} {'round ms':>9s} {'draft ms':>9s} {'target ms':>10s} {'verify ms':>10s} {'verify share':>13s}")
    for m in ("vanilla", "cool-sd", "lantern", "typical"):
        v = make_verifier(m, args.L, MethodParams(), nb)
        engine.speculative_generate(t, d, 0, num_tokens=64, verifier=v, L=args.L, processing=proc)   # warm-up
        s = engine.summarize([engine.speculative_generate(t, d, i, num_tokens=64, verifier=v, L=args.L,
                                                          processing=proc, seed=i) for i in range(args.images)])
        R = s["rounds"]
        tot = s["time_draft_s"] + s["time_target_s"] + s["time_verify_s"]
        print(f"  {m:12s} {1e3 * tot / R:9.3f} {1e3 * s['time_draft_s'] / R:9.3f} {1e3 * s['time_target_s'] / R:10.3f} "
              f"{1e3 * s['time_verify_s'] / R:10.3f} {100 * s['verify_share']:12.1f}%")


def part3(args):
    """The same share at the real vocabulary: a LlamaGen-B-sized target (random weights, V = 16384) and
    its first layer as the draft, on CPU, a few rounds."""
    from real import llamagen as lg

    t = lg.LlamaGen(lg.config("B", image_size=256)).random_init(0, std=0.02, output_std=0.1, embed_std=1.0).eval()
    d = lg.truncated(t, 1)
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    v = rules.vanilla()
    engine.speculative_generate(t, d, 0, num_tokens=6, verifier=v, L=args.L, processing=proc)   # warm-up
    s = engine.summarize([engine.speculative_generate(t, d, 1, num_tokens=args.big_tokens, verifier=v, L=args.L,
                                                      processing=proc)])
    R = s["rounds"]
    print(f"Part 3: LlamaGen-B-sized target (random, V = 16384) + 1-layer draft, CPU, vanilla, {R} rounds: round "
          f"{1e3 * (s['time_draft_s'] + s['time_target_s'] + s['time_verify_s']) / R:.1f} ms, verify "
          f"{1e3 * s['time_verify_s'] / R:.2f} ms, verify share {100 * s['verify_share']:.2f}%")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--big-tokens", type=int, default=40, help="tokens for part 3 (0 skips it)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for both sides (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    part1(args)
    part2(args)
    if args.big_tokens:
        part3(args)


if __name__ == "__main__":
    main()
