"""Schedules tuned to the shipped MNIST models vs Cool-SD and UniformRSD.

1. a vanilla chain run (small draft, L = 4) records the P/Q rows of every round (with the image index);
2. ``theory.likelihood.tune`` fits the free-weight schedule minimising the mean predicted TV bound (T11) at three target
   speeds (predicted tokens per drafted round = 1 + mean T10), and a held-out check per target (fit on half
   of the images, predict on the other half, image-bootstrap CIs);
3. Cool-SD (default normalisation, nu = 0.7; delta solved) and UniformRSD (c solved) are tuned to the same
   predicted speed from the same rows;
4. every rule is run on the same digits (class i mod 10, seed i) and measured: tokens per target call,
   target NLL per token (paired differences over the same digits), Frechet distance (paired bootstrap of
   the difference), class accuracy; predictions: T10/T11 and the renewal recursion of ``coolsd.studies.demo``;
5. the predicted frontier (bound vs tokens per call) of every family, on a seeded subsample of rounds.

  python scripts/tuned_study.py --out docs/results/tuned --n-images 120
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from scipy.optimize import brentq  # noqa: E402

from coolsd.io import atomic_file  # noqa: E402


def write_text(path, text: str) -> None:
    with atomic_file(path, "w") as f:
        f.write(text)
from theory import rules  # noqa: E402
from theory.likelihood import tune

L = 4
T = 49


def rows_of(gens) -> tuple[tune.Rows, tuple]:
    """theory.likelihood.tune rows (with image index) and coolsd.studies.demo chain arrays of the recorded vanilla run."""
    from coolsd.studies.demo import chain_arrays

    arrays = chain_arrays(gens, L)
    image = np.array([i for i, g in enumerate(gens) for r in g.rounds if r.drafted > 0])
    p, q, d, nd, _ = arrays
    return tune.Rows(p, q, d, nd, image), arrays


def solve_param(rows: tune.Rows, make, target: float, lo: float, hi: float) -> float:
    """The parameter x of rule make(x) with predicted tokens per call = target (bracketed brentq)."""
    return brentq(lambda x: tune.predict(rows, make(x))["tokens_per_call"] - target, lo, hi, xtol=1e-6)


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    d = a - b
    se = d.std(ddof=1) / math.sqrt(len(d))
    return {"difference": float(d.mean()), "se": float(se), "z": float(d.mean() / se) if se > 0 else float("nan")}


def fd_paired(fa: np.ndarray, fb: np.ndarray, n_boot: int, seed: int) -> dict:
    """FD(a) - FD(b) to the held-out digits with a paired image bootstrap (same digit indices for both)."""
    from real.zoo.metrics import frechet_distance_stats, gaussian_stats, reference_stats

    ref = reference_stats()
    fd = lambda f: frechet_distance_stats(*gaussian_stats(f), *ref)  # noqa: E731
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n_boot):  # bootstrap replicates (each an FD of a few hundred features)
        idx = rng.integers(0, len(fa), len(fa))
        diffs.append(fd(fa[idx]) - fd(fb[idx]))
    return {"difference": float(fd(fa) - fd(fb)), "ci95": np.percentile(diffs, [2.5, 97.5]).tolist()}


def interpolate(results: dict, base: str, m: dict) -> dict:
    """The NLL per token of the ``base`` rule (its runs and vanilla, by measured tokens per call) linearly
    interpolated at the measured tokens per call of m; the tuned rule's NLL minus it, and z with the SEs
    (interpolated likewise; unpaired, so conservative). None outside the base's measured range."""
    pts = sorted([(r["measured"]["tokens_per_call"], r["measured"]["nll_per_token"], r["measured"]["nll_per_token_se"])
                  for n, r in results.items() if n.startswith(base + "@") or n == "vanilla"])
    x = np.array([p[0] for p in pts])
    t = m["tokens_per_call"]
    if not x[0] <= t <= x[-1]:
        return {"nll_interpolated": None, "reason": f"measured tokens per call {t:.3f} outside {base}'s [{x[0]:.3f}, {x[-1]:.3f}]"}
    nll = float(np.interp(t, x, [p[1] for p in pts]))
    se = float(np.interp(t, x, [p[2] for p in pts]))
    d = m["nll_per_token"] - nll
    return {"nll_interpolated": nll, "nll_interpolated_se": se, "difference": d,
            "z": d / math.hypot(se, m["nll_per_token_se"])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-images", type=int, default=120)
    ap.add_argument("--fractions", type=float, nargs=3, default=(0.2, 0.4, 0.6),
                    help="target speeds: fractions of the way from vanilla to the largest predicted tokens per call")
    ap.add_argument("--frontier-rounds", type=int, default=300)
    ap.add_argument("--frontier-points", type=int, default=4)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.n_images < 20:
        raise ValueError(f"--n-images must be >= 20, got {a.n_images}")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    from coolsd.studies import demo
    from real.decode import engine
    from real.decode.sampling import Processing
    from real.zoo import gpt, vq
    from real.zoo.metrics import class_accuracy, image_features

    target, draft = gpt.load_target(), gpt.load_draft()
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    N = a.n_images
    classes = [i % gpt.NUM_CLASSES for i in range(N)]
    seeds = [a.seed + i for i in range(N)]
    labels = torch.tensor(classes)

    def run(verifier, record=False):
        t = time.perf_counter()
        gens = [engine.speculative_generate(target, draft, c, num_tokens=T, verifier=verifier, drafting=L, processing=proc,
                                            seed=s, record_rows=record) for c, s in zip(classes, seeds)]
        return gens, time.perf_counter() - t

    log = lambda *x: print(f"[{time.perf_counter() - t0:6.0f}s]", *x, flush=True)  # noqa: E731
    van_gens, van_s = run(rules.vanilla(), record=True)
    rows, arrays = rows_of(van_gens)
    van_pt, top = tune.reachable(rows, "free")
    log(f"vanilla recorded: {rows.R} rounds; predicted tokens per drafted round {van_pt:.3f}, reachable {top:.3f}")
    targets = [van_pt + f * (top - van_pt) for f in a.fractions]
    sub = rows.subset(np.sort(np.random.default_rng(a.seed).choice(rows.R, min(rows.R, 600), replace=False)))

    rules_run = {"vanilla": (rules.vanilla(), {}, None)}
    validation = {}
    for k, tg in enumerate(targets):
        res = tune.tune(rows, "free", tokens_per_call=tg, seed=a.seed, search_rounds=400)
        rules_run[f"tuned@{k}"] = (res.verifier, {"weights": res.values.tolist(), "target": tg}, k)
        log(f"target {tg:.3f}: tuned w = {np.round(res.values, 3).tolist()}, predicted bound {res.bound:.4f}")
        rx = tune.tune(rows, "exponential", tokens_per_call=tg, seed=a.seed, search_rounds=400)
        rules_run[f"tuned-exp@{k}"] = (rx.verifier, {"weights": rx.values.tolist(), "nu": float(rx.theta[1]),
                                                     "target": tg}, k)
        log(f"  tuned exponential w = {np.round(rx.values, 3).tolist()}, predicted bound {rx.bound:.4f}")
        delta = solve_param(sub, lambda d: rules.cool_sd(d, 0.7), tg, 1.0 + 1e-9, 1e4)
        rules_run[f"cool-sd@{k}"] = (rules.cool_sd(delta, 0.7), {"delta": delta, "nu": 0.7,
                                                                "norm": rules.COOL_SD_NORM, "target": tg}, k)
        c = tune.tune(rows, "uniform", tokens_per_call=tg, seed=a.seed, search_rounds=None).values[0]
        rules_run[f"uniform-rsd@{k}"] = (rules.uniform_rsd(c), {"c": float(c), "target": tg}, k)
        validation[k] = tune.split_validation(rows, "free", tokens_per_call=tg, n_boot=a.n_boot, seed=a.seed,
                                              search_rounds=400)
        log(f"  cool-sd delta {delta:.3f}, uniform c {c:.3f}; held-out gap (bound) {validation[k]['gap']['bound']:+.4f}")

    ar_feats, results = {}, {}
    for name, (v, params, k) in rules_run.items():
        gens, secs = (van_gens, van_s) if name == "vanilla" else run(v)
        st = engine.summarize(gens)
        toks = torch.stack([g.tokens for g in gens])
        images = vq.decode(toks)
        feats = image_features(images).numpy()
        nll = demo.per_image_nll(target, labels, toks)
        fd, fd_se = demo.fd_with_se(images, a.n_boot, a.seed + 1)
        pr = tune.predict(rows, v)
        ci = tune.bootstrap(rows, pr, a.n_boot, a.seed)
        ren = demo.chain_prediction(arrays, v, L, first_single=False)
        ar_feats[name] = (feats, nll)
        results[name] = {
            "rule": v.name, "params": params, "target_index": k,
            "predicted": {"tokens_per_drafted_round": pr["tokens_per_call"], "tokens_per_drafted_round_ci95": ci["tokens_per_call_ci95"],
                          "tokens_per_call_renewal": ren["tokens_per_call"], "bound": pr["bound_mean"], "bound_ci95": ci["bound_ci95"]},
            "measured": {"tokens_per_call": st["tokens_per_target_call"], "tokens_per_call_se": st["tokens_per_target_call_se"],
                         "nll_per_token": float(nll.mean()), "nll_per_token_se": float(nll.std(ddof=1) / math.sqrt(N)),
                         "frechet_distance": fd, "frechet_distance_se": fd_se,
                         "frechet_distance_ci95": [fd - 1.96 * fd_se, fd + 1.96 * fd_se],
                         "class_accuracy": class_accuracy(images, labels), "seconds": secs}}
        m = results[name]["measured"]
        log(f"{name:16s} tokens/call {m['tokens_per_call']:.3f} (pred {ren['tokens_per_call']:.3f}), "
            f"NLL {m['nll_per_token']:.4f}, FD {fd:.1f}, acc {m['class_accuracy']:.3f}")

    comparisons = []
    for k, tg in enumerate(targets):
        for tn, other in ((f"tuned@{k}", f"cool-sd@{k}"), (f"tuned@{k}", f"uniform-rsd@{k}"), (f"tuned@{k}", "vanilla"),
                          (f"tuned-exp@{k}", f"cool-sd@{k}"), (f"tuned-exp@{k}", f"tuned@{k}")):
            (fa, na), (fb, nb) = ar_feats[tn], ar_feats[other]
            ta, tb = results[tn]["measured"], results[other]["measured"]
            comparisons.append({
                "target_index": k, "tuned": tn, "other": other,
                "tokens_per_call": {"tuned": ta["tokens_per_call"], "other": tb["tokens_per_call"],
                                    "z": (ta["tokens_per_call"] - tb["tokens_per_call"]) /
                                    math.hypot(ta["tokens_per_call_se"], tb["tokens_per_call_se"])},
                "nll_per_token_paired": paired(na, nb),
                "frechet_distance_paired": fd_paired(fa, fb, a.n_boot, a.seed + 7 + k),
                "class_accuracy": {"tuned": ta["class_accuracy"], "other": tb["class_accuracy"]},
                "predicted_bound": {"tuned": results[tn]["predicted"]["bound"], "other": results[other]["predicted"]["bound"]}})
    at_speed = {}
    for name in [n for n in results if n.startswith("tuned")]:
        at_speed[name] = {base: interpolate(results, base, results[name]["measured"]) for base in ("cool-sd", "uniform-rsd")}
    log("comparisons done; frontier ...")

    fsub = rows.subset(np.sort(np.random.default_rng(a.seed + 1).choice(rows.R, min(rows.R, a.frontier_rounds), replace=False)))
    front = tune.frontier(fsub, n_points=a.frontier_points, lo=0.1, hi=0.8, seed=a.seed, search_rounds=None, maxiter=40)
    deltas = [1.1, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]
    front["cool-sd (named, delta grid)"] = [
        {"delta": d, **{k2: tune.predict(fsub, rules.cool_sd(d, 0.7))[k1] for k1, k2 in
                        (("tokens_per_call", "tokens_per_call"), ("bound_mean", "bound"))}} for d in deltas]
    log("frontier done")

    report = {"command": "python scripts/tuned_study.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "n_images": N, "L": L, "draft": "small", "processing": {"temperature": 1.0, "cfg_scale": 2.0},
              "rounds_recorded": rows.R, "vanilla_predicted_tokens_per_drafted_round": van_pt,
              "max_predicted_tokens_per_drafted_round": top, "targets": targets, "results": results,
              "comparisons": comparisons, "at_measured_speed": at_speed, "validation": {str(k): v for k, v in validation.items()},
              "frontier": front, "frontier_rounds": fsub.R, "wall_clock_s": time.perf_counter() - t0,
              "torch_threads": 1}
    write_text(out / "report.json", json.dumps(report, indent=1) + "\n")
    figure(report, out / "frontier.png")
    write_text(out / "report.md", markdown(report))
    log(f"wrote {out}")


def figure(rep: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    fr = rep["frontier"]
    for fam in tune.FAMILIES + ("cool-sd (named, delta grid)",):
        pts = fr.get(fam)
        if pts:
            ax[0].plot([p["tokens_per_call"] for p in pts], [p["bound"] for p in pts], "o-" if fam in tune.FAMILIES else "s--",
                       label=fam, ms=4)
    ax[0].set_xlabel("predicted tokens per drafted round (1 + T10)")
    ax[0].set_ylabel("predicted TV bound per round (T11)")
    ax[0].set_title(f"predicted frontier per family ({rep['frontier_rounds']} recorded rounds)")
    ax[0].legend(fontsize=8)
    colors = {"tuned": "C0", "tuned-exp": "C4", "cool-sd": "C1", "uniform-rsd": "C2", "vanilla": "k"}
    for name, r in rep["results"].items():
        base = name.split("@")[0]
        m = r["measured"]
        ax[0].plot(r["predicted"]["tokens_per_drafted_round"], r["predicted"]["bound"], "x", color=colors[base], ms=8)
        ax[1].errorbar(m["tokens_per_call"], m["nll_per_token"], xerr=m["tokens_per_call_se"], yerr=m["nll_per_token_se"],
                       fmt="o", color=colors[base], label=base if "@0" in name or name == "vanilla" else None)
    ax[1].set_xlabel("measured tokens per target call")
    ax[1].set_ylabel("target NLL per token (measured)")
    ax[1].set_title("measured: speed vs quality (same digits)")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    with atomic_file(path) as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)


def markdown(rep: dict) -> str:
    r = rep["results"]
    lines = ["# Schedules tuned to the MNIST models vs Cool-SD and UniformRSD", "",
             f"Command: `{rep['command']}`; wall clock {rep['wall_clock_s']:.0f} s (2 shared CPU cores, 1 torch thread).", "",
             f"Shipped MNIST target with the small draft, L = {rep['L']}, temperature 1, CFG 2; {rep['n_images']} digits per "
             f"rule (class i mod 10, seed i, the same digits for every rule). Predictions come only from the vanilla run's "
             f"{rep['rounds_recorded']} recorded rounds: *per drafted round* = 1 + mean T10 (the quantity the tuner "
             f"targets), *renewal* = tokens per target call with the end-of-image rounds (coolsd.studies.demo.chain_prediction), "
             f"bound = mean T11 per round. Tuned = free weights minimising the predicted bound at the target (theory.likelihood.tune, "
             f"G*); Cool-SD (norm {rules.COOL_SD_NORM}, nu = 0.7) and UniformRSD have their delta / c solved for the same "
             f"predicted speed. Quality: target NLL per token (SE over digits), Frechet distance to held-out digits "
             f"(bootstrap SE), class accuracy.", "",
             "| rule | params | pred. tokens/drafted round (95% CI) | pred. tokens/call (renewal) | measured tokens/call (SE) | pred. bound (95% CI) | NLL/token (SE) | FD (SE) | class acc |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, x in r.items():
        p, m = x["predicted"], x["measured"]
        par = ", ".join(f"{k}={np.round(v, 3).tolist() if isinstance(v, list) else (round(v, 3) if isinstance(v, float) else v)}"
                        for k, v in x["params"].items() if k != "target")
        lines.append(f"| {name} | {par} | {p['tokens_per_drafted_round']:.3f} ({p['tokens_per_drafted_round_ci95'][0]:.3f}-"
                     f"{p['tokens_per_drafted_round_ci95'][1]:.3f}) | {p['tokens_per_call_renewal']:.3f} | {m['tokens_per_call']:.3f} "
                     f"({m['tokens_per_call_se']:.3f}) | {p['bound']:.4f} ({p['bound_ci95'][0]:.4f}-{p['bound_ci95'][1]:.4f}) | "
                     f"{m['nll_per_token']:.4f} ({m['nll_per_token_se']:.4f}) | {m['frechet_distance']:.1f} ({m['frechet_distance_se']:.1f}) | "
                     f"{m['class_accuracy']:.3f} |")
    lines += ["", "## Tuned vs the others at the same target (paired over the same digits)", "",
              "| target | tuned vs | tokens/call tuned / other (z) | NLL diff (SE, z) | FD diff (paired 95% CI) | predicted bound tuned / other |",
              "|---|---|---|---|---|---|"]
    for c in rep["comparisons"]:
        t, n, f = c["tokens_per_call"], c["nll_per_token_paired"], c["frechet_distance_paired"]
        lines.append(f"| {rep['targets'][c['target_index']]:.3f} | {c['other']} | {t['tuned']:.3f} / {t['other']:.3f} ({t['z']:+.1f}) | "
                     f"{n['difference']:+.4f} ({n['se']:.4f}, {n['z']:+.1f}) | {f['difference']:+.1f} ({f['ci95'][0]:+.1f}, {f['ci95'][1]:+.1f}) | "
                     f"{c['predicted_bound']['tuned']:.4f} / {c['predicted_bound']['other']:.4f} |")
    lines += ["", "## At the same measured tokens per call: NLL of the tuned rule minus the other rule's NLL interpolated "
              "(linearly, between its runs and vanilla) at the tuned rule's measured tokens per call (unpaired z)", "",
              "| tuned run | measured tokens/call | NLL | vs cool-sd: interp. NLL, diff (z) | vs uniform-rsd: interp. NLL, diff (z) |",
              "|---|---|---|---|---|"]
    for name, d in rep["at_measured_speed"].items():
        m = rep["results"][name]["measured"]
        cells = []
        for base in ("cool-sd", "uniform-rsd"):
            x = d[base]
            cells.append("outside range" if x["nll_interpolated"] is None else
                         f"{x['nll_interpolated']:.4f}, {x['difference']:+.4f} ({x['z']:+.1f})")
        lines.append(f"| {name} | {m['tokens_per_call']:.3f} | {m['nll_per_token']:.4f} | {cells[0]} | {cells[1]} |")
    lines += ["", "## Honest validation: fit on half of the digits, predict on the other half", "",
              "| target | weights (fit half) | in-sample tokens / bound | held-out tokens (95% CI) | held-out bound (95% CI) | gap tokens / bound |",
              "|---|---|---|---|---|---|"]
    for k, v in rep["validation"].items():
        h = v["heldout"]
        lines.append(f"| {rep['targets'][int(k)]:.3f} | {np.round(v['values'], 3).tolist()} | {v['in_sample']['tokens_per_call']:.3f} / "
                     f"{v['in_sample']['bound']:.4f} | {h['tokens_per_call']:.3f} ({h['tokens_per_call_ci95'][0]:.3f}-{h['tokens_per_call_ci95'][1]:.3f}) | "
                     f"{h['bound']:.4f} ({h['bound_ci95'][0]:.4f}-{h['bound_ci95'][1]:.4f}) | {v['gap']['tokens_per_call']:+.3f} / {v['gap']['bound']:+.4f} |")
    fr = rep["frontier"]
    lines += ["", f"## Predicted frontier per family ({rep['frontier_rounds']} recorded rounds; bound at each target)", "",
              "| family | " + " | ".join(f"{t:.3f}" for t in fr["targets"]) + " |", "|---|" + "---|" * len(fr["targets"])]
    for fam in tune.FAMILIES:
        lines.append(f"| {fam} | " + " | ".join(f"{p['bound']:.4f}" for p in fr[fam]) + " |")
    lines += ["", "![frontier](frontier.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
