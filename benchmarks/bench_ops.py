"""Aten operations and sync-inducing operations per generated token and per round, by phase of the round (draft,
target, verify, bookkeeping), on the DEVICE path forced on the CPU (issue 42; ``real.nn.devpath``): the code CUDA
tensors run. Counts are exact (``real.decode.opcount.OpCounter``: a TorchDispatchMode over every aten call, the
sync-inducing operations counted by type as listed there, since on the CPU nothing actually waits), so they do not
depend on the machine's load.

Cases: our engine on the tiny LlamaGen (4 layers, dim 128, V = 256, 64 tokens, its layer-skip draft, CFG 2) in
chain (L = 4), static-tree (eagle25) and dynamic-tree (26 nodes, depth 4, topk 4) modes, greedy (greedy rule) and
T = 1 (vanilla); transformers' assisted generation on the tiny Llama of ``bench_engine_vs_hf.py`` (greedy, L = 4;
one phase: its operations are all counted as "bookkeeping" there, rounds = target forwards); our engine with
``real.models.llama.FastLlama`` on the same pair. ``--host`` counts the host (numpy) path instead, for comparison.

  python benchmarks/bench_ops.py [--images 1] [--batch 1] [--out docs/results/ops/now.json] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not

from _timing import write_ratios  # noqa: E402  (benchmarks/_timing.py)

import torch  # noqa: E402

from real.decode import engine  # noqa: E402
from real.decode.dynamic_tree import DynamicTree  # noqa: E402
from real.decode.opcount import OpCounter  # noqa: E402
from real.decode.phases import PHASES  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.registry import tiny_llamagen_pair  # noqa: E402
from theory import rules  # noqa: E402
from theory.tree import EAGLE_25, Tree  # noqa: E402

SHOWN = ("draft", "target", "verify", "bookkeeping")
MODES = {"chain": lambda: 4, "eagle25": lambda: Tree(EAGLE_25), "dynamic": lambda: DynamicTree(26, 4, 4)}
SAMPLING = {"greedy": (Processing(temperature=0.0, cfg_scale=2.0), rules.greedy),
            "T=1": (Processing(temperature=1.0, cfg_scale=2.0), rules.vanilla)}


def summary(c: OpCounter, tokens: int, rounds: int) -> dict:
    """Per-token ops and per-round syncs by phase (and totals) from a counter."""
    t = c.table()
    out = {"tokens": tokens, "rounds": rounds}
    for ph in list(PHASES) + ["total"]:
        out[ph] = {"ops": t[ph]["ops"], "syncs": t[ph]["syncs"], "d2h": t[ph]["d2h"], "shape": t[ph]["shape"],
                   "h2d": t[ph]["h2d"], "ops_per_token": t[ph]["ops"] / tokens, "syncs_per_round": t[ph]["syncs"] / rounds}
    out["sync_names"] = {f"{ph}/{k}": dict(v) for (ph, k), v in sorted(c.names.items()) if k != "ops"}
    if c.where is not None:
        out["sync_sources"] = {ph: dict(sorted(v.items())) for ph, v in sorted(c.where.items())}
    return out


def engine_case(t, d, mode, samp, images, batch, device_path, T=None):
    proc, rule = SAMPLING[samp]
    kw = dict(num_tokens=T or 64, verifier=rule(), drafting=MODES[mode](), processing=proc, batch_size=batch,
              device_path=device_path)
    engine.generate(t, d, list(range(batch)), **kw)              # warm-up (plans, caches, packed weights)
    with OpCounter(where=True) as c:
        gens = engine.generate(t, d, list(range(images)), **kw)
    return summary(c, sum(g.tokens.numel() for g in gens), c.rounds)


def hf_cases(images, device_path, N=64, L=4):
    """transformers' assisted generation and our engine + FastLlama on the tiny Llama pair (greedy, L)."""
    from real.adapters.hf import hf_llama_pair
    from real.models.llama import FastLlama
    from real.protocol import Prompt

    tgt, drf = hf_llama_pair(seed=0)
    for m in (tgt, drf):
        gc = m.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = L, "constant", 0.0
    calls = [0]
    tgt.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    prompt = torch.randint(0, tgt.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))

    def hf():
        with torch.no_grad():
            return tgt.generate(prompt, assistant_model=drf, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                                num_assistant_tokens=L, num_assistant_tokens_schedule="constant",
                                assistant_confidence_threshold=0.0)[0, 8:]
    hf()
    calls[0] = 0
    with OpCounter(where=True) as c:
        ref = hf()
    out = {"hf_assisted": summary(c, N, calls[0])}
    ft, fd = FastLlama.from_hf(tgt), FastLlama.from_hf(drf)
    kw = dict(num_tokens=N, verifier=rules.greedy(), drafting=L, processing=Processing(temperature=0.0),
              device_path=device_path)
    engine.speculative_generate(ft, fd, Prompt(prompt[0]), **kw)
    with OpCounter(where=True) as c:
        g = engine.speculative_generate(ft, fd, Prompt(prompt[0]), **kw)
    assert torch.equal(g.tokens, ref), "FastLlama's tokens differ from assisted generation's"
    out["fastllama_chain_greedy"] = summary(c, N, c.rounds)
    return out


