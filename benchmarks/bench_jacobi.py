"""Drafter-free vs drafted decoding on the shipped MNIST models (issue 27): SJD, GSD and Cool-SD on Jacobi drafts
(window W) and the same rules on the EAGLE drafter (chains of L), with plain AR as the baseline.

Per setting: tokens per target call (SE over images), measured speed-up over AR at batch 1 and at the demo's batch
(50), FD to the held-out digits (jackknife SE, coolsd.studies.sweep.metrics.fd_with_ci), target NLL per token (SE
over images); and the T10 predictions of every rule's accepted drafts per round from ONE vanilla run's recorded
rows per drafter (theory.recorded.predict_rounds), against the measured ones.

  PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/bench_jacobi.py --images 100 --images-b1 10 \
      --out docs/results/jacobi/frontier.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def settings(codebook):
    from theory import rules

    rule = {"vanilla": rules.vanilla(), "gsd": rules.gsd(codebook), "cool-sd:delta=2": rules.cool_sd(2.0),
            "cool-sd:delta=4": rules.cool_sd(4.0)}
    return rule


def predict(p, q, d, nd, verifier, chunk: int = 128):
    """T10 / T11 per recorded round (``theory.recorded.predict_rounds``) in chunks of rounds (GSD's grouped
    acceptance forms (rounds, L, V, window) arrays): (accepted (R,), bound (R,))."""
    from theory.recorded import predict_rounds

    acc, bnd = [], []
    for a in range(0, len(nd), chunk):   # a loop over chunks of recorded rounds (memory), not over tokens
        r = predict_rounds(p[a:a + chunk].astype(np.float64), q[a:a + chunk].astype(np.float64), d[a:a + chunk],
                           verifier, nd[a:a + chunk], check=False)
        acc.append(np.asarray(r.accepted))
        bnd.append(np.asarray(r.bound))
    return np.concatenate(acc), np.concatenate(bnd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=100, help="images per setting at the demo batch")
    ap.add_argument("--images-b1", type=int, default=10, help="images per setting timed at batch 1")
    ap.add_argument("--batch", type=int, default=50, help="the demo's batch size")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--paired-b1", type=int, default=0, metavar="R",
                    help="only time batch 1 again: R repeats of (AR, setting) on --images-b1 images, interleaved so that "
                         "both see the same machine load; writes the median speed-up per setting into --out's JSON")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from coolsd.studies.demo.quality import nll_with_se
    from coolsd.studies.sweep.analysis import quality_refs
    from coolsd.studies.sweep.metrics import fd_with_ci, tokens_per_call
    from real.decode import engine
    from real.decode.jacobi import Jacobi
    from real.decode.sampling import Processing
    from real.zoo import gpt, vq
    from real.zoo.metrics import image_features

    t = gpt.load_target()
    eagle = gpt.load_eagle(t)
    rules_ = settings(vq.raw_codebook().double().numpy())
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    classes = [i % 10 for i in range(a.images)]
    ref, _ = quality_refs()
    T = gpt.TOKENS
    drafters = {"jacobi": dict(draft=None, jacobi=Jacobi(a.window, width=7)), "eagle": dict(draft=eagle, L=a.L)}

    def run(kw, verifier, n, B, record=False, seed=a.seed):
        gens = engine.generate(t, kw.get("draft"), classes[:n], num_tokens=T, verifier=verifier, L=kw.get("L"),
                               jacobi=kw.get("jacobi"), processing=proc, seed=seed, batch_size=B, record_rows=record)
        return gens

    def quality(gens):
        toks = torch.stack([g.tokens for g in gens])
        labels = torch.as_tensor(classes[:len(gens)])
        fd = fd_with_ci(image_features(vq.decode(toks)).numpy(), ref)
        return {"fd": fd["fd"], "fd_se": fd["se"], **nll_with_se(t, labels, toks)}

    if a.paired_b1:
        with open(a.out) as fh:
            out = json.load(fh)
        for row in out["settings"]:   # a loop over settings and repeats (timing), each an engine call
            kw = drafters[row["drafter"]]
            ratios = []
            for r in range(a.paired_b1):
                s_ar = engine.summarize(run({}, None, a.images_b1, 1, seed=100 + r))["seconds"]
                s_me = engine.summarize(run(kw, rules_[row["rule"]], a.images_b1, 1, seed=100 + r))["seconds"]
                ratios.append(s_ar / s_me)
            row["speedup_b1_paired"] = float(np.median(ratios))
            row["speedup_b1_paired_all"] = ratios
            print(row["drafter"], row["rule"], np.round(ratios, 3), flush=True)
        out["paired_b1"] = {"repeats": a.paired_b1, "images": a.images_b1}
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=1)
        return 0
    t0 = time.time()
    ar = run({}, None, a.images, a.batch)
    ar1 = run({}, None, a.images_b1, 1)
    out = {"config": vars(a), "ar": {"seconds_B": engine.summarize(ar)["seconds"],
                                     "seconds_b1": engine.summarize(ar1)["seconds"], **quality(ar)}, "settings": []}
    print(f"AR: {out['ar']}", flush=True)
    for dname, kw in drafters.items():   # a loop over the two drafters and four rules (settings, not tokens)
        L = kw["jacobi"].slots if dname == "jacobi" else a.L
        rec = None
        for name, ver in rules_.items():
            gens = run(kw, ver, a.images, a.batch, record=(name == "vanilla"))
            g1 = run(kw, ver, a.images_b1, 1)
            s, s1 = engine.summarize(gens), engine.summarize(g1)
            tpc, tpc_se = tokens_per_call([len(g.rounds) for g in gens], T)
            drafted = [r for g in gens for r in g.rounds if r.drafted > 0]
            if name == "vanilla":
                rec = engine.records_to_arrays(drafted, L)
            p, q, d, nd = rec
            pred = predict(p, q, d, nd, ver)
            row = {"drafter": dname, "rule": name, "L": L, "tokens_per_target_call": tpc, "tpc_se": tpc_se,
                   "rounds": len(drafted), "recorded_rounds": len(nd),
                   "speedup_B": out["ar"]["seconds_B"] / s["seconds"], "speedup_b1": out["ar"]["seconds_b1"] / s1["seconds"],
                   "seconds_B": s["seconds"], "seconds_b1": s1["seconds"],
                   "measured_accepted_per_drafted_round": float(np.mean([r.accepted for r in drafted])),
                   "predicted_accepted_per_drafted_round": float(np.mean(pred[0])),
                   "predicted_bound_per_round": float(np.mean(pred[1])), **quality(gens)}
            m, pr = 1 + row["measured_accepted_per_drafted_round"], 1 + row["predicted_accepted_per_drafted_round"]
            row["prediction_error"] = pr / m - 1          # of tokens per drafted round (tau + 1)
            out["settings"].append(row)
            print(json.dumps(row), flush=True)
    out["cpu_seconds"] = time.time() - t0
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"done in {out['cpu_seconds']:.0f}s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
