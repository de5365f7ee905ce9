"""The first-GPU check (issue 42): for the tiny and an XL-shaped random LlamaGen (bf16 on CUDA; layer-skip drafts,
the tiny pair's embedding-dominated init so that drafts are accepted), greedy, CFG 2, B = 1:

  * tokens/s, eager vs compiled (``real.nn.blocks.compiled``), plain AR vs chain (L = 4) vs static tree
    (eagle25) vs dynamic tree (26 nodes, depth 4, topk 4), and whether the compiled greedy tokens equal eager's;
  * aten operations and sync-inducing operations per token and per round on the device path, eager
    (``real.decode.opcount.OpCounter``; on CUDA the device path is the natural one, on CPU it is forced);
  * predicted vs measured speed-up over plain AR: the project's unit-cost model
    (``coolsd.studies.demo.predict.predicted_speedup``) fed with the run's rounds and draft steps and with the
    forward times measured here (target at 1 token, target at the mode's block, draft at a level's width), so the
    gap is the engine's own per-round work.

Writes one JSON file (atomically, ``--out``) and prints a table. Runs in under 8 minutes on one GPU without the
internet: a time budget (``--budget-s``, default 420 s) skips the legs left when it runs out (marked "skipped").
``--dry-run`` uses tiny shapes, few tokens and the "eager" compile backend (dynamo without code generation), so
that ``bash scripts/gpu_check.sh --device cpu --dry-run`` checks the script in the test suite; ``--cpu-smoke`` is
its alias. ``bash scripts/gpu_check.sh --forward`` runs the forward / batch-curve timings (gpu_check_forward.py).

  bash scripts/gpu_check.sh [--device cuda] [--out gpu_check.json] [--tokens 256] [--images 1]
                            [--compile-mode default|reduce-overhead] [--static] [--no-compile] [--budget-s 420]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # run from a checkout

from coolsd.io import atomic_file, json_safe  # noqa: E402
from coolsd.studies.demo.predict import predicted_speedup  # noqa: E402
from real.decode import engine  # noqa: E402
from real.decode.dynamic_tree import DynamicTree  # noqa: E402
from real.decode.opcount import OpCounter  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.models import llamagen as lg  # noqa: E402
from real.nn.blocks import compile_problem, compiled  # noqa: E402
from theory import rules  # noqa: E402
from theory.tree import EAGLE_25, Tree  # noqa: E402

L = 4
MODES = {"ar": None, "chain": lambda: L, "eagle25": lambda: Tree(EAGLE_25), "dynamic": lambda: DynamicTree(26, 4, 4)}
BLOCK = {"ar": 1, "chain": L + 1, "eagle25": 26, "dynamic": 26}     # tokens per row in the target's pass
WIDTH = {"ar": 1, "chain": 1, "eagle25": 8, "dynamic": 4}            # tokens per row in a draft forward (widest)


def device_sync(dev):
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timeit(fn, dev, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    device_sync(dev)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        device_sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def build(name: str, dev, dtype, dry: bool, draft_layers: int):
    """(target, layer-skip draft, label): ``tiny`` is ``real.registry.tiny_llamagen_pair``'s target; ``XL`` the
    LlamaGen-XL config at 384 px (576 tokens; weights scaled like the tiny pair's, std 0.05 sqrt(128 / dim)); with
    ``dry`` the XL-shaped model is the tiny config with 6 layers."""
    if name == "tiny" or dry:
        c = lg.config("tiny") if name == "tiny" else lg.config("tiny", n_layer=6)
        k = 1 if name == "tiny" else 2
    else:
        c, k = lg.config(name, image_size=384), draft_layers
    with torch.device(dev):
        t = lg.LlamaGen(c)
    std = 0.05 * math.sqrt(128 / c.dim)
    t = t.random_init(0, std=std, output_std=0.2, embed_std=1.0).to(dev, dtype).eval()
    label = name if not (dry and name != "tiny") else f"{name} (dry-run: tiny shapes, 6 layers)"
    return t, lg.truncated(t, k).eval(), label


def forwards(t, d, dev, iters: int) -> dict:
    """Median seconds of the target's forward at 1 token and at each mode's block, the draft's at 1 token and at a
    tree level's width (CFG batch of 2, cache half full)."""
    T = t.config.block_size
    g = torch.Generator(device=dev).manual_seed(0)
    half = torch.randint(0, t.vocab_size, (1, T // 2), generator=g, device=dev).expand(2, -1)

    def fwd(model, S):
        def f():
            model.forward(half[:, :S])
            model.rollback(S)
        return f

    out = {}
    with torch.no_grad():
        t.prefill(3, half, cfg=True)
        d.prefill(3, half, cfg=True)
        for S in sorted(set(BLOCK.values())):
            out[f"target_{S}"] = timeit(fwd(t, S), dev, iters)
        for S in sorted(set(WIDTH.values())):
            out[f"draft_{S}"] = timeit(fwd(d, S), dev, iters)
    return out


def run_mode(t, d, mode, tokens, images, dev, device_path=None):
    """One timed greedy generation per image at B = 1: (generations, seconds)."""
    proc = Processing(temperature=0.0, cfg_scale=4.0)
    kw = dict(num_tokens=tokens, processing=proc, batch_size=1, device_path=device_path)
    if mode != "ar":
        kw.update(verifier=rules.greedy(), drafting=MODES[mode]())
    conds = [i % t.config.num_classes for i in range(images)]
    device_sync(dev)
    t0 = time.perf_counter()
    gens = engine.generate(t, d if mode != "ar" else None, conds, **kw)
    device_sync(dev)
    return gens, time.perf_counter() - t0


def counts(t, d, mode, tokens, dev) -> dict:
    """Ops and syncs of one image on the device path (eager), per token and per round."""
    run_mode(t, d, mode, min(tokens, 8), 1, dev, device_path=True)       # warm-up: plans, caches
    with OpCounter() as c:
        gens, _ = run_mode(t, d, mode, tokens, 1, dev, device_path=True)
    tab = c.table()
    n, R = sum(g.tokens.numel() for g in gens), max(c.rounds, 1)
    return {"tokens": n, "rounds": c.rounds, "ops_per_token": tab["total"]["ops"] / n,
            "syncs_per_token": tab["total"]["syncs"] / n, "syncs_per_round": tab["total"]["syncs"] / R,
            "draft_syncs_per_round": tab["draft"]["syncs"] / R}


def prediction(gens, mode, fw: dict) -> float | None:
    """Speed-up over plain AR predicted by the unit-cost model from this run's rounds and draft steps and the
    measured forward times (``predicted_speedup``; the engine's own per-round work is left out: the gap)."""
    if mode == "ar":
        return 1.0
    s = engine.summarize(gens)
    er = {"rounds": s["rounds"], "draft_steps": s["draft_forwards"],
          "single_steps": sum(1 for g in gens for r in g.rounds if r.drafted == 0)}
    costs = {"ar_step_s": fw["target_1"], "target_per_round_s": fw[f"target_{BLOCK[mode]}"],
             "other_per_round_s": 0.0, "draft_step_s": fw[f"draft_{WIDTH[mode]}"]}
    return predicted_speedup(er, costs, 0.0, T=s["tokens"])


def _leg(res: dict, key: str, t_start: float, budget: float, fn) -> None:
    """res[key] = fn(), or {"skipped": why} once the time budget is spent, or {"error": ...} when it raises (the
    check goes on: one JSON file whatever fails on a first GPU)."""
    if time.perf_counter() - t_start > budget:
        res[key] = {"skipped": f"time budget of {budget:.0f} s spent"}
        return
    try:
        res[key] = fn()
    except Exception as e:  # noqa: BLE001 (reported in the JSON and the table, not fatal)
        res[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(f"  {key}: {res[key]['error']}", file=sys.stderr, flush=True)


def check_model(name, a, dev, dtype, t_start, compile_why) -> dict:
    """One model: forward timings, the eager runs, the counts (device path, eager), then the compiled runs (last:
    the slowest to start, the first to be cut by the time budget)."""
    t, d, label = build(name, dev, dtype, a.dry_run, a.draft_layers)
    tokens = min(a.tokens, t.config.block_size)
    res = {"label": label, "params_M": sum(p.numel() for p in t.parameters()) / 1e6, "draft_layers":
           d.config.n_layer, "layers": t.config.n_layer, "tokens": tokens, "images": a.images}
    res["forward_ms"] = {k: 1e3 * v for k, v in forwards(t, d, dev, a.iters).items()}
    fw = {k: v / 1e3 for k, v in res["forward_ms"].items()}
    res["runs"], res["counts"], eager_tokens = {}, {}, {}

    def timed(mode, comp):
        def f():
            w0 = time.perf_counter()
            run_mode(t, d, mode, min(tokens, a.warm_tokens), 1, dev)        # warm-up (compilation when compiled)
            warm = time.perf_counter() - w0
            gens, secs = run_mode(t, d, mode, tokens, a.images, dev)
            s = engine.summarize(gens)
            row = {"tokens_per_s": s["tokens"] / secs, "seconds": secs, "warmup_s": warm,
                   "tokens_per_call": s["tokens_per_target_call"], "rounds": s["rounds"],
                   "draft_forwards": s["draft_forwards"], "speedup_predicted": prediction(gens, mode, fw)}
            toks = [g.tokens for g in gens]
            if comp:
                if mode in eager_tokens:
                    row["tokens_equal_eager"] = all(torch.equal(x, y) for x, y in zip(toks, eager_tokens[mode]))
                row["fell_back_to_eager"] = bool(t.layers[0].fns.post.failed or t.layers[0].fns.pre.failed)
            else:
                eager_tokens[mode] = toks
            return row
        return f

    for leg, comp in [("eager", False)] + ([("compiled", True)] if compile_why is None else []):
        if comp:
            for mode in MODES:              # the counts of the eager device path, before the compiled legs
                _leg(res["counts"], mode, t_start, a.budget_s,
                     lambda mode=mode: counts(t, d, mode, min(tokens, a.count_tokens), dev))
        # the compiled leg in real.nn.blocks.compiled (static shapes with --static or reduce-overhead; the layers'
        # eager functions restored after it)
        with compiled((t, d), a.compile_mode if comp else None, backend=a.compile_backend, device=dev,
                      static=a.static or None):
            for mode in MODES:
                _leg(res["runs"], f"{mode} {leg}", t_start, a.budget_s, timed(mode, comp))
        ar = res["runs"].get(f"ar {leg}", {})
        for mode in MODES:
            row = res["runs"][f"{mode} {leg}"]
            if "seconds" in row and "seconds" in ar:
                row["speedup_measured"] = ar["seconds"] / row["seconds"]
    if not res["counts"]:                   # no compiled legs: the counts come last
        for mode in MODES:
            _leg(res["counts"], mode, t_start, a.budget_s,
                 lambda mode=mode: counts(t, d, mode, min(tokens, a.count_tokens), dev))
    del t, d
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def table(out: dict) -> str:
    head = (f"{'model':6s} {'mode':8s} {'eager t/s':>10s} {'comp t/s':>9s} {'tok/call':>8s} {'SU meas':>8s} "
            f"{'SU pred':>8s} {'ops/tok':>8s} {'syncs/tok':>9s} {'syncs/rnd':>9s} {'draft s/r':>9s} {'comp=eag':>8s}")
    lines = [head]
    for name, res in out["models"].items():
        for mode in MODES:
            e = res["runs"].get(f"{mode} eager", {})
            c = res["runs"].get(f"{mode} compiled", {})
            n = res["counts"].get(mode, {})
            eq = c.get("tokens_equal_eager")
            lines.append(
                f"{name:6s} {mode:8s} {_f(e.get('tokens_per_s'), '10.1f')} {_f(c.get('tokens_per_s'), '9.1f'):>9s} "
                f"{_f(e.get('tokens_per_call'), '8.2f'):>8s} {_f(e.get('speedup_measured'), '8.2f'):>8s} "
                f"{_f(e.get('speedup_predicted'), '8.2f'):>8s} {_f(n.get('ops_per_token'), '8.1f'):>8s} "
                f"{_f(n.get('syncs_per_token'), '9.2f'):>9s} {_f(n.get('syncs_per_round'), '9.2f'):>9s} "
                f"{_f(n.get('draft_syncs_per_round'), '9.2f'):>9s} {'-' if eq is None else str(eq):>8s}")
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, few tokens, the eager compile backend")
    ap.add_argument("--cpu-smoke", action="store_true", help="alias of --device cpu --dry-run")
    ap.add_argument("--models", nargs="+", default=["tiny", "XL"], choices=["tiny", "B", "L", "XL", "XXL"])
    ap.add_argument("--tokens", type=int, default=256, help="tokens per image (at most the model's; default 256)")
    ap.add_argument("--images", type=int, default=1, help="images per timed run (default 1)")
    ap.add_argument("--warm-tokens", type=int, default=48, help="tokens of each run's untimed warm-up (default 48)")
    ap.add_argument("--count-tokens", type=int, default=64, help="tokens of the counted run (default 64)")
    ap.add_argument("--draft-layers", type=int, default=4, help="layers of the XL-shaped layer-skip draft")
    ap.add_argument("--iters", type=int, default=20, help="repeats of each forward timing (median)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled legs")
    ap.add_argument("--static", action="store_true", help="static shapes in the compiled legs (graphs per shape, whole "
                    "KV caches read; always with --compile-mode reduce-overhead)")
    ap.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead",
                                                                  "max-autotune-no-cudagraphs"])
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; dry-run eager)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="time after which the legs left are skipped")
    ap.add_argument("--out", default="gpu_check.json", help="the JSON file written (atomically)")
    a = ap.parse_args(argv)
    if a.cpu_smoke:
        a.device, a.dry_run = "cpu", True
    if a.dry_run:
        a.tokens, a.warm_tokens, a.count_tokens, a.iters = min(a.tokens, 16), min(a.warm_tokens, 8), \
            min(a.count_tokens, 16), min(a.iters, 2)
    if a.compile_backend is None:
        a.compile_backend = "eager" if a.dry_run else "inductor"
    for k in ("tokens", "images", "warm_tokens", "count_tokens", "draft_layers", "iters"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1")
    from coolsd.io import check_output_file

    try:                          # the output checked before the check runs (issue 50: written after minutes of work)
        a.out = str(check_output_file("--out", a.out))
    except ValueError as e:
        ap.error(str(e))
    return a


def main(argv=None) -> int:
    a = parse(argv)
    try:
        dev = torch.device(a.device)
    except RuntimeError as e:
        print(f"gpu_check: --device {a.device!r}: {e}", file=sys.stderr)
        return 2
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (--device cpu --dry-run checks the script on CPU)", file=sys.stderr)
        return 2
    if dev.type == "cpu":
        torch.set_num_threads(1 if a.dry_run else torch.get_num_threads())
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    why = "--no-compile" if a.no_compile else compile_problem(dev, a.compile_backend,
                                                              None if a.compile_mode == "default" else a.compile_mode)
    t0 = time.perf_counter()
    out = {"device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "dtype": str(dtype), "torch": torch.__version__, "dry_run": a.dry_run, "L": L,
           "compile": {"mode": a.compile_mode, "backend": a.compile_backend, "skipped": why},
           "budget_s": a.budget_s, "models": {}}
    print(f"gpu_check: {out['device_name']}, {dtype}, torch {torch.__version__}, compile "
          f"{'skipped: ' + why if why else a.compile_mode + ' / ' + a.compile_backend}"
          f"{', dry run' if a.dry_run else ''}", flush=True)
    with torch.no_grad():
        for name in a.models:
            out["models"][name] = check_model(name, a, dev, dtype, t0, why)
            print(f"  {out['models'][name]['label']}: done at {time.perf_counter() - t0:.1f} s", flush=True)
    out["seconds"] = time.perf_counter() - t0
    with atomic_file(a.out, "w") as fh:
        json.dump(json_safe(out), fh, indent=1, allow_nan=False)
    print("greedy, B = 1; t/s tokens per second; SU speed-up over plain AR (measured, predicted by the unit-cost "
          "model); ops and syncs on the device path, eager")
    print(table(out))
    print(f"total {out['seconds']:.1f} s; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
