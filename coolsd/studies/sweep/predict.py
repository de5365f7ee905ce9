"""``coolsd sweep --predict``: the whole frontier of a grid predicted from plain-AR images and one recorded vanilla run,
with no generation under any relaxed rule (issue 37; docs/theory.md sections 8, 11).

* Speed: tokens per target call of every setting from the recorded vanilla rounds (T10 with the renewal weighting
  of ``coolsd.studies.demo.chain_prediction`` / ``tree_prediction``: the same predictions a measured sweep prints).
* Fidelity: KL(P||P^) per token and TV(P^, P) = E_P[(1 - P^/P)_+] with 95% intervals, exactly, from the plain-AR
  images' teacher-forced rows under every setting's rule (``fidelity.score_images``: the rows of a chunk of images
  once, the recursion per rule); KL(P^||P) needs images of the setting itself (importance weights P^/P on AR images
  have an effective sample size of a few percent at 49 tokens), so it is not predicted.
* The per-image bound: predicted rounds per image (T / tokens per call) times the mean T11 term per recorded round.

On CUDA the chain recursion runs on the rows' own tensors on the GPU (``fidelity.score_images(on_device=True)``; the
rules' tables there too); on CPU on numpy views. The AR images are scored in chunks of ``CHUNK`` images (bounded
memory), dealt to the ranks and cached in the store
(``DIR/predict/ar_<i>.npz``, keyed by the grid, the chunk and the code version), so an interrupted run resumes and the
rows of an image are computed once. Writes ``predicted.json``, ``predicted.md`` and ``predicted_*.png`` beside a
measured sweep's ``report.*``; with ``--measured`` (a measured sweep's report.json of the same grid) the report also
draws and tabulates predicted against measured on both axes.
"""
from __future__ import annotations

import io
import json
import math
import time

import numpy as np

from .run import AR, Context, SweepConfig, Unit
from .store import Store

__all__ = ["shard", "analyse", "compare", "CHUNK", "FORMAT"]

CHUNK = 200        # AR images scored per cached chunk
FORMAT = 1
DEVICE_RECURSION = False   # chains: the recursion on the rows' torch tensors even on CPU (as on CUDA; the tests set it)


def _path(i: int) -> str:
    return f"predict/ar_{i}.npz"


def _want(cfg: SweepConfig, ctx: Context, i: int, n: int) -> dict:
    return {"format": FORMAT, "grid": [s.key for s in cfg.settings], "chunk": i, "images": n,
            "code_version": ctx.code_version}


def _cached(store: Store, cfg, ctx, i: int, n: int) -> dict | None:
    path = store.root / _path(i)
    if not path.exists():
        return None
    try:
        with np.load(path) as z:
            if json.loads(str(z["meta"])) != _want(cfg, ctx, i, n):
                return None
            return {k: z[k] for k in z.files if k != "meta"}
    except (OSError, ValueError, KeyError):
        return None                               # damaged: recompute and overwrite


def _chunks(cfg: SweepConfig) -> list[tuple[int, int, int]]:
    return [(i, a, min(a + CHUNK, cfg.images)) for i, a in enumerate(range(0, cfg.images, CHUNK))]


def shard(store: Store, cfg: SweepConfig, ctx: Context, rank: int, world: int, load) -> int:
    """Score this rank's chunks of AR images under every setting's rule (cached). Returns the chunks it holds."""
    from . import fidelity
    from .store import atomic_write_bytes

    mine = _chunks(cfg)[rank::world]
    todo = [c for c in mine if _cached(store, cfg, ctx, c[0], c[2] - c[1]) is None]
    if not todo:
        return len(mine)
    ar = load(store, cfg, Unit(None, 0))
    import torch

    mode = fidelity.tree_mode(ctx)
    on_device = mode is None and (torch.device(ctx.device).type != "cpu" or DEVICE_RECURSION)
    rules = {s.key: ctx.verifier(s) if on_device else fidelity.rule_of(ctx, s) for s in cfg.settings}
    reasons = {s.key: fidelity.reason(ctx, s, rules[s.key]) for s in cfg.settings}
    for s in cfg.settings:          # the AR images were sampled under ctx.proc: other processing has no AR law here
        if reasons[s.key] is None and fidelity.proc_of(ctx, s) != ctx.proc:
            reasons[s.key] = ("the setting's processing differs from the AR images' (greedy rows): no AR sample of its "
                              "target law")
    scored = {k: r for k, r in rules.items() if reasons[k] is None}
    for i, a, b in todo:            # a loop over this rank's chunks of AR images
        sc = fidelity.score_images(ctx.bundle.target, ctx.bundle.draft, fidelity.conds_of(ctx, np.arange(a, b)),
                                   ar["tokens"][a:b], scored, ctx.L, ctx.proc, drafting=mode, on_device=on_device)
        keys = sorted(scored)
        buf = io.BytesIO()
        np.savez(buf, meta=np.array(json.dumps(_want(cfg, ctx, i, b - a))), log_p=sc["log_p"],
                 keys=np.array(json.dumps(keys)), reasons=np.array(json.dumps(reasons)),
                 log_p_hat=np.stack([sc["log_p_hat"][k] for k in keys]) if keys else np.zeros((0, b - a)))
        (store.root / "predict").mkdir(exist_ok=True)
        atomic_write_bytes(store.root / _path(i), buf.getvalue())
    return len(mine)


