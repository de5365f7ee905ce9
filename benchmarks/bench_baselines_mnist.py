"""Released vs our earlier LANTERN / LANTERN++ on the shipped MNIST models.

  python benchmarks/bench_baselines_mnist.py --n-images 48 --out docs/results/baselines

For chain drafting (L = 4) and the EAGLE-1 25-node tree, with the demo's drafter (EAGLE head) and settings
(k = 32, lambda = 2, delta = 0.2): measured tokens per target call, the target's NLL per token of the
generated codes, and the predicted tokens per call and mean per-round TV bound (T10/T11) from the recorded
vanilla rounds of the same setting. Variants: the release's ("released", raw-codebook neighbour table), our
earlier one ("renormalised" law with the l2-normalised table), the renormalised law alone on the raw table,
and G*. Writes <out>/mnist_baselines.json and .md atomically, with the command and wall clock.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coolsd.studies import demo  # noqa: E402
from real.decode import engine  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.zoo import gpt, vq  # noqa: E402
from theory import rules  # noqa: E402


def variants(s: demo.Settings, nb_raw, nb_l2):
    k, lam, d = s.lantern_k, s.lam, s.lantern_delta
    return {
        "lantern++ released": rules.lantern_pp(nb_raw, k, lam),
        "lantern++ renormalised, l2 table (earlier)": rules.lantern_pp(nb_l2, k, lam, "renormalised"),
        "lantern++ renormalised, raw table": rules.lantern_pp(nb_raw, k, lam, "renormalised"),
        "lantern++ G*": rules.lantern_pp(nb_raw, k, lam, "optimal"),
        "lantern released": rules.lantern(nb_raw, k, d),
        "lantern renormalised, l2 table (earlier)": rules.lantern(nb_l2, k, d, "renormalised"),
    }


def _write_atomic(path: pathlib.Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-images", type=int, default=48)
    ap.add_argument("--out", default=None, help="directory for mnist_baselines.json/.md (default: print only)")
    args = ap.parse_args(argv)
    if args.n_images < 2:
        raise ValueError(f"--n-images must be >= 2 (standard errors), got {args.n_images}")
    out = pathlib.Path(args.out) if args.out else None
    if out is not None and not out.is_dir():
        raise ValueError(f"--out {out} is not an existing directory")
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    s = demo.Settings(n_images=args.n_images)
    target, drafts = demo.load_models(s)
    draft = drafts["eagle"]
    nb_raw = rules.lantern_neighbors(vq.raw_codebook().numpy(), s.lantern_k + 1)
    nb_l2 = rules.lantern_neighbors(vq.raw_codebook().numpy(), s.lantern_k + 1, normalize=True)
    proc = Processing(temperature=s.temperature, cfg_scale=s.cfg_scale)
    tree = s.tree_obj()
    classes = [i % gpt.NUM_CLASSES for i in range(s.n_images)]
    labels = torch.tensor(classes)
    rows = []
    for drafting in ("chain", "tree"):
        def gen(v, record=False):
            gs = []
            for c, sd in zip(classes, range(s.seed, s.seed + s.n_images)):
                if drafting == "tree":
                    gs.append(engine.speculative_generate(target, draft, c, num_tokens=demo.T_IMAGE, verifier=v, drafting=tree,
                                                   processing=proc, seed=sd, record_rows=record, progress=False))
                else:
                    gs.append(engine.speculative_generate(target, draft, c, num_tokens=demo.T_IMAGE, verifier=v, drafting=s.L,
                                                          processing=proc, seed=sd, record_rows=record, progress=False))
            return gs

        van = gen(rules.vanilla(), record=True)
        data = demo.chain_arrays(van, s.L) if drafting == "chain" else demo.tree_records(van)
        for name, v in [("vanilla", rules.vanilla()), *variants(s, nb_raw, nb_l2).items()]:
            gs = van if name == "vanilla" else gen(v)
            st = engine.summarize(gs)
            toks = torch.stack([g.tokens for g in gs])
            pred = (demo.chain_prediction(data, v, s.L, True) if drafting == "chain" else demo.tree_prediction(data, v, tree))
            rows.append({"drafting": drafting, "variant": name, "verifier": v.name, "params": v.params,
                         "tokens_per_call": st["tokens_per_target_call"], "tokens_per_call_se": st["tokens_per_target_call_se"],
                         **demo.nll_with_se(target, labels, toks),
                         "predicted_tokens_per_call": pred["tokens_per_call"], "tv_bound": pred["tv_bound"],
                         "tv_bound_se": pred.get("tv_bound_se", float("nan"))})
            print(f"{drafting:5s} {name:42s} tok/call {rows[-1]['tokens_per_call']:.3f} +- {rows[-1]['tokens_per_call_se']:.3f}"
                  f"  NLL {rows[-1]['nll_per_token']:.4f} +- {rows[-1]['nll_per_token_se']:.4f}"
                  f"  pred {rows[-1]['predicted_tokens_per_call']:.3f}  B {rows[-1]['tv_bound']:.4f} +- {rows[-1]['tv_bound_se']:.4f}",
                  flush=True)
    report = {"command": "python benchmarks/bench_baselines_mnist.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "settings": {"n_images": s.n_images, "L": s.L, "tree": s.tree, "draft": "eagle", "k": s.lantern_k,
                           "lambda": s.lam, "delta": s.lantern_delta, "temperature": s.temperature, "cfg_scale": s.cfg_scale,
                           "threads": 1},
              "rows": rows, "wall_clock_s": time.perf_counter() - t0}
    print(f"wall clock {report['wall_clock_s']:.1f} s")
    if out is not None:
        clean = json.loads(json.dumps(report), parse_constant=lambda c: None)
        _write_atomic(out / "mnist_baselines.json", json.dumps(clean, indent=2) + "\n")
        _write_atomic(out / "mnist_baselines.md", markdown(report))
    return report


def markdown(r: dict) -> str:
    lines = [f"# LANTERN / LANTERN++ as released vs our earlier variants (MNIST zoo, {r['settings']['n_images']} images)",
             "", f"Command: `{r['command']}` (wall clock {r['wall_clock_s']:.0f} s, 1 thread).", "",
             "Predicted tokens per call and the TV bound B (mean per round, T10/T11) come from the recorded vanilla "
             "rounds of the same drafting; NLL is the target's per-token NLL of the generated codes.", "",
             "| drafting | variant | tokens/call (measured) | predicted | NLL/token | TV bound B |", "|---|---|---|---|---|---|"]
    for x in r["rows"]:
        se = x["tv_bound_se"]
        lines.append(f"| {x['drafting']} | {x['variant']} | {x['tokens_per_call']:.3f} +- {x['tokens_per_call_se']:.3f} | "
                     f"{x['predicted_tokens_per_call']:.3f} | {x['nll_per_token']:.4f} +- {x['nll_per_token_se']:.4f} | "
                     f"{x['tv_bound']:.4f}" + ("" if se is None or (isinstance(se, float) and math.isnan(se)) else f" +- {se:.4f}") + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
