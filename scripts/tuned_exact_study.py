"""The decisive experiment of issue 37 (docs/results/tuned_exact/): schedules tuned on the EXACT law against Cool-SD.

On the shipped MNIST models (EAGLE drafter, L = 4, CFG 2), at three target speeds (predicted tokens per call):

* ``kl-free``     the free per-position weights minimising KL(P||P^) per token (``theory.likelihood.exact_tune``);
* ``kl-entropy``  the row-conditioned family w_i(p) = c_i exp(b H(p)) minimising the same;
* ``cool-sd``     Cool-SD (nu = 0.7, offset normalisation) with delta solved for the same predicted speed;
* ``uniform-rsd`` UniformRSD with c solved likewise;
* ``bound-free``  the old tuner's schedule (free weights minimising the per-round T11 bound, section 8b).

Tuning uses one set of plain-AR images with their teacher-forced rows (``--ar-rows``, fit/held-out split) and one
recorded vanilla run (``--record``, speed); the measurement uses FRESH images on other seeds: ``--images`` per setting
(tokens per call; KL(P^||P) per token and TV from the setting's own images, exactly: ``coolsd.studies.sweep.fidelity.
score_images``) and ``--images`` fresh plain-AR images (KL(P||P^) per token under every setting's rule). Cool-SD is
also run at two more deltas (``EXTRA``), so that every setting is compared with Cool-SD at equal MEASURED tokens per
call (linear interpolation between the two nearest Cool-SD points; z = difference / SE, the SE combining the setting's
KL SE, the interpolated Cool-SD SE and the tokens per call's SEs of all three points through the interpolation: the
delta method of ``coolsd.studies.sweep.metrics.frontier_difference``).

Resumable: every unit (schedules, each setting's images and scores, the AR scores) is cached under ``--out`` and
reused. Writes ``report.json`` (the contract keys of issue 37), ``report.md``, ``kl_vs_tokens_per_call.png``.

  python scripts/tuned_exact_study.py --out /work/runs/tuned_exact --ar-rows AR.npz --record REC.npz --images 2000
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

TARGETS = (3.0, 3.4, 3.8)
EXTRA = (2.8, 4.0)           # further Cool-SD points for the interpolation
FAMILIES = ("kl-free", "kl-entropy", "cool-sd", "uniform-rsd", "bound-free")
Z = 1.959963984540054


def _save(path: Path, **arrays) -> None:
    from coolsd.io import atomic_file

    with atomic_file(path) as fh:
        np.savez(fh, **arrays)


def solve(sm, make_rule, lo: float, hi: float, target: float, L: int) -> float:
    """The parameter of a one-parameter rule whose predicted tokens per call (``sm``) is ``target`` (bisection in log
    space; the speed grows with the parameter)."""
    from scipy.optimize import brentq

    return float(math.exp(brentq(lambda s: predicted_speed(sm, make_rule(math.exp(s)), L) - target, math.log(lo),
                                 math.log(hi), xtol=1e-10)))


def predicted_speed(sm, rule, L: int) -> float:
    """Tokens per call of a scaled rule (weights from its schedule) predicted from the recorded vanilla rounds, the
    tuner's speed scale (``theory.likelihood.speed.SpeedModel``)."""
    w = np.array([rule.accept.schedule(np.float64(i + 1.0), np) for i in range(L)])
    return float(sm.tokens_per_call(sm.f_scaled(w[None, :])))


def schedules(out: Path, ar, rec, targets, extra=EXTRA, bound: bool = True) -> dict:
    """{setting name: {"rule": verifier, "target", "family", "params"}} for every target (cached in schedules.json)."""
    from theory import rules
    from theory.likelihood import exact_tune, speed

    path = out / "schedules.json"
    if path.exists():
        saved = json.loads(path.read_text())
    else:
        saved = {}
        sm = speed.SpeedModel(rec)
        L = rec.L
        for t in targets:
            for fam, family, objective in (("kl-free", "free", "kl"), ("kl-entropy", "entropy", "kl"),
                                           ("bound-free", "free", "bound"))[:3 if bound else 2]:
                r = exact_tune.tune_exact(ar if objective != "bound" else ar, rec, family, objective, tokens_per_call=t)
                saved[f"{fam}@{t}"] = {"family": fam, "target": t, "schedule": r.to_dict()}
                print(f"tuned {fam} at {t}: {r.to_dict().get('weights')}", flush=True)
        for t in (*targets, *extra):
            delta = solve(sm, lambda d: rules.cool_sd(d), 1.0 + 1e-9, 1e4, t, L)
            saved[f"cool-sd@{t}"] = {"family": "cool-sd", "target": t, "schedule": {"delta": delta, "nu": 0.7}}
        for t in targets:
            c = solve(sm, lambda c: rules.uniform_rsd(c), 1.0 + 1e-9, 1e4, t, L)
            saved[f"uniform-rsd@{t}"] = {"family": "uniform-rsd", "target": t, "schedule": {"c": c}}
        path.write_text(json.dumps(saved, indent=1))
    return saved