def _ar_arrays(store: Store, cfg, ctx) -> tuple[np.ndarray, dict, dict]:
    """(log P (n,), {key: log P^ (n,)}, {key: reason or None}) of the AR images, from the cached chunks."""
    lp, lph, reasons = [], {}, None
    for i, a, b in _chunks(cfg):
        z = _cached(store, cfg, ctx, i, b - a)
        if z is None:
            raise ValueError(f"predicted-sweep chunk {store.root / _path(i)} missing: rerun the command")
        lp.append(z["log_p"])
        for k, row in zip(json.loads(str(z["keys"])), z["log_p_hat"]):
            lph.setdefault(k, []).append(row)
        reasons = json.loads(str(z["reasons"]))
    return np.concatenate(lp), {k: np.concatenate(v) for k, v in lph.items()}, reasons


def analyse(store: Store, cfg: SweepConfig, ctx: Context, load) -> dict:
    """The predicted report: {"predicted": True, "methods": [...], "baseline": {...}} (module docstring)."""
    from coolsd.studies.demo import predict as demo
    from theory.likelihood import fidelity

    from . import analysis

    T = ctx.bundle.num_tokens
    lp, lph, reasons = _ar_arrays(store, cfg, ctx)
    van_setting = next(s for s in cfg.settings if s.method == "vanilla")
    van = load(store, _rec_cfg(cfg), Unit(van_setting, 0))
    source = analysis._vanilla_source(ctx, van)
    first = np.r_[True, van["round_image"][1:] != van["round_image"][:-1]]
    first_single = bool((van["round_drafted"][first] == 0).all())
    per_row = analysis._per_row(ctx.bundle, T)
    from .run import host_tables

    nb, cb = host_tables(ctx)
    nll = -lp / T
    entries = []
    chains = (demo.chain_predictions(source, {s.key: s.verifier(ctx.L, nb, cb) for s in cfg.settings}, ctx.L,
                                     first_single, T=T, per_row=per_row)
              if source is not None and ctx.tree is None else {})     # the recorded rounds read once for every rule
    for s in cfg.settings:      # a loop over settings: a prediction and a few reductions each
        pred = chains.get(s.key)
        if source is not None and ctx.tree is not None:
            pred = demo.tree_prediction(source, s.verifier(ctx.L, nb, cb), ctx.tree, T=T, per_row=per_row)
        e = {"name": s.method, "params": s.params_dict, "key": s.key, "family": s.family,
             "drafting": cfg.drafting_kind, "L": ctx.L, "images": int(lp.size),
             "tokens_per_call": {"predicted": pred["tokens_per_call"] if pred else None},
             "tv_bound_round": pred["tv_bound"] if pred else None,
             "tv_bound_image": (T / pred["tokens_per_call"] * pred["tv_bound"]) if pred else None,
             "kl_per_token": None, "kl_per_token_reason": ("KL(P^||P) needs the setting's own images (importance "
                                                           "weights on AR images are not used)")}
        if s.key in lph:
            kl = fidelity.kl_ar(lph[s.key], lp, T=T)
            tv = fidelity.tv_ar(lph[s.key], lp)
            e["kl_ar_per_token"] = ({"predicted": kl["per_token"]["measured"], "ci": kl["per_token"]["ci"],
                                     "se": kl["se"] / T} if kl["measured"] is not None else
                                    {"predicted": None, "reason": kl["reason"]})
            e["tv"] = {"predicted": tv["measured"], "ci": tv["ci"], "se": tv["se"]}
        else:
            e["kl_ar_per_token"] = e["tv"] = {"predicted": None, "reason": reasons.get(s.key)}
        entries.append(e)
    return {"predicted": True, "methods": entries,
            "baseline": {"name": AR, "images": int(lp.size), "nll_per_token": float(nll.mean()),
                         "nll_per_token_se": float(nll.std(ddof=1) / math.sqrt(nll.size))},
            "predictions_from": {"ar_images": int(lp.size), "record_images": int(cfg.record_images),
                                 "first_round_prefill_only": first_single}}


