"""Our speculative engine vs transformers' assisted generation, same models, same run; and the
verifier's share of a round on the tiny LlamaGen config.

Part 1: a random LlamaForCausalLM target (hidden 128, 4 layers, V = 256) and its layer-skip draft (its
first layer, embeddings and head), CPU, greedy (lossless on both sides, so tokens per target call are
comparable), L = num_assistant_tokens = 4 with the constant schedule and no confidence-based early stop.
Our engine runs the pair twice: through the generic adapter ``real.adapters.hf.HFCausalLM`` (every forward is
the transformers forward, so the ratio there is the engine's own overhead vs assisted generation's,
bounded by the share of assisted generation's time spent outside model forwards, printed), and through
``real.models.llama.FastLlama`` loaded from the same two models (static-cache forward through LlamaGen's CPU
fast paths, same weights, logits equal up to float rounding). All outputs are checked equal to plain greedy decoding; target forward calls
are counted on the models; each time is the fastest of --repeats interleaved runs (the three contenders in turn)
after a warm-up, in CPU time of this thread at one thread (``time.thread_time``: at one torch thread the forwards run
on the calling thread, within 1% of wall time on an idle core, and the time slices other processes take on a shared
machine do not count; wall time at more threads); the JSON of ``--json`` holds these ratios.

Part 2: on the tiny LlamaGen pair of ``coolsd generate --model llamagen-tiny`` (CFG 2, temperature 1),
the verifier's share of the round time (draft + target + verify), per method.

  python benchmarks/bench_engine_vs_hf.py [--tokens 256] [--repeats 5] [--threads 1]
  python benchmarks/bench_engine_vs_hf.py --short --json out.json    # part 1 only, ratios to JSON (run_all.py)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not

from _timing import interleaved_best, single_thread_clock, write_ratios  # noqa: E402  (benchmarks/_timing.py)

import torch  # noqa: E402

from real.decode import engine  # noqa: E402
from real.adapters.hf import HFCausalLM  # noqa: E402
from real.protocol import Prompt  # noqa: E402
from real.adapters.hf import hf_llama_pair  # noqa: E402
from real.registry import tiny_llamagen_pair  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from theory import rules  # noqa: E402


class Counter:
    """Counts forward calls of a module and the wall time spent inside them."""

    def __init__(self, model):
        self.n, self.t, self._t0 = 0, 0.0, 0.0
        model.register_forward_pre_hook(self.pre)
        model.register_forward_hook(self.post)

    def pre(self, *a):
        self._t0 = time.perf_counter()

    def post(self, *a):
        self.n += 1
        self.t += time.perf_counter() - self._t0

    def reset(self):
        self.n, self.t = 0, 0.0


def part1(args):
    tgt, drf = hf_llama_pair(seed=0)
    for m in (tgt, drf):
        gc = m.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = args.L, "constant", 0.0
    calls, dcalls = Counter(tgt), Counter(drf)
    prompt = torch.randint(0, tgt.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    N = args.tokens

    with torch.no_grad():
        ref = tgt.generate(prompt, max_new_tokens=N, min_new_tokens=N, do_sample=False)[0, 8:]

    def hf():
        calls.reset(), dcalls.reset()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = tgt.generate(prompt, assistant_model=drf, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                               num_assistant_tokens=args.L, num_assistant_tokens_schedule="constant",
                               assistant_confidence_threshold=0.0)[0, 8:]
        return out, calls.n, (calls.t + dcalls.t) / (time.perf_counter() - t0)

    greedy = Processing(temperature=0.0)

    def ours(T, D, fast):
        def run():
            calls.reset(), dcalls.reset()
            g = engine.speculative_generate(T, D, Prompt(prompt[0]), num_tokens=N, verifier=rules.greedy(), drafting=args.L,
                                            processing=greedy)
            return g.tokens, (g.target_forwards if fast else calls.n), None
        return run

    from real.models.llama import FastLlama

    shares = []

    def hf_logged():
        out = hf()
        shares.append(out[2])
        return out

    fns = {"hf": hf_logged, "adapter": ours(HFCausalLM(tgt), HFCausalLM(drf), False),
           "fast": ours(FastLlama.from_hf(tgt), FastLlama.from_hf(drf), True)}
    (tok_hf, n_hf, _), (tok_ad, n_ad, _), (tok_fa, n_fa, _) = [fn() for fn in fns.values()]     # warm-up, outputs
    clock = single_thread_clock()
    best = interleaved_best(fns, args.repeats, clock=clock)
    t_hf, t_ad, t_fa = best["hf"], best["adapter"], best["fast"]
    share = statistics.median(shares)
    for name, tok in (("assisted generation", tok_hf), ("engine + real.adapters.hf", tok_ad), ("engine + FastLlama", tok_fa)):
        assert torch.equal(tok, ref), f"{name}: output differs from greedy decoding"
    print(f"Part 1: {N} new tokens, greedy, L = num_assistant_tokens = {args.L}, CPU ({torch.get_num_threads()} thread(s)), "
          f"fastest of {args.repeats} in {'thread CPU' if clock is time.thread_time else 'wall'} time")
    print(f"  {'':42s} {'tokens/s':>10s} {'tokens/target call':>20s} {'target calls':>13s} {'vs transformers':>16s}")
    for name, t, n in (("transformers assisted generation", t_hf, n_hf),
                       ("coolsd engine, real.adapters.hf adapter", t_ad, n_ad),
                       ("coolsd engine, real.models.llama.FastLlama", t_fa, n_fa)):
        print(f"  {name:42s} {N / t:10.1f} {N / n:20.3f} {n:13d} {t_hf / t:15.2f}x")
    print(f"  all outputs identical to greedy decoding. Assisted generation spends {100 * share:.0f}% of its time in the "
          f"two models' forwards, so an engine calling the same transformers forwards is at most {1 / share:.2f}x faster")
    return {"engine_fastllama_over_hf_assisted": {"value": t_hf / t_fa, "better": "higher",
                                                  "what": f"engine + FastLlama / transformers assisted, {N} tokens, CPU time"},
            "engine_hf_adapter_over_hf_assisted": {"value": t_hf / t_ad, "better": "higher",
                                                   "what": f"engine + real.adapters.hf / transformers assisted, {N} tokens, CPU time"}}


def part2(args):
    from real.decode.methods import make_verifier
    from real.models.vq import VQModel, vq_config

    t, d = tiny_llamagen_pair(seed=0)
    vq = VQModel(vq_config("tiny", codebook_size=t.vocab_size)).random_init(0)
    nb = rules.lantern_neighbors(vq.quantize.codebook().detach().numpy())
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    print(f"Part 2: verifier share of a round, tiny LlamaGen (4 layers, dim 128, V = 256, 64 tokens), CFG 2, L = {args.L}, "
          f"{args.images} images per method")
    print(f"  {'method':12s} {'round ms':>9s} {'draft ms':>9s} {'target ms':>10s} {'verify ms':>10s} {'verify share':>13s}")
    for m in ("vanilla", "cool-sd", "lantern", "typical"):
        v = make_verifier(m, args.L, None, nb)
        engine.speculative_generate(t, d, 0, num_tokens=64, verifier=v, drafting=args.L, processing=proc)   # warm-up
        s = engine.summarize([engine.speculative_generate(t, d, i, num_tokens=64, verifier=v, drafting=args.L,
                                                          processing=proc, seed=i) for i in range(args.images)])
        R = s["rounds"]
        tot = s["time_draft_s"] + s["time_target_s"] + s["time_verify_s"]
        print(f"  {m:12s} {1e3 * tot / R:9.3f} {1e3 * s['time_draft_s'] / R:9.3f} {1e3 * s['time_target_s'] / R:10.3f} "
              f"{1e3 * s['time_verify_s'] / R:10.3f} {100 * s['verify_share']:12.1f}%")


def part3(args):
    """The same share at the real vocabulary: a LlamaGen-B-sized target (random weights, V = 16384) and
    its first layer as the draft, on CPU, a few rounds."""
    from real.models import llamagen as lg

    t = lg.LlamaGen(lg.config("B", image_size=256)).random_init(0, std=0.02, output_std=0.1, embed_std=1.0).eval()
    d = lg.truncated(t, 1)
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    v = rules.vanilla()
    engine.speculative_generate(t, d, 0, num_tokens=6, verifier=v, drafting=args.L, processing=proc)   # warm-up
    s = engine.summarize([engine.speculative_generate(t, d, 1, num_tokens=args.big_tokens, verifier=v, drafting=args.L,
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
    ap.add_argument("--short", action="store_true", help="part 1 only")
    ap.add_argument("--json", default=None, help="write part 1's ratios to this JSON file (for run_all.py)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    write_ratios(args.json, part1(args))
    if args.short:
        return
    part2(args)
    if args.big_tokens:
        part3(args)


if __name__ == "__main__":
    main()