def rule_of(entry: dict):
    """The verifier of a saved setting."""
    from theory import rules
    from theory.likelihood import objective

    s, fam = entry["schedule"], entry["family"]
    if fam == "cool-sd":
        return rules.cool_sd(s["delta"], s["nu"])
    if fam == "uniform-rsd":
        return rules.uniform_rsd(s["c"])
    family = "entropy" if fam == "kl-entropy" else "free"
    return objective.rule_of(family, np.asarray(s["theta"]), 4)


def params_of(entry: dict) -> dict:
    s = entry["schedule"]
    keep = ("weights", "slope", "feature", "delta", "nu", "c", "theta")
    return {k: s[k] for k in keep if k in s}


def run_setting(out: Path, name: str, rule, bundle, proc, n: int, seed: int, batch: int) -> dict:
    """Generate ``n`` fresh images of the setting and score them exactly (cached in unit_<name>.npz)."""
    import torch

    from coolsd.studies.sweep.fidelity import score_images
    from real.decode import engine

    path = out / f"unit_{name}.npz"
    if path.exists():
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    t0 = time.perf_counter()
    conds = _conds(n, seed, n_classes(bundle))
    gens = engine.generate(bundle.target, bundle.draft, conds, num_tokens=bundle.num_tokens, verifier=rule,
                           drafting=4, processing=proc, seed=seed, batch_size=batch)
    tokens = torch.stack([g.tokens for g in gens]).numpy()
    rounds = np.array([len(g.rounds) for g in gens])
    sc = score_images(bundle.target, bundle.draft, conds, tokens, {"r": rule}, 4, proc)
    arrays = {"tokens": tokens, "rounds": rounds, "log_p": sc["log_p"], "log_p_hat": sc["log_p_hat"]["r"],
              "seconds": np.array(time.perf_counter() - t0), "seed": np.array(seed)}
    _save(path, **arrays)
    print(f"{name}: {n} images in {time.perf_counter() - t0:.0f} s", flush=True)
    return arrays


def _conds(n: int, seed: int, classes: int = 10) -> list:
    """Balanced class conditions, shuffled by ``seed`` (each of the model's ``classes`` classes about n / classes
    times: 10 MNIST digits, 16 natural256 sources)."""
    return [int(c) for c in np.random.default_rng(seed).permutation(np.arange(n) % classes)]


def n_classes(bundle) -> int:
    """The class-conditional target's class count (the CFG null class excluded), as the sweep reads it."""
    return int(bundle.target.config.num_classes)


def run_ar(out: Path, rules_by_name: dict, bundle, proc, n: int, seed: int, batch: int) -> dict:
    """Fresh plain-AR images and, for every setting's rule, their exact log P^ (cached in ar.npz; rules added later
    are scored on the cached images and merged in)."""
    import torch

    from coolsd.studies.sweep.fidelity import score_images
    from real.decode import engine

    path = out / "ar.npz"
    t0 = time.perf_counter()
    conds = _conds(n, seed, n_classes(bundle))
    if path.exists():
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
    else:
        gens = engine.generate(bundle.target, None, conds, num_tokens=bundle.num_tokens, processing=proc, seed=seed,
                               batch_size=batch)
        arrays = {"tokens": torch.stack([g.tokens for g in gens]).numpy(), "seed": np.array(seed)}
    missing = {k: r for k, r in rules_by_name.items() if f"lph_{k}" not in arrays}
    if missing or "log_p" not in arrays:
        sc = score_images(bundle.target, bundle.draft, conds, arrays["tokens"], missing or {}, 4, proc)
        arrays.update({"log_p": sc["log_p"], **{f"lph_{k}": v for k, v in sc["log_p_hat"].items()},
                       "seconds": np.array(float(arrays.get("seconds", 0.0)) + time.perf_counter() - t0)})
        _save(path, **arrays)
        print(f"AR: {n} images scored under {len(missing)} more rules in {time.perf_counter() - t0:.0f} s", flush=True)
    return arrays


