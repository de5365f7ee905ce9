"""report.md and the PNG figures of a sweep, from the report dict of ``analysis.analyse``."""
from __future__ import annotations

import pathlib

FIGURES = {"fd_vs_tokens": "fd_vs_tokens_per_call.png", "fd_vs_speedup": "fd_vs_speedup.png",
           "nll_vs_tokens": "nll_vs_tokens_per_call.png", "predicted": "predicted_frontier.png"}


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
    lines = ["| claim | A | B | FD: A - B (SE), points | verdict | NLL: A - B (SE) | verdict |", "|---|---|---|---|---|---|---|"]
    for c in report["claims"]:
        cells = []
        for k, nd in (("frechet_distance", 2), ("nll_per_token", 4)):
            r = c[k]
            cells.append(f"{r['difference']:+.{nd}f} ({r['se']:.{nd}f}), {r['points']}" if "difference" in r else "-")
            cells.append(f"**{r['verdict']}**")
        lines.append(f"| {c['claim']} | {c['a']} | {c['b']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(report: dict) -> str:
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
        "normal interval from the delete-one jackknife SE over the generated images (for the plug-in FD at this n; see `coolsd.studies.sweep.metrics.fd_with_ci` for why not the bootstrap). NLL: target NLL per token of the generated codes. "
        "Precision / recall: k-NN manifolds (k = 3) in the same feature space against the reference images. "
        f"TV bound: mean per-round T11 bound. Predictions: {p['from']}. Quality: {report['quality']}.", "",
        "## Settings", "", table(report),
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
        return [[max(0.0, m["frechet_distance"] - (m["frechet_distance_ci"][0] or m["frechet_distance"])) for m in ms],
                [max(0.0, (m["frechet_distance_ci"][1] or m["frechet_distance"]) - m["frechet_distance"]) for m in ms]]

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
