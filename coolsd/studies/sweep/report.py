"""report.md and the PNG figures of a sweep, from the report dict of ``analysis.analyse``."""
from __future__ import annotations

import pathlib

FIGURES = {"fd_vs_tokens": "fd_vs_tokens_per_call.png", "fd_vs_speedup": "fd_vs_speedup.png",
           "nll_vs_tokens": "nll_vs_tokens_per_call.png", "predicted": "predicted_frontier.png",
           "tv_vs_tokens": "tv_vs_tokens_per_call.png", "tv_vs_speedup": "tv_vs_speedup.png",
           "kl_vs_tokens": "kl_vs_tokens_per_call.png", "kl_vs_speedup": "kl_vs_speedup.png"}


def _f(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def _g(x):
    """4 significant digits (FDs range from ~1e-2 on tiny test extractors to ~1e2)."""
    return "-" if x is None else f"{x:.4g}"


def _params(m: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in m["params"].items()) or "-"


def _quality_cells(m: dict, clip: bool) -> str:
    """FD [95% CI] | class acc | NLL/token (SE) | precision / recall [| CLIP score (SE)] of one row."""
    ci = m.get("frechet_distance_ci")
    fd = (f"{_g(m['frechet_distance'])} [{_g(ci[0])}, {_g(ci[1])}]" if ci else _g(m.get("frechet_distance")))
    cells = (f"{fd} | {_f(m.get('class_accuracy'))} | {_f(m.get('nll_per_token'))} ({_f(m.get('nll_per_token_se'))}) | "
             f"{_f(m.get('precision'), 2)} / {_f(m.get('recall'), 2)}")
    return cells + (f" | {_f(m.get('clip_score'), 2)} ({_f(m.get('clip_score_se'), 2)})" if clip else "")


def _ci(d: dict | None, key="measured", ci="ci", nd=3) -> str:
    """``value [lo, hi]`` of a fidelity dict, or its reason when there is no number."""
    if not d:
        return "-"
    if d.get(key) is None:
        return "inf" if d.get("n_infinite") else "-"
    lo, hi = d[ci]
    if max(abs(d[key]), abs(lo), abs(hi)) < 10 ** -nd:     # the vanilla floor: float32 rounding of the rows
        return f"{d[key]:.1e} [{lo:.1e}, {hi:.1e}]"
    return f"{d[key]:.{nd}f} [{lo:.{nd}f}, {hi:.{nd}f}]"


def _per_token(d: dict | None) -> dict | None:
    """The per-token part of a KL dict (``theory.likelihood.fidelity``), keeping its reason / infinity flags."""
    if not d:
        return d
    return {**d, **(d.get("per_token") or {"measured": None})}


def fidelity_table(report: dict) -> str:
    """KL per token in both directions (the fidelity axis that scales with image length), then TV and the predicted
    per-image bound, per setting with 95% intervals."""
    head = ("| method | params | tokens/call | KL(P^‖P) nats/token, own images [95% CI] | KL(P‖P^) nats/token, AR "
            "images [95% CI] | TV, own images [95% CI] | TV, AR images [95% CI] | TV bound / image [95% CI] | "
            "TV within bound | NLL/token under the sampled law (SE) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    b = report["baseline"]
    rows = [f"| plain AR (baseline) | - | 1 | 0 | 0 | 0 | 0 | 0 | - | {_f(b.get('nll_per_token'))} "
            f"({_f(b.get('nll_per_token_se'))}) |"]
    for m in report["methods"]:
        tv, kl = m.get("tv_to_target"), m.get("kl_to_target")
        if tv is None:
            rows.append(f"| {m['name']} | {_params(m)} | {_f(m['accepted_length']['measured'])} | "
                        f"{m.get('fidelity_reason', '-')} | | | | | | |")
            continue
        bd, chk = m.get("tv_bound_image"), m.get("bound_check") or {}
        within = "-" if chk.get("within") is None else ("yes" if chk["within"] else "**no**")
        if chk.get("vacuous"):
            within += " (bound vacuous, > 1)"
        mc = " (KL: Monte Carlo estimate, theory 11c)" if m.get("kl_method") == "mc" else ""
        rows.append(f"| {m['name']}{mc} | {_params(m)} | {_f(m['accepted_length']['measured'])} | "
                    f"{_ci(_per_token(kl), nd=4)} | {_ci(_per_token(m.get('kl_from_ar')), nd=4)} | {_ci(tv)} | "
                    f"{_ci(tv, 'from_ar', 'from_ar_ci')} | {_ci(bd)} | "
                    f"{within} | {_f(m.get('nll_per_token'))} ({_f(m.get('nll_per_token_se'))}) |")
    return head + "\n".join(rows) + "\n"


def table(report: dict) -> str:
    b = report["baseline"]
    clip = "clip_score" in b
    head = ("| method | params | images | tokens/call predicted | measured (SE) | speed-up predicted | measured "
            "| FD [95% CI] | class acc | NLL/token (SE) | precision / recall |" + (" CLIP score (SE) |" if clip else "")
            + " TV bound / round |\n|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if clip else "") + "---|\n")
    rows = [f"| plain AR (baseline) | - | {b['images']} | 1 | 1 | 1 | 1 | {_quality_cells(b, clip)} | 0 |"]
    for m in report["methods"]:
        a, s = m["accepted_length"], m["speedup"]
        rows.append(f"| {m['name']} | {_params(m)} | {m['images']} | {_f(a['predicted'])} | {_f(a['measured'])} "
                    f"({_f(a['measured_se'])}) | {_f(s['predicted'], 2)} | {_f(s['measured'], 2)} | "
                    f"{_quality_cells(m, clip)} | {_f(m['tv_bound'], 4)} |")
    return head + "\n".join(rows) + "\n"


def claims_section(report: dict) -> str:
    if not report["claims"]:
        return "No quality measure for this model: the paper's claims are not tested.\n"
    lines = ["| claim | A | B | FD: A - B (SE), points | verdict | NLL: A - B (SE) | verdict | TV to target: A - B (SE) "
             "| verdict | KL to target: A - B (SE) | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in report["claims"]:
        cells = []
        for k, nd in (("frechet_distance", 2), ("nll_per_token", 4), ("tv_to_target", 4), ("kl_to_target", 3)):
            if k not in c:
                cells += ["-", "-"]
                continue
            r = c[k]
            cells.append(f"{r['difference']:+.{nd}f} ({r['se']:.{nd}f}), {r['points']}" if "difference" in r else "-")
            cells.append(f"**{r['verdict']}**")
        lines.append(f"| {c['claim']} | {c['a']} | {c['b']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(report: dict) -> str:
    from coolsd.quality.estimators import MIN_RELIABLE_IMAGES

    c = report["config"]
    p = report["predictions"]
    lines = [
        f"# coolsd sweep: {c['model']}", "",
        f"Grid: `{' '.join(c['grid_items'])}`" + (" (vanilla added: the predictions' source)" if c["vanilla_added"] else "")
        + f". {c['images']} images per setting in units of {c['unit_images']} (seed {c['seed']}; each unit's seed "
        f"from (seed, setting, unit), the same for any number of ranks), {c['drafting']} drafting (L = {c['L']}), "
        f"draft `{c['draft']}`, batch size {c['batch_size']}, device {c['device']}. Code: {', '.join(report['code_versions'])}. "
        f"Ranks: {c['world_size']}; merge wall clock {report['merge_seconds']:.0f} s.", "",
        "Tokens per target call: T n / (target calls), SE over images (delta method). Speed-up: plain-AR wall time per "
        "image / the setting's, same batch size; predicted from the vanilla rows and measured unit costs "
        "(`coolsd.studies.demo`). FD: torchmetrics' FID in the feature space and against the reference of the quality "
        "stamp (Quality, below) (MNIST: the shipped classifier, the held-out digits), 95% "
        "normal interval from the delete-one jackknife SE over the generated images (for the plug-in FD at this n; see `coolsd.quality.estimators.fd_with_ci` for why not the bootstrap). NLL: -log P(x) / T of the generated codes under the law actually sampled (the processed target: CFG, temperature; "
        "report.json keeps the unguided conditional NLL as nll_unguided_per_token). "
        "Precision / recall: k-NN manifolds (k = 3) in the same feature space against the reference images. "
        f"TV bound: mean per-round T11 bound. Predictions: {p['from']}. Quality: {report['quality']}.", "",
        "## Settings", "", table(report), report.get("batch_note", {}).get("text", ""), "",
        *([f"**Warning: {c['images']} images per setting is below {MIN_RELIABLE_IMAGES}: the FD intervals (which may "
           "reach below 0) and the claim verdicts are unreliable at this sample size.**", ""]
          if c["images"] < MIN_RELIABLE_IMAGES else []),
        "## Fidelity to the target, measured", "",
        "Exact per-image log-likelihoods from teacher-forced rows (`real.decode.score`, `theory.likelihood`): log P^(x) "
        "under the setting's speculative sampler and log P(x) under the processed target. KL per token is the fidelity "
        "axis: KL(P^‖P) = E_{P^}[log P^ - log P] / T from the setting's own images (infinite, and said so, when an image "
        "has P(x) = 0) and KL(P‖P^) / T from the plain-AR images (importance weights P^/P on AR images are never used "
        "for KL: their effective sample size collapses with length). TV(P^, P) = E_{P^}[(1 - P/P^)_+] from the "
        "setting's own images, and again as E_P[(1 - P^/P)_+] from the plain-AR images (two independent estimates of "
        "one number), stays beside them, but whole-image TV saturates with length: 1 - TV shrinks about geometrically "
        "with the tokens while KL grows about linearly, so at 576+ tokens every relaxed rule reads TV = 1 and only KL "
        "per token separates them. 95% normal intervals over images. TV bound / image: "
        "the hybrid-argument bound E[sum over the image's tokens of the T3 discrepancy at its round offset] "
        "(`theory.likelihood.path_bound`, from each image's own rounds and rows; vacuous when > 1). Noise floor: vanilla "
        "(lossless) measures TV and KL at float32 rounding of the rows, ~1e-6.", "",
        "FD to held-out digits and TV / KL to the target answer different questions: FD measures how close the "
        "samples are to real digits, TV / KL how far the sampler moved from the model it accelerates. A relaxed "
        "rule shifts mass towards tokens the draft likes, which (here) are smoother, more typical strokes: the "
        "images can get closer to the data in the classifier's feature space while the law moves away from the "
        "target, so FD can fall while TV, KL and the NLL under the sampled law rise.", "",
        fidelity_table(report),
        "## The paper's claims on this data", "",
        "Paired comparison along the frontier: A's curve (quality vs measured tokens per call) is interpolated at "
        "each of B's settings inside A's range; the mean difference A - B and its SE follow from the interpolation "
        "weights (settings are independent). held: z <= -2 (A better); not held: z >= 2; otherwise not separable.", "",
        claims_section(report),
        "## Figures", "",
        *[f"![{k}]({v})" for k, v in report["figures"].items()], ""]
    return "\n".join(lines)


def _save(fig, path) -> None:
    """PNG through a temporary file + os.replace (``store.atomic_write_bytes``)."""
    import io

    from .store import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())


def figures(out: pathlib.Path, report: dict) -> dict:
    """Write the PNGs (one curve per method family; vanilla and AR as points); returns {figure: file}."""
    from matplotlib.figure import Figure
    import matplotlib

    fams: dict = {}
    for m in report["methods"]:
        fams.setdefault(m["family"], []).append(m)
    cmap = {f: matplotlib.colormaps["tab10"](i % 10) for i, f in enumerate(fams)}
    b = report["baseline"]

    def panel(path, x_of, y_of, yerr_of, xlabel, ylabel, title, ar_point):
        fig = Figure(figsize=(7.5, 5.2))
        ax = fig.subplots()
        for f, ms in fams.items():
            ms = [m for m in ms if y_of(m) is not None and x_of(m) is not None]
            if not ms:
                continue
            ms = sorted(ms, key=x_of)
            single = len(ms) == 1
            ax.errorbar([x_of(m) for m in ms], [y_of(m) for m in ms],
                        yerr=None if yerr_of is None else yerr_of(ms), fmt="*" if single else "o-", ms=10 if single else 5,
                        color=cmap[f], label=f, capsize=3)
        if ar_point is not None and ar_point[1] is not None:
            ax.plot(*ar_point, "kX", ms=10, label="plain AR")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        _save(fig, path)

    def ci(ms):
        """Error bars of the FD; None when any setting has no interval (too few images for a jackknife)."""
        if not all(m.get("frechet_distance") is not None and m.get("frechet_distance_ci") and
                   None not in m["frechet_distance_ci"] for m in ms):
            return None
        return [[max(0.0, m["frechet_distance"] - m["frechet_distance_ci"][0]) for m in ms],
                [max(0.0, m["frechet_distance_ci"][1] - m["frechet_distance"]) for m in ms]]

    tpc = lambda m: m["accepted_length"]["measured"]
    panel(out / FIGURES["fd_vs_tokens"], tpc, lambda m: m["frechet_distance"], ci, "measured tokens per target call",
          "Frechet distance to held-out digits (95% jackknife CI)", "FD vs tokens per target call (lower is better)",
          (1.0, b.get("frechet_distance")))
    panel(out / FIGURES["fd_vs_speedup"], lambda m: m["speedup"]["measured"], lambda m: m["frechet_distance"], ci,
          "measured wall-clock speed-up over plain AR", "Frechet distance (95% CI)", "FD vs measured speed-up",
          (1.0, b.get("frechet_distance")))
    panel(out / FIGURES["nll_vs_tokens"], tpc, lambda m: m["nll_per_token"],
          lambda ms: [2 * m["nll_per_token_se"] for m in ms] if all(m.get("nll_per_token_se") for m in ms) else None,
          "measured tokens per target call", "target NLL per token (+- 2 SE)", "NLL vs tokens per target call",
          (1.0, b.get("nll_per_token")))
    _fidelity_figures(out, report, fams, cmap, panel, tpc)
    fig = Figure(figsize=(7.5, 5.2))
    ax = fig.subplots()
    for f, ms in fams.items():
        ms = sorted([m for m in ms if m["accepted_length"]["predicted"] is not None], key=lambda m: m["tv_bound"])
        if not ms:
            continue
        ax.plot([m["accepted_length"]["predicted"] for m in ms], [m["tv_bound"] for m in ms], "o--", mfc="none",
                color=cmap[f], label=f"{f} predicted")
        ax.plot([tpc(m) for m in ms], [m["tv_bound"] for m in ms], "o", color=cmap[f], label=f"{f} measured")
    ax.set_xlabel("tokens per target call (open: predicted from vanilla rows; filled: measured)")
    ax.set_ylabel("per-round TV bound (T11, from vanilla rows)")
    ax.set_title("predicted frontier beside the measured accepted length", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    _save(fig, out / FIGURES["predicted"])
    return dict(FIGURES)


def _fidelity_figures(out, report, fams, cmap, panel, tpc) -> None:
    """TV (with the predicted per-image bound drawn beside it, dashed) and KL to the target against measured
    tokens per call and measured speed-up; AR at (1, 0)."""
    from matplotlib.figure import Figure

    def val(name, key="measured"):
        return lambda m: (m.get(name) or {}).get(key)

    def err(name):
        def f(ms):
            return [[m[name]["measured"] - m[name]["ci"][0] for m in ms], [m[name]["ci"][1] - m[name]["measured"] for m in ms]]
        return f

    spd = lambda m: m["speedup"]["measured"]  # noqa: E731
    for key, x_of, xl in (("tv_vs_tokens", tpc, "measured tokens per target call"),
                          ("tv_vs_speedup", spd, "measured wall-clock speed-up over plain AR")):
        fig = Figure(figsize=(7.5, 5.2))
        ax = fig.subplots()
        for f, ms in fams.items():
            ms = sorted([m for m in ms if val("tv_to_target")(m) is not None], key=x_of)
            if not ms:
                continue
            xs = [x_of(m) for m in ms]
            ax.errorbar(xs, [val("tv_to_target")(m) for m in ms], yerr=err("tv_to_target")(ms), fmt="o-", ms=5,
                        color=cmap[f], label=f"{f} measured TV", capsize=3)
            bd = [val("tv_bound_image")(m) for m in ms]
            if all(v is not None for v in bd):
                ax.plot(xs, [min(v, 1.05) for v in bd], "^--", mfc="none", color=cmap[f], alpha=0.7,
                        label=f"{f} predicted bound (clipped at 1.05)")
        ax.plot(1.0, 0.0, "kX", ms=10, label="plain AR")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(xl)
        ax.set_ylabel("TV(P^, P) to the target (95% CI); bound dashed")
        ax.set_title("measured TV to the target beside the predicted per-image bound", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        fig.tight_layout()
        _save(fig, out / FIGURES[key])
    def kl_pt(m):
        return ((m.get("kl_to_target") or {}).get("per_token") or {}).get("measured")

    def kl_err(ms):
        pts = [m["kl_to_target"]["per_token"] for m in ms]
        return [[p["measured"] - p["ci"][0] for p in pts], [p["ci"][1] - p["measured"] for p in pts]]

    for key, x_of, xl in (("kl_vs_tokens", tpc, "measured tokens per target call"),
                          ("kl_vs_speedup", spd, "measured wall-clock speed-up over plain AR")):
        panel(out / FIGURES[key], lambda m, x_of=x_of: x_of(m) if kl_pt(m) is not None else None, kl_pt, kl_err, xl,
              "KL(P^ || P), nats per token (95% CI)", "KL per token to the target (lower is closer)", (1.0, 0.0))