def measure(u: dict, ar: dict, key: str, T: int) -> dict:
    """The setting's measured figures with 95% intervals."""
    from coolsd.studies.sweep.metrics import tokens_per_call
    from theory.likelihood import fidelity

    tpc, se = tokens_per_call(u["rounds"], T)
    kl = fidelity.kl_sd(u["log_p_hat"], u["log_p"], T=T)
    kla = fidelity.kl_ar(ar[f"lph_{key}"], ar["log_p"], T=T)
    tv = fidelity.tv_sd(u["log_p_hat"], u["log_p"])
    return {"tokens_per_call": {"measured": tpc, "ci": [tpc - Z * se, tpc + Z * se], "se": se},
            "kl_per_token": {"measured": kl["per_token"]["measured"], "ci": kl["per_token"]["ci"], "se": kl["se"] / T},
            "kl_ar_per_token": {"measured": kla["per_token"]["measured"], "ci": kla["per_token"]["ci"],
                                "se": kla["se"] / T},
            "tv": {"measured": tv["measured"], "ci": tv["ci"], "se": tv["se"]}}


def verdicts(settings: list[dict]) -> list[dict]:
    """Each non-Cool-SD setting against Cool-SD interpolated (linearly, between its two nearest measured points;
    continued past its ends, marked "extrapolated") at the setting's measured tokens per call; KL(P^||P) per token.
    The SE counts both axes' errors (``coolsd.studies.sweep.metrics.frontier_difference``)."""
    from coolsd.studies.sweep.metrics import frontier_difference

    cool = sorted((s for s in settings if s["family"] == "cool-sd"), key=lambda s: s["tokens_per_call"]["measured"])
    cx, cxse = [c["tokens_per_call"]["measured"] for c in cool], [c["tokens_per_call"]["se"] for c in cool]
    ck, ckse = [c["kl_per_token"]["measured"] for c in cool], [c["kl_per_token"]["se"] for c in cool]
    out = []
    for s in settings:
        if s["family"] == "cool-sd":
            continue
        x, sx = s["tokens_per_call"]["measured"], s["tokens_per_call"]["se"]
        k, sk = s["kl_per_token"]["measured"], s["kl_per_token"]["se"]
        r = frontier_difference(cx, ck, ckse, [x], [k], [sk], cxse, [sx], extrapolate=True)
        d, se = -r["difference"], r["se"]       # the setting minus Cool-SD
        z = d / se
        k_cool = k - d
        v = ("a lower KL" if z < -Z else "b lower KL" if z > Z else "no significant difference") + \
            ("" if cx[0] <= x <= cx[-1] else " (extrapolated)")
        out.append({"a": s["name"], "b": "cool-sd (interpolated along delta)", "target": s["target_tokens_per_call"],
                    "delta_kl_per_token": d, "se": se, "z": z, "verdict": v, "a_tokens_per_call": x,
                    "b_kl_per_token": k_cool, "relative": d / k_cool})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ar-rows", required=True, help="plain-AR rows for tuning (coolsd tune --save-ar-rows)")
    ap.add_argument("--record", required=True, help="a recorded vanilla run (coolsd generate --record)")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1000, help="fresh images: settings use seed + i, the AR images seed - 1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="mnist", help="a registered model with an EAGLE head (mnist, natural256)")
    ap.add_argument("--targets", type=float, nargs="+", default=list(TARGETS), help="target tokens per call")
    ap.add_argument("--extra", type=float, nargs="*", default=list(EXTRA), help="further Cool-SD points")
    ap.add_argument("--no-bound", action="store_true", help="skip the per-round-bound tuner (bound-free)")
    ap.add_argument("--only-cached", action="store_true",
                    help="report the settings whose images are already generated (unit_*.npz), list the others in "
                         "config.not_run (a time-boxed run)")
    a = ap.parse_args(argv)
    import torch

    from coolsd.rowfiles import _processing
    from real.registry import build
    from theory.likelihood.arrows import load_ar_rows, load_record

    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    ar_fit, rec = load_ar_rows(a.ar_rows), load_record(a.record)
    saved = schedules(out, ar_fit, rec, tuple(a.targets), tuple(a.extra), bound=not a.no_bound)
    bundle = build(a.model, draft="eagle")
    proc = _processing(bundle)
    T = bundle.num_tokens
    names = sorted(saved, key=lambda k: (saved[k]["target"], FAMILIES.index(saved[k]["family"])))
    not_run = [k for k in names if a.only_cached and not (out / f"unit_{k.replace('@', '_')}.npz").exists()]
    names = [k for k in names if k not in not_run]
    rules_by = {k: rule_of(saved[k]) for k in names}
    units = {}
    for i, k in enumerate(names):     # a loop over the settings, each one engine call and its scoring
        units[k] = run_setting(out, k.replace("@", "_"), rules_by[k], bundle, proc, a.images, a.seed + 1 + i,
                               a.batch_size)
    ar = run_ar(out, {k.replace("@", "_"): r for k, r in rules_by.items()}, bundle, proc, a.images, a.seed - 1,
                a.batch_size)
    held = np.sort(np.random.default_rng(0).permutation(ar_fit.n)[int(round(0.5 * ar_fit.n)):])
    settings = []
    from theory.likelihood import fidelity, log_likelihood, log_target

    h = ar_fit.subset(held)
    lp_h = log_target(h.p, h.tokens)
    from theory.likelihood import speed

    sm = speed.SpeedModel(rec)
    for k in names:
        e = saved[k]
        rule = rules_by[k]
        lph = np.concatenate([log_likelihood(h.p[s:s + 100], h.q[s:s + 100], h.tokens[s:s + 100], rule, 4,
                                             convention=h.convention) for s in range(0, h.n, 100)])
        pred_kl = fidelity.kl_ar(lph, lp_h, T=T)["per_token"]["measured"]
        pred_tpc = e["schedule"].get("predicted_tokens_per_call") or predicted_speed(sm, rule, 4)
        m = measure(units[k], ar, k.replace("@", "_"), T)
        m["tokens_per_call"]["predicted"] = pred_tpc
        m["kl_per_token"]["predicted"] = pred_kl
        settings.append({"name": k, "family": e["family"], "target_tokens_per_call": e["target"],
                         "weights": params_of(e), **m, "n_images": int(len(units[k]["tokens"])),
                         "seeds": {"images": int(units[k]["seed"]), "ar_images": int(ar["seed"])}})
    rep = {"settings": settings, "verdicts": verdicts(settings),
           "config": {"model": a.model, "draft": "eagle", "L": 4, "cfg_scale": proc.cfg_scale, "images": a.images,
                      "targets": list(a.targets), "cool_sd_extra": list(a.extra), "ar_rows": str(a.ar_rows),
                      "record": str(a.record), "ar_rows_stamp": ar_fit.stamp, "not_run": not_run},
           "wall_seconds": time.time() - t_start}
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=float))
    (out / "report.md").write_text(markdown(rep))
    figure(out / "kl_vs_tokens_per_call.png", rep)
    print(markdown(rep))
    return 0


