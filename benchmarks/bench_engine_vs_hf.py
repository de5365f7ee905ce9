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
are counted on the models; times are medians over --repeats interleaved runs after a warm-up, the ratio
printed both from wall time and from the process's CPU time (steadier on a shared machine; the JSON of
``--json`` holds the CPU-time ratios).

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

from _timing import write_ratios  # noqa: E402  (benchmarks/_timing.py)

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


def interleaved_medians(fns, repeats):
    """Median wall time and median CPU time (this process: on a shared machine the time slices other
    processes take do not count) of each function, runs interleaved round-robin (so load changes hit every
    contender alike), after one warm-up each; also each function's last output."""
    outs = [fn() for fn in fns]
    ts = [[] for _ in fns]
    cs = [[] for _ in fns]
    for _ in range(repeats):
        for j, fn in enumerate(fns):
            t0, c0 = time.perf_counter(), time.process_time()
            outs[j] = fn()
            ts[j].append(time.perf_counter() - t0)
            cs[j].append(time.process_time() - c0)
    return [statistics.median(t) for t in ts], [statistics.median(c) for c in cs], outs


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
            g = engine.speculative_generate(T, D, Prompt(prompt[0]), num_tokens=N, verifier=rules.greedy(), L=args.L,
                                            processing=greedy)
            return g.tokens, (g.target_forwards if fast else calls.n), None
        return run

    from real.models.llama import FastLlama

    shares = []

    def hf_logged():
        out = hf()
        shares.append(out[2])
        return out

    (t_hf, t_ad, t_fa), (c_hf, c_ad, c_fa), ((tok_hf, n_hf, _), (tok_ad, n_ad, _), (tok_fa, n_fa, _)) = interleaved_medians(
        [hf_logged, ours(HFCausalLM(tgt), HFCausalLM(drf), False), ours(FastLlama.from_hf(tgt), FastLlama.from_hf(drf), True)],
        args.repeats)
    share = statistics.median(shares)
    for name, tok in (("assisted generation", tok_hf), ("engine + real.adapters.hf", tok_ad), ("engine + FastLlama", tok_fa)):
        assert torch.equal(tok, ref), f"{name}: output differs from greedy decoding"
    print(f"Part 1: {N} new tokens, greedy, L = num_assistant_tokens = {args.L}, CPU ({torch.get_num_threads()} thread(s))")
    print(f"  {'':42s} {'tokens/s':>10s} {'tokens/target call':>20s} {'target calls':>13s} {'vs transformers':>16s} "
          f"{'(CPU time)':>11s}")
    for name, t, c, n in (("transformers assisted generation", t_hf, c_hf, n_hf),
                          ("coolsd engine, real.adapters.hf adapter", t_ad, c_ad, n_ad),
                          ("coolsd engine, real.models.llama.FastLlama", t_fa, c_fa, n_fa)):
        print(f"  {name:42s} {N / t:10.1f} {N / n:20.3f} {n:13d} {t_hf / t:15.2f}x {c_hf / c:10.2f}x")
    print(f"  all outputs identical to greedy decoding. Assisted generation spends {100 * share:.0f}% of its time in the "
          f"two models' forwards, so an engine calling the same transformers forwards is at most {1 / share:.2f}x faster")
    return {"engine_fastllama_over_hf_assisted": {"value": c_hf / c_fa, "better": "higher",
                                                  "what": f"engine + FastLlama / transformers assisted, {N} tokens, CPU time"},
            "engine_hf_adapter_over_hf_assisted": {"value": c_hf / c_ad, "better": "higher",
                                                   "what": f"engine + real.adapters.hf / transformers assisted, {N} tokens, CPU time"}}


def part2(args):
    from real.decode.methods import MethodParams, make_verifier
    from real.models.vq import VQModel, vq_config

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
    from real.models import llamagen as lg

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