def table(res: dict) -> str:
    head = (f"{'case':28s} {'tok':>4s} {'rnd':>4s} {'ops/tok':>8s} {'syncs/rnd':>9s} | "
            + " ".join(f"{p[:6] + ' o/t':>11s}" for p in SHOWN) + " | " + " ".join(f"{p[:6] + ' s/r':>11s}" for p in SHOWN))
    lines = [head]
    for name, r in res.items():
        lines.append(f"{name:28s} {r['tokens']:4d} {r['rounds']:4d} {r['total']['ops_per_token']:8.1f} "
                     f"{r['total']['syncs_per_round']:9.2f} | "
                     + " ".join(f"{r[p]['ops_per_token']:11.1f}" for p in SHOWN) + " | "
                     + " ".join(f"{r[p]['syncs_per_round']:11.2f}" for p in SHOWN))
    return "\n".join(lines)


def run(images=1, batch=1, device_path=True, hf=True) -> dict:
    t, d = tiny_llamagen_pair(seed=0)
    res = {}
    for mode in MODES:
        for samp in SAMPLING:
            res[f"{mode} {samp} B={batch}"] = engine_case(t, d, mode, samp, images, batch, device_path)
    if hf:
        res.update(hf_cases(images, device_path))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1, help="images per engine case (default 1)")
    ap.add_argument("--batch", type=int, default=1, help="batch size of the engine cases (default 1)")
    ap.add_argument("--host", action="store_true", help="count the host (numpy) path instead of the device path")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers and FastLlama cases")
    ap.add_argument("--short", action="store_true", help="(run_all) the default cases; counts need no repeats")
    ap.add_argument("--out", default=None, help="write the full counts to this JSON file")
    ap.add_argument("--json", default=None, help="write run_all's figures (exact counts, tolerance 0) to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    res = run(args.images, max(args.batch, 1), device_path=not args.host, hf=not args.no_hf)
    print(f"{'host' if args.host else 'device'} path, ops per generated token (o/t) and sync-inducing operations per "
          f"round (s/r), by phase")
    print(table(res))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"path": "host" if args.host else "device", "images": args.images, "batch": args.batch,
                       "cases": res}, fh, indent=1)
    ratios = {}
    for name, r in res.items():
        key = name.replace(" ", "_").replace("=", "").lower()
        ratios[f"ops_{key}_ops_per_token"] = {"value": r["total"]["ops_per_token"], "better": "lower",
                                              "what": f"aten ops per token, {name}, device path on CPU (exact)",
                                              "tolerance": 0.0}
        ratios[f"ops_{key}_syncs_per_round"] = {"value": r["total"]["syncs_per_round"], "better": "lower",
                                                "what": f"sync-inducing ops per round, {name}, device path (exact)",
                                                "tolerance": 0.0}
    write_ratios(args.json, ratios)


if __name__ == "__main__":
    main()