def markdown(rep: dict) -> str:
    c = rep["config"]
    lines = [f"# Schedules tuned on the exact law vs Cool-SD ({c['model']}, EAGLE, L = 4, CFG {c['cfg_scale']:g})", "",
             "| setting | target | tokens/call measured (predicted) | KL(P^\\|\\|P)/token [95% CI] (predicted KL(P\\|\\|P^)) "
             "| KL(P\\|\\|P^)/token [95% CI] | TV [95% CI] |", "|---|---|---|---|---|---|"]
    for s in rep["settings"]:
        t, k, ka, tv = s["tokens_per_call"], s["kl_per_token"], s["kl_ar_per_token"], s["tv"]
        lines.append(f"| {s['name']} | {s['target_tokens_per_call']} | {t['measured']:.3f} ({t['predicted']:.3f}) | "
                     f"{k['measured']:.4f} [{k['ci'][0]:.4f}, {k['ci'][1]:.4f}] ({k['predicted']:.4f}) | "
                     f"{ka['measured']:.4f} [{ka['ci'][0]:.4f}, {ka['ci'][1]:.4f}] | "
                     f"{tv['measured']:.3f} [{tv['ci'][0]:.3f}, {tv['ci'][1]:.3f}] |")
    lines += ["", "Verdicts at equal measured tokens per call (Cool-SD interpolated along delta; KL(P^||P) per token):", "",
              "| a | target | a's tokens/call | KL a - KL cool-sd | SE | z | relative | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for v in rep["verdicts"]:
        lines.append(f"| {v['a']} | {v['target']} | {v['a_tokens_per_call']:.3f} | {v['delta_kl_per_token']:+.5f} | "
                     f"{v['se']:.5f} | {v['z']:+.2f} | {100 * v['relative']:+.1f}% | {v['verdict']} |")
    return "\n".join(lines) + "\n"


def figure(path: Path, rep: dict) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for fam, mk in zip(FAMILIES, "osD^v"):
        ss = sorted((s for s in rep["settings"] if s["family"] == fam), key=lambda s: s["tokens_per_call"]["measured"])
        x = [s["tokens_per_call"]["measured"] for s in ss]
        y = [s["kl_per_token"]["measured"] for s in ss]
        e = [Z * s["kl_per_token"]["se"] for s in ss]
        ax.errorbar(x, y, yerr=e, fmt=mk + ("-" if fam == "cool-sd" else ""), capsize=3, label=fam)
    ax.set_xlabel("measured tokens per target call")
    ax.set_ylabel("KL(P^||P) per token (nats, 95% CI)")
    ax.set_title("exact fidelity at equal speed: tuned schedules vs Cool-SD")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