def vanilla_images(images: int, unit_images: int, record_images: int) -> int:
    """How many vanilla images a predicted sweep draws: whole units covering ``record_images``, at most ``images``."""
    return min(images, max(unit_images, -(-record_images // unit_images) * unit_images))


def _rec_cfg(cfg: SweepConfig) -> SweepConfig:
    """The config whose blocks hold the recorded vanilla images (a predicted sweep stores only those)."""
    from dataclasses import replace

    return replace(cfg, images=vanilla_images(cfg.images, cfg.unit_images, cfg.record_images))


def compare(pred: dict, measured: dict) -> dict:
    """Predicted against measured, setting by setting (by key): tokens per call (relative difference), TV from AR
    images inside the measured TV's 95% interval, and the rank correlation of predicted KL(P||P^) with measured
    KL(P^||P) per token."""
    from scipy.stats import spearmanr

    meas = {m["key"]: m for m in measured.get("methods", []) if isinstance(m, dict) and "key" in m}
    rows, inside, n_tv = [], 0, 0
    kp, km = [], []
    for e in pred["methods"]:
        m = meas.get(e["key"])
        if m is None:
            continue
        t_p, t_m = e["tokens_per_call"]["predicted"], (m.get("accepted_length") or {}).get("measured")
        tv_m = m.get("tv_to_target") or {}
        kl_m = (m.get("kl_to_target") or {}).get("per_token") or {}
        ci = tv_m.get("ci")
        r = {"key": e["key"], "tokens_per_call_predicted": t_p, "tokens_per_call_measured": t_m,
             "tokens_per_call_rel": None if t_p is None or not t_m else t_p / t_m - 1,
             "tv_predicted": e["tv"].get("predicted"), "tv_measured": tv_m.get("measured"),
             "tv_measured_ci": ci if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci else None,
             "kl_ar_predicted": e["kl_ar_per_token"].get("predicted"), "kl_sd_measured": kl_m.get("measured")}
        r["missing"] = [f for f, v in (("measured tokens per call", t_m), ("measured TV", r["tv_measured"]),
                                       ("measured TV's 95% CI", r["tv_measured_ci"]),
                                       ("measured KL per token", r["kl_sd_measured"])) if v is None]
        if r["tv_predicted"] is not None and r["tv_measured_ci"]:
            n_tv += 1
            r["tv_inside"] = bool(r["tv_measured_ci"][0] <= r["tv_predicted"] <= r["tv_measured_ci"][1])
            inside += r["tv_inside"]
        if r["kl_ar_predicted"] is not None and r["kl_sd_measured"] is not None:
            kp.append(r["kl_ar_predicted"])
            km.append(r["kl_sd_measured"])
        rows.append(r)
    rel = [abs(r["tokens_per_call_rel"]) for r in rows if r["tokens_per_call_rel"] is not None]
    rho = spearmanr(kp, km) if len(kp) >= 3 else None
    rho_ok = rho is not None and rho.statistic == rho.statistic            # NaN: constant values, no ranking
    return {"settings": rows, "measured_settings": len(meas), "tokens_per_call_max_rel": max(rel) if rel else None,
            "tokens_per_call_within_2pct": sum(x <= 0.02 for x in rel), "tv_inside_measured_ci": inside,
            "tv_compared": n_tv, "kl_rank_correlation": float(rho.statistic) if rho_ok else None,
            "kl_rank_correlation_p": float(rho.pvalue) if rho_ok else None, "kl_compared": len(kp)}


def _ci(ci, fmt: str) -> str:
    """[lo, hi], or a note where the interval is missing (too few images for one)."""
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
        return f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]"
    return "[no CI: too few images]"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _comparison_summary(cmp: dict) -> str:
    """One paragraph of the comparison, each figure or why it is not there (a small or partial measured report)."""
    n = len(cmp["settings"])
    parts = [f"{n} of the predicted settings are in the measured report"]
    rel = cmp["tokens_per_call_max_rel"]
    parts.append(f"tokens per call within 2% for {cmp['tokens_per_call_within_2pct']} of {n} settings (largest "
                 f"difference {100 * rel:.2f}%)" if rel is not None else "tokens per call: not compared (the measured "
                 "report has no measured tokens per call for these settings)")
    parts.append(f"predicted TV inside the measured TV's 95% interval for {cmp['tv_inside_measured_ci']} of "
                 f"{cmp['tv_compared']}" if cmp["tv_compared"] else "TV: not compared (no measured TV with a 95% "
                 "interval in the measured report)")
    rho = cmp["kl_rank_correlation"]
    parts.append(f"rank correlation of the predicted KL(P||P^) with the measured KL(P^||P) {rho:.3f} (Spearman, n = "
                 f"{cmp['kl_compared']})" if rho is not None else f"KL rank correlation: not computed (it needs at "
                 f"least 3 settings with both KLs and distinct values; {cmp['kl_compared']} have both)")
    return "; ".join(parts) + "."


def markdown(rep: dict) -> str:
    """predicted.md: the predicted frontier (and the comparison with a measured sweep)."""
    c = rep["config"]
    lines = [f"# Predicted frontier: {c['model']}, {c['drafting']} drafting (L = {c['L']}), predicted from "
             f"{rep['predictions_from']['ar_images']} plain-AR images and {rep['predictions_from']['record_images']} "
             "recorded vanilla images", "",
             "No image was generated under a relaxed rule. KL per token is the fidelity axis (whole-image TV saturates "
             "with length: 1 - TV shrinks geometrically with the tokens, KL grows about linearly).", "",
             "| setting | tokens/call | KL(P\\|\\|P^)/token [95% CI] | TV from AR images [95% CI] | per-image bound |",
             "|---|---|---|---|---|"]
    for e in rep["methods"]:
        t = e["tokens_per_call"]["predicted"]
        k, tv = e["kl_ar_per_token"], e["tv"]
        kt = f"{k['predicted']:.4f} {_ci(k.get('ci'), '.4f')}" if k.get("predicted") is not None else \
            (k.get("reason") or "-")
        tt = f"{tv['predicted']:.3f} {_ci(tv.get('ci'), '.3f')}" if tv.get("predicted") is not None else "-"
        b = e["tv_bound_image"]
        lines.append(f"| {e['key']} | {'-' if t is None else f'{t:.3f}'} | {kt} | {tt} | "
                     f"{'-' if b is None else f'{b:.2f}'} |")
    cmp = rep.get("comparison")
    if cmp:
        lines += ["", f"Against the measured sweep ({rep['measured_report']}): " + _comparison_summary(cmp), "",
                  "| setting | tokens/call predicted / measured | TV predicted (measured [95% CI]) | KL(P\\|\\|P^) predicted "
                  "/ KL(P^\\|\\|P) measured | not in the measured report |", "|---|---|---|---|---|"]
        for r in cmp["settings"]:
            tvc = r["tv_measured_ci"]
            ci = f" [{tvc[0]:.3f}, {tvc[1]:.3f}]" if tvc else ""
            lines.append(f"| {r['key']} | {_num(r['tokens_per_call_predicted'], '.3f')} / "
                         f"{_num(r['tokens_per_call_measured'], '.3f')} | "
                         f"{_num(r['tv_predicted'], '.3f')} ({_num(r['tv_measured'], '.3f')}{ci}) | "
                         f"{_num(r['kl_ar_predicted'], '.4g')} / {_num(r['kl_sd_measured'], '.4g')} | "
                         f"{', '.join(r.get('missing') or []) or '-'} |")
    secs = rep.get("seconds")
    lines += ["", f"Wall clock of the predicted sweep: {_num(secs, '.0f')} s (generation of the AR and "
                  "recorded units included when this run made them)."]
    return "\n".join(lines) + "\n"


def figures(root, rep: dict) -> list[str]:
    """predicted_kl_vs_tokens_per_call.png (and predicted_vs_measured.png with a comparison)."""
    from matplotlib.figure import Figure

    out = []
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    fams = sorted({e["family"] for e in rep["methods"]})
    for f in fams:
        es = sorted((e for e in rep["methods"] if e["family"] == f and e["kl_ar_per_token"].get("predicted") is not None
                     and e["tokens_per_call"]["predicted"] is not None), key=lambda e: e["tokens_per_call"]["predicted"])
        if es:
            ax.errorbar([e["tokens_per_call"]["predicted"] for e in es], [e["kl_ar_per_token"]["predicted"] for e in es],
                        yerr=[1.96 * e["kl_ar_per_token"]["se"] for e in es], fmt="o-", capsize=3, label=f)
    ax.set_xlabel("predicted tokens per target call")
    ax.set_ylabel("KL(P||P^) per token from AR images (95% CI)")
    ax.set_title("predicted frontier (no relaxed image generated)")
    if ax.get_legend_handles_labels()[0]:              # nothing predicted (e.g. no tokens per call): no legend
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(root / "predicted_kl_vs_tokens_per_call.png", dpi=110)
    out.append("predicted_kl_vs_tokens_per_call.png")
    cmp = rep.get("comparison")
    if cmp:
        fig = Figure(figsize=(10, 4))
        a1, a2 = fig.subplots(1, 2)
        rs = [r for r in cmp["settings"] if r["tokens_per_call_predicted"] is not None
              and r["tokens_per_call_measured"] is not None]
        x = [r["tokens_per_call_measured"] for r in rs]
        a1.plot(x, [r["tokens_per_call_predicted"] for r in rs], "o")
        if x:
            a1.plot([min(x), max(x)], [min(x), max(x)], "k--", lw=1)
        else:
            a1.text(0.5, 0.5, "no measured tokens per call", ha="center", transform=a1.transAxes)
        a1.set_xlabel("measured tokens per call")
        a1.set_ylabel("predicted")
        rs = [r for r in cmp["settings"] if r["tv_predicted"] is not None and r["tv_measured"] is not None
              and r["tv_measured_ci"] is not None]
        a2.errorbar([r["tv_measured"] for r in rs], [r["tv_predicted"] for r in rs],
                    xerr=[[r["tv_measured"] - r["tv_measured_ci"][0] for r in rs],
                          [r["tv_measured_ci"][1] - r["tv_measured"] for r in rs]], fmt="o", capsize=2)
        a2.plot([0, 1], [0, 1], "k--", lw=1)
        a2.set_xlabel("measured TV (own images, 95% CI)")
        a2.set_ylabel("predicted TV (AR images)")
        fig.suptitle("predicted vs measured")
        fig.tight_layout()
        fig.savefig(root / "predicted_vs_measured.png", dpi=110)
        out.append("predicted_vs_measured.png")
    return out


def merge(cfg: SweepConfig, store: Store, dist, ctx, load, measured: str | None = None, t0: float | None = None):
    """Every rank scores its AR chunks; rank 0 writes predicted.json / .md / PNGs (module docstring)."""
    from .store import json_safe

    shard(store, cfg, ctx, dist.rank, dist.world, load)
    dist.barrier()
    if dist.rank != 0:
        return None
    rep = analyse(store, cfg, ctx, load)
    rep["config"] = {"model": cfg.model, "grid": [s.key for s in cfg.settings], "images": cfg.images,
                     "record_images": cfg.record_images, "seed": cfg.seed, "L": ctx.L, "drafting": cfg.drafting_kind,
                     "draft": ctx.bundle.info.get("draft"), "device": cfg.device, "world_size": dist.world,
                     "temperature": cfg.temperature, "cfg_scale": ctx.proc.cfg_scale}
    if measured is not None:
        m = json.loads(open(measured).read())
        rep["comparison"] = compare(rep, m)
        rep["measured_report"] = str(measured)
    rep["seconds"] = time.perf_counter() - t0 if t0 is not None else None
    rep["figures"] = figures(store.root, rep)
    rep = json_safe(rep)
    store.write_text("predicted.json", json.dumps(rep, indent=1, allow_nan=False) + "\n")
    store.write_text("predicted.md", markdown(rep))
    return rep
