"""Drafter-free vs drafted decoding on the shipped MNIST models (issues 27, 40): SJD, GSD and Cool-SD on Jacobi drafts
(window W), on SJD-PAC's drafts (the release, ``sjd-pac``, and ours, ``sjd-pac-p``: window W, tree K x D) and the same
rules on the EAGLE drafter (chains of L), with plain AR as the baseline.

Per setting: tokens per target call (SE over images), measured speed-up over AR at batch 1 and at the demo's batch
(50), FD to the held-out digits (jackknife SE, coolsd.quality.estimators.fd_with_ci), target NLL per token (SE
over images); and the T10 predictions of every rule's accepted drafts per round from ONE vanilla run's recorded
rows per drafter (theory.likelihood.recorded.predict_rounds), against the measured ones: per round and, weighted by the
stretch of the image each recorded round covers (theory.likelihood.recorded.renewal_tokens_per_round, docs/theory.md
section 8), per drafted round and per target call. SJD-PAC rounds are tree rounds: for ``sjd-pac-p`` (the standard
walk) the per-round prediction is the walk's T10 for trees (theory.likelihood.recorded.predict_tree_rounds); the
release's longest-path verdict is not the walk, so for ``sjd-pac`` it is that verdict's own expectation
(real.decode.sjd_pac.predict_longest); no T11 bound is given for either.

  PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/bench_jacobi.py --images 100 --images-b1 10 \
      --out docs/results/jacobi/frontier.json
  ... --predict-only --out docs/results/jacobi/frontier.json   # predictions + exact TV/KL again (same seeds)
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


DRAFTERS = ("jacobi", "sjd-pac", "sjd-pac-p", "eagle")


def settings(codebook):
    from theory import rules

    rule = {"vanilla": rules.vanilla(), "gsd": rules.gsd(codebook), "cool-sd:delta=2": rules.cool_sd(2.0),
            "cool-sd:delta=4": rules.cool_sd(4.0)}
    return rule


def predict(p, q, d, nd, verifier, chunk: int = 128):
    """T10 / T11 per recorded round (``theory.likelihood.recorded.predict_rounds``) in chunks of rounds (GSD's grouped
    acceptance forms (rounds, L, V, window) arrays): (accepted (R,), bound (R,))."""
    from theory.likelihood.recorded import predict_rounds

    acc, bnd = [], []
    for a in range(0, len(nd), chunk):   # a loop over chunks of recorded rounds (memory), not over tokens
        r = predict_rounds(p[a:a + chunk].astype(np.float64), q[a:a + chunk].astype(np.float64), d[a:a + chunk],
                           verifier, nd[a:a + chunk], check=False)
        acc.append(np.asarray(r.accepted))
        bnd.append(np.asarray(r.bound))
    return np.concatenate(acc), np.concatenate(bnd)


def tree_records(gens, tree):
    """Recorded SJD-PAC (tree) rounds padded to the full tree: p, q (R, N+1, V) float32, tokens (R, N+1), depth caps
    (R,); the rounds without drafts are left out (nothing to predict)."""
    recs = [r for g in gens for r in g.rounds if r.drafted > 0]
    N1, V = tree.n_nodes + 1, recs[0].p.shape[-1]
    p = np.full((len(recs), N1, V), 1.0 / V, np.float32)
    q = np.full((len(recs), N1, V), 1.0 / V, np.float32)
    tok = np.zeros((len(recs), N1), np.int64)
    for i, r in enumerate(recs):   # copying recorded rounds into padded arrays, not a hot path
        m = r.p.shape[0]
        p[i, :m], q[i, :m], tok[i, :m] = r.p, r.q, r.drafts
    return p, q, tok, np.array([r.depth for r in recs])


def predict_tree(p, q, tok, cap, verifier, spec, chunk: int = 64):
    """Expected accepted drafts per recorded SJD-PAC round (R,) under ``verifier``, in chunks of rounds (memory):
    the walk's T10 for trees (``theory.likelihood.recorded.predict_tree_rounds``) for ``sjd-pac-p``, whose verdict is
    the standard walk; for the release (``sjd-pac``) its own longest-path verdict
    (``real.decode.sjd_pac.predict_longest``: node tests independent given the rows; the walk's T10 does not apply)."""
    from real.decode.sjd_pac import predict_longest
    from theory.likelihood.recorded import predict_tree_rounds

    tree, out = spec.tree(), []
    for a in range(0, len(cap), chunk):   # a loop over chunks of recorded rounds (memory), not over tokens
        sl = slice(a, a + chunk)
        args = (p[sl].astype(np.float64), q[sl].astype(np.float64), tok[sl])
        if spec.release:
            out.append(np.asarray(predict_longest(*args, tree, verifier, cap[sl])))
        else:
            out.append(np.asarray(predict_tree_rounds(*args, tree, verifier, check=False, max_depth=cap[sl]).accepted))
    return np.concatenate(out), None


def prediction_fields(rec, van_acc, verifier, recorded_gens, T: int, spec=None) -> dict:
    """T10 predictions of ``verifier`` from the vanilla run ``recorded_gens`` (its recorded rows ``rec`` and
    vanilla's own T10 ``van_acc`` (R,)): accepted drafts per drafted round (plain mean), tokens per drafted
    round (renewal weighting) and tokens per target call (the vanilla run's tokens committed in drafted
    rounds over the predicted number of such rounds, plus its undrafted rounds, which no rule changes)."""
    from theory.likelihood.recorded import renewal_tokens_per_round

    pred = predict(*rec, verifier) if spec is None else predict_tree(*rec, verifier, spec)
    per_round = renewal_tokens_per_round(pred[0], van_acc)
    rounds = [r for g in recorded_gens for r in g.rounds]
    drafted_tokens = sum(r.accepted + 1 for r in rounds if r.drafted > 0)
    undrafted = sum(1 for r in rounds if r.drafted == 0)
    calls = undrafted + drafted_tokens / per_round
    return {"predicted_accepted_per_drafted_round": float(np.mean(pred[0])),
            "predicted_tokens_per_drafted_round_renewal": per_round,
            "predicted_tokens_per_target_call": len(recorded_gens) * T / calls,
            "predicted_bound_per_round": None if pred[1] is None else float(np.mean(pred[1]))}


def fidelity_fields(t, draft, classes, gens, ar_gens, verifier, L: int, proc, T: int) -> dict:
    """Exact TV / KL to the target's law (docs/theory.md section 11; ``coolsd.studies.sweep.fidelity.score_images``
    and ``theory.likelihood.fidelity.report``, as ``coolsd sweep`` computes them) of a drafter's chain setting: from its
    own images and, as a second estimate, from the plain-AR images (same processing). Jacobi drafts have no
    tractable likelihood (``real.decode.score.JACOBI_REASON``): pass draft=None for the reason instead."""
    from real.decode.score import JACOBI_REASON
    from theory.likelihood import fidelity

    if draft is None:
        return {"tv_to_target": None, "kl_to_target": None, "fidelity_reason": JACOBI_REASON}
    from coolsd.studies.sweep.fidelity import score_images

    toks = np.stack([g.tokens.numpy() for g in gens])
    ar_toks = np.stack([g.tokens.numpy() for g in ar_gens])
    sc = score_images(t, draft, classes[:len(toks)], toks, {"r": verifier}, L, proc)
    sa = score_images(t, draft, classes[:len(ar_toks)], ar_toks, {"r": verifier}, L, proc)
    rep = fidelity.report((sc["log_p_hat"]["r"], sc["log_p"]), (sa["log_p_hat"]["r"], sa["log_p"]), T=T)
    return {"tv_to_target": rep["tv_to_target"], "kl_to_target": rep["kl_to_target"]}


def errors(row: dict) -> dict:
    """Relative errors of the predictions in ``row`` against its measured values."""
    m = 1 + row["measured_accepted_per_drafted_round"]
    return {"prediction_error_plain": (1 + row["predicted_accepted_per_drafted_round"]) / m - 1,
            "prediction_error": row["predicted_tokens_per_drafted_round_renewal"] / m - 1,
            "prediction_error_tokens_per_call": row["predicted_tokens_per_target_call"] / row["tokens_per_target_call"] - 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=100, help="images per setting at the demo batch")
    ap.add_argument("--images-b1", type=int, default=10, help="images per setting timed at batch 1")
    ap.add_argument("--batch", type=int, default=50, help="the demo's batch size")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS,
                    help="jacobi (SJD), sjd-pac (the release), sjd-pac-p (ours, lossless), eagle (chains of --L)")
    ap.add_argument("--pac-width", type=int, default=3, help="SJD-PAC's tree width K (the release's 3)")
    ap.add_argument("--pac-depth", type=int, default=3, help="SJD-PAC's tree depth D (the release's 3)")
    ap.add_argument("--gsd-table", choices=("embedding", "codebook"), default="embedding",
                    help="GSD's distance table: the target's input embeddings in bf16 (as released; default) or the raw "
                         "VQ codebook (the table of frontier.json, made before issue 40)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--predict-only", action="store_true",
                    help="recompute only the predictions into --out's JSON: the vanilla recordings and every rule's run at "
                         "the demo batch again on the same seeds (their measured rounds must reproduce the stored ones)")
    ap.add_argument("--paired-b1", type=int, default=0, metavar="R",
                    help="only time batch 1 again: R repeats of (AR, setting) on --images-b1 images, interleaved so that "
                         "both see the same machine load; writes the median speed-up per setting into --out's JSON")
    a = ap.parse_args(argv)
    if min(a.images, a.images_b1, a.batch, a.window, a.L, a.pac_width, a.pac_depth) < 1:
        raise SystemExit("--images, --images-b1, --batch, --window, --L, --pac-width and --pac-depth must be >= 1")
    torch.set_num_threads(1)
    from coolsd.studies.demo.quality import nll_with_se
    from coolsd.quality.estimators import fd_with_ci
    from coolsd.studies.sweep.metrics import tokens_per_call
    from real.decode import engine
    from real.decode.jacobi import Jacobi
    from real.decode.methods import input_embedding_rows
    from real.decode.sampling import Processing
    from real.decode.sjd_pac import SJDPAC
    from real.zoo import gpt, vq
    from real.zoo.metrics import image_features, reference_stats

    t = gpt.load_target()
    eagle = gpt.load_eagle(t)
    table = (vq.raw_codebook().double().numpy() if a.gsd_table == "codebook"
             else input_embedding_rows(t, t.vocab_size).to(torch.bfloat16))
    rules_ = settings(table)
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    classes = [i % 10 for i in range(a.images)]
    ref = reference_stats()          # the held-out digits' Gaussian in the classifier's feature space
    T = gpt.TOKENS
    pac = {n: SJDPAC(a.window, a.pac_width, a.pac_depth, release=(n == "sjd-pac")) for n in ("sjd-pac", "sjd-pac-p")}
    every = {"jacobi": dict(draft=None, drafting=Jacobi(a.window, width=7), L=a.window - 1),
             "sjd-pac": dict(draft=None, drafting=pac["sjd-pac"], L=pac["sjd-pac"].max_depth, pac=pac["sjd-pac"]),
             "sjd-pac-p": dict(draft=None, drafting=pac["sjd-pac-p"], L=pac["sjd-pac-p"].max_depth, pac=pac["sjd-pac-p"]),
             "eagle": dict(draft=eagle, drafting=a.L, L=a.L)}
    drafters = {d: every[d] for d in a.drafters}

    def recorded(kw, van_gens):
        """The vanilla run's recorded rows and vanilla's own per-round prediction on them."""
        if "pac" in kw:
            rec = tree_records(van_gens, kw["pac"].tree())
            return rec, predict_tree(*rec, rules_["vanilla"], kw["pac"])[0]
        rec = engine.records_to_arrays([r for g in van_gens for r in g.rounds if r.drafted > 0], kw["L"])
        return rec, predict(*rec, rules_["vanilla"])[0]

    def run(kw, verifier, n, B, record=False, seed=a.seed):
        gens = engine.generate(t, kw.get("draft"), classes[:n], num_tokens=T, verifier=verifier,
                               drafting=kw.get("drafting"), processing=proc, seed=seed, batch_size=B, record_rows=record)
        return gens

    def quality(gens):
        toks = torch.stack([g.tokens for g in gens])
        labels = torch.as_tensor(classes[:len(gens)])
        fd = fd_with_ci(image_features(vq.decode(toks)).numpy(), ref)
        return {"fd": fd["fd"], "fd_se": fd["se"], **nll_with_se(t, labels, toks)}

    if a.predict_only:
        with open(a.out) as fh:
            out = json.load(fh)
        t0 = time.time()
        ar = run({}, None, a.images, a.batch)
        for dname, kw in drafters.items():   # a loop over the two drafters and four rules (settings, not tokens)
            L = kw["L"]
            van_gens = run(kw, rules_["vanilla"], a.images, a.batch, record=True)
            rec, van = recorded(kw, van_gens)
            for row in (r for r in out["settings"] if r["drafter"] == dname):
                gens = van_gens if row["rule"] == "vanilla" else run(kw, rules_[row["rule"]], a.images, a.batch)
                tpc, _ = tokens_per_call([len(g.rounds) for g in gens], T)
                if abs(tpc - row["tokens_per_target_call"]) > 1e-9:
                    raise SystemExit(f"{dname} {row['rule']}: tokens per call {tpc} do not reproduce the stored "
                                     f"{row['tokens_per_target_call']} (other code or seeds): run the full benchmark")
                row.update(prediction_fields(rec, van, rules_[row["rule"]], van_gens, T, kw.get("pac")))
                row.update(fidelity_fields(t, kw.get("draft"), classes, gens, ar, rules_[row["rule"]], L, proc, T))
                row.update(errors(row))
                print(dname, row["rule"], {k: round(v, 4) for k, v in row.items() if k.startswith("predict")},
                      "TV", (row["tv_to_target"] or {}).get("measured"), (row["tv_to_target"] or {}).get("from_ar"),
                      "KL", (row["kl_to_target"] or {}).get("measured"), flush=True)
        out["predict_only_cpu_seconds"] = time.time() - t0
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=1)
        return 0
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
        L = kw["L"]
        rec = van = van_gens = None
        for name, ver in rules_.items():
            gens = run(kw, ver, a.images, a.batch, record=(name == "vanilla"))
            g1 = run(kw, ver, a.images_b1, 1)
            s, s1 = engine.summarize(gens), engine.summarize(g1)
            tpc, tpc_se = tokens_per_call([len(g.rounds) for g in gens], T)
            drafted = [r for g in gens for r in g.rounds if r.drafted > 0]
            if name == "vanilla":
                van_gens = gens
                rec, van = recorded(kw, gens)
            row = {"drafter": dname, "rule": name, "L": L, "tokens_per_target_call": tpc, "tpc_se": tpc_se,
                   "rounds": len(drafted), "recorded_rounds": len(rec[-1]),
                   "speedup_B": out["ar"]["seconds_B"] / s["seconds"], "speedup_b1": out["ar"]["seconds_b1"] / s1["seconds"],
                   "seconds_B": s["seconds"], "seconds_b1": s1["seconds"],
                   "measured_accepted_per_drafted_round": float(np.mean([r.accepted for r in drafted])),
                   **prediction_fields(rec, van, ver, van_gens, T, kw.get("pac")), **quality(gens),
                   **fidelity_fields(t, kw.get("draft"), classes, gens, ar, ver, L, proc, T)}
            row.update(errors(row))
            out["settings"].append(row)
            print(json.dumps(row), flush=True)
    out["cpu_seconds"] = time.time() - t0
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"done in {out['cpu_seconds']:.0f}s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
