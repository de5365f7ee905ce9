"""report.md and the PNG figures of ``coolsd demo`` (``coolsd.studies.demo``), from the report dict."""
from __future__ import annotations

import math
import pathlib

import numpy as np

from .settings import chain_drafted, tree_drafted

FIGURES = {
    "pareto": "pareto.png",
    "predicted_vs_measured": "predicted_vs_measured.png",
    "samples": "samples.png",
    "fidelity": "fidelity.png",
}


def label(m: dict) -> str:
    p = m["params"]
    if m["name"] == "cool-sd":
        s = f"cool-sd d={p['delta']:g}"
    elif m["name"] == "uniform-rsd":
        s = f"uniform-rsd c={p['c']:g}"
    elif m["name"] == "lantern++":
        s = f"lantern++ k={p['k']} l={p['lambda']:g}"
    elif m["name"].startswith("lantern"):
        s = f"{m['name']} k={p['k']} d={p['delta']:g}"
    else:
        s = m["name"]
    return s + (" [tree]" if tree_drafted(m["drafting"]) else "")


def _f(x, nd=3):
    return f"{x:.{nd}f}"


def main_table(report: dict) -> str:
    """The markdown table of every method: tokens per target call predicted vs measured, speed-up, quality."""
    head = ("| method | drafting | tokens/call predicted | measured (SE) | rel. err | speed-up predicted | measured "
            "| FD (SE) | class acc | TV bound / round | NLL/token (SE) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    b = report["baseline"]
    rows.append(f"| plain AR (baseline) | - | 1 | 1 | - | 1 | 1 | {_f(b['frechet_distance'], 1)} ({_f(b['frechet_distance_se'], 1)}) "
                f"| {_f(b['class_accuracy'])} | 0 | {_f(b['nll_per_token'])} ({_f(b['nll_per_token_se'])}) |")
    for m in report["methods"]:
        rows.append(f"| {label(m)} | {m['drafting']} | {_speed_quality_cells(m)} "
                    f"| {_f(m['tv_bound'])} | {_f(m['nll_per_token'])} ({_f(m['nll_per_token_se'])}) |")
    note = report.get("batch_note", {}).get("text")
    return head + "\n".join(rows) + "\n" + (f"\n{note}\n" if note else "")


def _speed_quality_cells(m: dict) -> str:
    """The cells every method table shares: tokens/call predicted | measured (SE) | rel. err | speed-up
    predicted | measured | FD (SE) | class acc."""
    a, sp = m["accepted_length"], m["speedup"]
    return (f"{_f(a['predicted'])} | {_f(a['measured'])} ({_f(a['measured_se'])}) | {100 * a['relative_error']:+.1f}% "
            f"| {_f(sp['predicted'], 2)} | {_f(sp['measured'], 2)} | {_f(m['frechet_distance'], 1)} "
            f"({_f(m['frechet_distance_se'], 1)}) | {_f(m['class_accuracy'])}")


def _ci(d: dict | None, nd: int = 4) -> str:
    if d is None or d.get("measured") is None:
        return "n/a" if d is None else f"inf ({d.get('reason', '')})"
    return f"{d['measured']:.{nd}f} [{d['ci'][0]:.{nd}f}, {d['ci'][1]:.{nd}f}]"


def fidelity_table(report: dict) -> str:
    """The markdown table of the measured fidelity to the target: TV from the SD images and from the plain-AR
    images, KL(P^||P) per image and per token, KL(P||P^) per token (95% CIs), the predicted per-image TV bound and
    whether the measured TV is within it (chains; tree runs have no per-image bound); tree runs without an exact
    likelihood with the reason."""
    head = ("| method | drafting | tokens/call | KL(P^‖P) nats/token, SD images [95% CI] | KL(P‖P^) nats/token, AR "
            "images [95% CI] | TV to target, SD images [95% CI] | TV, AR images [95% CI] | TV bound / image [95% CI] "
            "| within bound |\n|---|---|---|---|---|---|---|---|---|\n")
    rows, trees = [], []
    for m in report["methods"] + report.get("other_drafts", []):
        if "tv_to_target" not in m:
            trees.append(label(m))
            continue
        tv, kl, b, chk = m["tv_to_target"], m["kl_to_target"], m.get("tv_bound_image"), m.get("bound_check")
        ar = _ci({"measured": tv["from_ar"], "ci": tv["from_ar_ci"]}) if tv.get("from_ar") is not None else "n/a"
        within = "-" if not chk else ("yes" if chk["within"] else "NO") + (" (vacuous: > 1)" if chk["vacuous"] else "")
        kt = _ci(kl["per_token"], 5) if kl.get("per_token") else ("inf" if kl.get("n_infinite") else "-")
        ka = m.get("kl_from_ar") or {}
        kat = _ci(ka["per_token"], 5) if ka.get("per_token") else ("inf" if ka.get("n_infinite") else "-")
        rows.append(f"| {label(m)}{' (' + m['draft'] + ' draft)' if m in report.get('other_drafts', []) else ''} "
                    f"| {m['drafting']} | {_f(m['accepted_length']['measured'])} | {kt} | {kat} | {_ci(tv)} | {ar} "
                    f"| {'-' if b is None else _ci(b, 3)} | {within} |")
    out = head + "\n".join(rows) + "\n"
    mc = [label(m) for m in report["methods"] + report.get("other_drafts", []) if m.get("kl_method") == "mc"]
    if mc:
        out += (f"\nMonte Carlo estimate of log P^ ({', '.join(mc)}): sampled tree candidates above the exact sum's "
                "cost guard (docs/theory.md section 11c, T14); the KL intervals include its error.\n")
    if trees:
        reason = next(m["fidelity_reason"] for m in report["methods"] if "fidelity_reason" in m)
        out += f"\nNot measured ({', '.join(trees)}): {reason}.\n"
    return out


def find_method(methods, name, drafting, **params):
    """The first entry of ``methods`` (report["methods"]) with this name, drafting and these params, or None."""
    for m in methods:
        if m["name"] == name and m["drafting"] == drafting and all(m["params"].get(k) == v for k, v in params.items()):
            return m
    return None


def chain_vs_tree_table(report: dict) -> str:
    rows = []
    for m in report["methods"]:
        if not tree_drafted(m["drafting"]):
            continue
        c = find_method(report["methods"], m["name"], "chain", **m["params"])
        if c is None:
            continue
        ca, ta = c["accepted_length"], m["accepted_length"]
        rows.append(f"| {label(c)} | {_f(ca['measured'])} ({_f(ca['measured_se'])}) | {_f(ta['measured'])} "
                    f"({_f(ta['measured_se'])}) | {_f(ca['predicted'])} / {_f(ta['predicted'])} "
                    f"| {_f(c['speedup']['measured'], 2)} | {_f(m['speedup']['measured'], 2)} |")
    return ("| method | chain tokens/call (SE) | tree tokens/call (SE) | predicted chain / tree | chain speed-up "
            "| tree speed-up |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def separation_table(report: dict) -> str:
    """Each method against vanilla chain drafting: differences in units of their combined SE
    (sqrt(se_a^2 + se_b^2)) for tokens per call, the target NLL per token and the Frechet distance."""
    van = find_method(report["methods"], "vanilla", "chain")
    if van is None:
        return ""

    def z(m, key, se_key):
        se = math.hypot(m[se_key], van[se_key])
        return (m[key] - van[key]) / se if se > 0 else float("nan")

    rows = []
    for m in report["methods"]:
        if m is van:
            continue
        a, b = m["accepted_length"], van["accepted_length"]
        za = (a["measured"] - b["measured"]) / math.hypot(a["measured_se"], b["measured_se"])
        rows.append(f"| {label(m)} | {za:+.1f} | {z(m, 'nll_per_token', 'nll_per_token_se'):+.1f} "
                    f"| {z(m, 'frechet_distance', 'frechet_distance_se'):+.1f} |")
    return ("| method vs vanilla chain | tokens/call | NLL/token | FD |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")


def _small_delta_note(report: dict) -> str:
    sw = report.get("predicted_sweeps", {}).get("cool-sd")
    van = next((m for m in report["methods"] if m["name"] == "vanilla" and chain_drafted(m["drafting"])), None)
    if not sw or van is None:
        return ""
    pts = ", ".join(f"delta={p['value']:g}: {p['tokens_per_call']:.2f}" for p in sw if p["value"] <= 3)
    return (f"predicted tokens per call from the vanilla records, {pts} (vanilla: "
            f"{van['accepted_length']['predicted']:.2f}).")


def markdown(report: dict) -> str:
    c = report["config"]
    costs = report["costs"]
    fl = report["floors"]["real_digits_same_n"]
    ch = report["checks"]
    tree_desc = f"{len(c['tree_paths'])}-node static tree of depth {max(len(p) for p in c['tree_paths'])}"
    w = "; ".join(f"delta={d}: w = [{', '.join(f'{x:.2f}' for x in ws)}]" for d, ws in c["cool_sd_weights"].items())
    lines = [
        "# coolsd demo: relaxed speculative decoding on the shipped MNIST models",
        "",
        f"Target: our LlamaGen (c2i, 12 layers) over the shipped VQ (7x7 = {c['T']} tokens, 512 codes); chain "
        f"drafts: `{c['chain_draft']}` draft, L = {c['L']}; tree drafts: `{c['tree_draft']}` draft, {tree_desc}. "
        f"Sampling: temperature {c['temperature']}, CFG scale {c['cfg_scale']}. {c['n_images']} digits per method "
        f"(class = i mod 10; generated in batches of {c.get('batch_size', 1)}, batch k seeded {c['seed']} + k; the same "
        f"digits for every method and for plain AR, at the same batch size), device "
        f"{c['device']}, {c['threads']} torch thread(s). Wall clock of the whole job: {report['wall_clock_s']:.0f} s.",
        "",
        "**Accepted length = tokens per target call** (= E[tau] + 1 per round, end-of-image rounds included). "
        "*Predicted* values come only from the vanilla run's recorded P/Q rows (T10/T11 per round, then a renewal "
        "recursion over the 49 positions for the short end-of-image rounds; trees: `theory.likelihood.recorded.predict_tree_rounds` "
        "on the vanilla tree run); *measured* values from running each rule. Speed-up: plain AR time / method time "
        "(same classes and seeds); predicted from the measured unit costs below. FD: Frechet distance in the shipped "
        f"classifier's feature space to the 1,000 held-out digits ({c['n_images']} generated digits each, delete-one jackknife SE as in the sweep); "
        f"the real-digit floor at this n is {fl['mean']:.1f} (sd {fl['sd']:.1f}: {fl['n']} real train digits vs held-out). "
        "TV bound: mean per-round T11 bound (0 for vanilla, which is lossless). NLL: target NLL per token of the generated codes.",
        "",
        "## Main table",
        "",
        main_table(report),
        f"Cool-SD weights (normalisation {c.get('cool_sd_norm', 'first')!r} of theory.rules.cool_sd_schedule, "
        f"nu = {c['nu']}, w_1 = delta): {w}. "
        + ("Positions with w < 1 are stricter than vanilla, so a small delta can accept *less* than vanilla: "
           if c.get("cool_sd_norm", "first") == "first" else "Small deltas: ")
        + _small_delta_note(report) + " Check below: every Cool-SD run (all have delta > 1) accepts more than vanilla.",
        "",
        "## Are the differences outside the standard errors?",
        "",
        "Differences from vanilla chain drafting in units of the combined standard error (|z| > 2: separated). "
        "Tokens per call have SEs over hundreds of rounds and separate easily; the target NLL per token of the "
        "generated codes separates the rules that move the output most; the Frechet distance of a few hundred "
        "digits has a jackknife SE larger than most differences between methods (see the FD column), so read FD "
        "as a sanity check and NLL as the quality measure at this sample size. FD measures data quality (distance "
        "to real digits), not distance to the target: a relaxed rule can move away from the target (TV, KL below) "
        "towards digits the classifier finds more typical, so FD and TV can move in opposite directions.",
        "",
        separation_table(report),
        "## Fidelity to the target, measured exactly",
        "",
        "The exact likelihood of each chain run's own images under the relaxed sampler, log P^(x), and under the "
        "target as sampled (CFG and temperature applied), log P(x), from teacher-forced rows and the forward "
        "recursion over hidden round boundaries (`theory.likelihood`, docs/theory.md section 11). TV(P^, P) = "
        "E_{P^}[(1 - P/P^)_+] from the run's images and, independently, E_P[(1 - P^/P)_+] from the plain-AR "
        "images: two estimators of one number that must agree. KL(P^‖P) = E_{P^}[log P^ - log P]. Intervals: "
        f"normal 95% over the {c['n_images']} images. Vanilla is lossless (TV = KL = 0 up to float error). TV bound: "
        "the sum of each image's per-round T11 terms along its own path (`theory.likelihood.path_bound`); by the hybrid "
        "argument TV <= its mean; a mean above 1 is vacuous (TV <= 1 always), and the table says so.",
        "",
        fidelity_table(report),
        "## Chain vs tree drafting",
        "",
        chain_vs_tree_table(report),
        "## Done-when checks",
        "",
        f"- vanilla chain, predicted vs measured tokens per call: {ch['vanilla_chain_prediction_within_5pct']['predicted']:.3f} "
        f"vs {ch['vanilla_chain_prediction_within_5pct']['measured']:.3f} "
        f"({100 * ch['vanilla_chain_prediction_within_5pct']['relative_error']:+.2f}%, "
        f"z = {ch['vanilla_chain_prediction_within_5pct']['z']:+.2f}): "
        f"{'PASS' if ch['vanilla_chain_prediction_within_5pct']['pass'] else 'FAIL'} (within 5%)",
    ]
    for r in ch["cool_sd_delta_gt_1_accepts_more_than_vanilla"]["runs"]:
        lines.append(f"- cool-sd delta={r['delta']:g} accepts more than vanilla: {r['measured']:.3f} vs {r['vanilla']:.3f} "
                     f"({r['difference_in_se']:+.1f} SE): {'PASS' if r['pass'] else 'FAIL'}")
    for r in ch["tree_raises_tokens_per_call_over_chain"]["runs"]:
        lines.append(f"- tree raises tokens per call over chain, {r['name']} {r['params']}: {r['chain']:.3f} -> {r['tree']:.3f}: "
                     f"{'PASS' if r['pass'] else 'FAIL'}")
    if report.get("other_drafts"):
        lines += ["", "## Other drafts (not in the contract's method list)", "",
                  "| run | draft | tokens/call predicted | measured (SE) | rel. err | speed-up predicted | measured | FD (SE) | class acc |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m in report["other_drafts"]:
            lines.append(f"| {label(m)} {m['drafting']} | {m['draft']} | {_speed_quality_cells(m)} |")
    lines += ["", "## Measured unit costs (seconds)", "",
              "| drafting | AR step | draft step | target pass / round | verifier / round | other / round | draft/AR | target pass/AR |",
              "|---|---|---|---|---|---|---|---|"]
    for k, cc in costs.items():
        lines.append(f"| {k} | {cc['ar_step_s'] * 1e3:.2f} ms | {cc['draft_step_s'] * 1e3:.2f} ms | "
                     f"{cc['target_per_round_s'] * 1e3:.2f} ms | {cc['verify_per_round_s'] * 1e3:.2f} ms | "
                     f"{cc['other_per_round_s'] * 1e3:.2f} ms | {cc['cost_ratio_draft_over_ar_step']:.3f} | "
                     f"{cc['cost_ratio_target_pass_over_ar_step']:.3f} |")
    lines += ["", "Speed-up model: time per image = rounds x (target pass + bookkeeping) + drafted rounds x verifier "
              "(timed per rule on recorded rows) + draft steps x draft step, against 49 AR steps; rounds and draft "
              "steps are the predicted ones.", "",
              "## Figures", "",
              f"- `{FIGURES['pareto']}`: left, measured FD vs measured tokens per target call per method (error bars: SE); "
              "middle, the target's NLL per token of the generated codes (the sensitive quality measure at this sample "
              "size) vs tokens per call; right, predicted per-round TV bound vs predicted tokens per call as each rule's "
              "parameter is swept (from the vanilla records only), with the run parameters marked.",
              f"- `{FIGURES['predicted_vs_measured']}`: predicted vs measured tokens per target call, every run, y = x line.",
              f"- `{FIGURES['samples']}`: generated digits per method, one row per class 0-9.",
              f"- `{FIGURES['fidelity']}`: measured TV to the target (SD images, 95% CI) vs measured tokens per target "
              "call for every chain run, with its predicted per-image bound (open markers; clipped at 1) and the "
              "TV from the plain-AR images (crosses).", ""]
    return "\n".join(lines)


def figures(out: pathlib.Path, report: dict, results: dict, settings) -> dict:
    """Write the PNG figures; returns {figure: file name}. The Pareto figure's predicted sweeps are read
    from report["predicted_sweeps"] (``coolsd.studies.demo.predict.sweep_predictions``)."""
    pareto(out / FIGURES["pareto"], report)
    predicted_vs_measured(out / FIGURES["predicted_vs_measured"], report)
    samples(out / FIGURES["samples"], report, results, settings)
    fidelity_figure(out / FIGURES["fidelity"], report)
    return dict(FIGURES)


def _family(m):
    return m["name"] + (" [tree]" if tree_drafted(m["drafting"]) else "")


def pareto(path, report) -> None:
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(19, 5.4))
    ax, nx, bx = fig.subplots(1, 3)
    fams: dict = {}
    for m in report["methods"]:
        fams.setdefault(_family(m), []).append(m)
    cmap = {f: matplotlib.colormaps["tab10"](i % 10) for i, f in enumerate(fams)}
    for f, ms in fams.items():
        ms = sorted(ms, key=lambda m: m["accepted_length"]["measured"])
        x = [m["accepted_length"]["measured"] for m in ms]
        y = [m["frechet_distance"] for m in ms]
        ax.errorbar(x, y, xerr=[m["accepted_length"]["measured_se"] for m in ms],
                    yerr=[m["frechet_distance_se"] for m in ms], fmt=("s" if tree_drafted(ms[0]["drafting"]) else "o") + ("-" if len(ms) > 1 else ""),
                    color=cmap[f], label=f, capsize=3)
        for m in ms:
            if m["name"] == "cool-sd":
                ax.annotate(f"d={m['params']['delta']:g}", (m["accepted_length"]["measured"], m["frechet_distance"]),
                            textcoords="offset points", xytext=(4, 4), fontsize=8)
    b = report["baseline"]
    ax.axhline(b["frechet_distance"], color="gray", ls="--", lw=1, label="plain AR (target)")
    fl = report["floors"]["real_digits_same_n"]
    ax.axhspan(fl["mean"] - fl["sd"], fl["mean"] + fl["sd"], color="gray", alpha=0.15,
               label=f"real digits, n={fl['n']} (floor)")
    ax.set_xlabel("measured tokens per target call")
    ax.set_ylabel("Frechet distance to held-out digits (classifier space)")
    ax.set_title("measured: FD vs accepted length")
    ax.legend(fontsize=7)
    for f, ms in fams.items():
        ms = sorted(ms, key=lambda m: m["accepted_length"]["measured"])
        nx.errorbar([m["accepted_length"]["measured"] for m in ms], [m["nll_per_token"] for m in ms],
                    xerr=[m["accepted_length"]["measured_se"] for m in ms], yerr=[m["nll_per_token_se"] for m in ms],
                    fmt=("s" if tree_drafted(ms[0]["drafting"]) else "o") + ("-" if len(ms) > 1 else ""), color=cmap[f], label=f, capsize=3)
    nx.axhline(b["nll_per_token"], color="gray", ls="--", lw=1, label="plain AR (target)")
    nx.set_xlabel("measured tokens per target call")
    nx.set_ylabel("target NLL per token of the generated codes (nats)")
    nx.set_title("measured: distance from the target's law vs accepted length")
    nx.legend(fontsize=7)
    for name, pts in report["predicted_sweeps"].items():
        xs, ys = zip(*[(p["tokens_per_call"], p["tv_bound"]) for p in pts])
        bx.plot(xs, ys, "-", color=cmap.get(name, "k"), label=f"{name} (sweep: {pts[0]['param']} "
                f"{pts[0]['value']:g}..{pts[-1]['value']:g})")
    for m in report["methods"]:
        if chain_drafted(m["drafting"]):
            bx.plot(m["accepted_length"]["predicted"], m["tv_bound"], "o", color=cmap[_family(m)], ms=7, mec="k")
    bx.set_xlabel("predicted tokens per target call (from vanilla records)")
    bx.set_ylabel("predicted per-round TV bound (T11)")
    bx.set_title("predicted: TV bound vs accepted length (chain, markers = runs)")
    bx.legend(fontsize=7)
    fig.suptitle("quality vs accepted length per method (MNIST LlamaGen; lower is better on every y axis)")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)


def predicted_vs_measured(path, report) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 6))
    ax = fig.subplots()
    lo, hi = np.inf, -np.inf
    import matplotlib

    cm = matplotlib.colormaps["tab20"]
    for i, m in enumerate(report["methods"]):
        a = m["accepted_length"]
        ax.errorbar(a["predicted"], a["measured"], yerr=2 * a["measured_se"], fmt="s" if tree_drafted(m["drafting"]) else "o",
                    capsize=3, label=label(m), color=cm(i % 20))
        lo, hi = min(lo, a["predicted"], a["measured"]), max(hi, a["predicted"], a["measured"])
    pad = 0.05 * (hi - lo + 1e-9)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=1, label="y = x")
    ax.set_xlabel("predicted tokens per target call (from vanilla records)")
    ax.set_ylabel("measured tokens per target call (+- 2 SE)")
    ax.set_title("accepted length: predicted vs measured")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def samples(path, report, results, settings, per_class: int = 6) -> None:
    from matplotlib.figure import Figure

    from real.zoo import vq

    keys = ["ar"] + [k for k in results if k != "ar"]
    titles = ["plain AR"] + [label({"name": r.spec.name, "params": r.spec.params, "drafting": r.spec.drafting})
                             + (f" ({r.spec.draft} draft)" if r.spec.extra else "")
                             for k, r in results.items() if k != "ar"]
    n = len(keys)
    cols = 4
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(cols * 3.2, rows * 4.6))
    axes = fig.subplots(rows, cols)
    axes = np.atleast_2d(axes)
    N = results["ar"].tokens.shape[0]
    per_class = max(1, min(per_class, N // 10))
    for i, (k, t) in enumerate(zip(keys, titles)):
        ax = axes[i // cols, i % cols]
        toks = results[k].tokens
        grid = -np.ones((10 * 28, per_class * 28))
        for c in range(10):
            idx = [j for j in range(c, N, 10)][:per_class]
            if idx:
                imgs = vq.decode(toks[idx]).numpy()[:, 0]
                for r, im in enumerate(imgs):
                    grid[c * 28:(c + 1) * 28, r * 28:(r + 1) * 28] = im
        ax.imshow(grid, cmap="gray", vmin=-1, vmax=1)
        ax.set_yticks([c * 28 + 14 for c in range(10)])
        ax.set_yticklabels([f"class {c}" for c in range(10)], fontsize=7)
        ax.set_xticks([])
        ax.set_title(t, fontsize=9)
    for j in range(n, rows * cols):
        axes[j // cols, j % cols].axis("off")
    fig.suptitle("generated digits per method (rows: requested class 0-9; same seeds across methods)")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)



def fidelity_figure(path, report) -> None:
    """Left (the fidelity axis): KL per token to the target vs tokens per target call, KL(P^||P) from the SD images
    (filled, 95% CI) and KL(P||P^) from the AR images (x). Right: TV, measured (SD images, 95% CI), from AR images,
    and the predicted per-image bound (clipped at 1: TV <= 1); TV saturates with image length, KL per token does not."""
    import matplotlib
    from matplotlib.figure import Figure

    ms = [m for m in report["methods"] + report.get("other_drafts", []) if "tv_to_target" in m]
    fig = Figure(figsize=(14, 5.4))
    kx, ax = fig.subplots(1, 2)
    cmap = matplotlib.colormaps["tab10"]
    for i, m in enumerate(ms):   # a dozen runs
        x, kl, ka = m["accepted_length"]["measured"], m["kl_to_target"].get("per_token"), \
            (m.get("kl_from_ar") or {}).get("per_token")
        if kl:
            kx.errorbar([x], [kl["measured"]], yerr=[[kl["measured"] - kl["ci"][0]], [kl["ci"][1] - kl["measured"]]],
                        fmt="o", color=cmap(i % 10), capsize=3, label=label(m))
        if ka:
            kx.plot([x], [ka["measured"]], "x", color=cmap(i % 10), ms=8)
    kx.set_xlabel("measured tokens per target call")
    kx.set_ylabel("KL to the target, nats per token")
    kx.set_title("KL(P^||P) per token (filled, 95% CI), KL(P||P^) from AR images (x)")
    kx.legend(fontsize=7, loc="upper left")
    for i, m in enumerate(ms):   # a dozen runs
        x, tv, b = m["accepted_length"]["measured"], m["tv_to_target"], m.get("tv_bound_image")
        col = cmap(i % 10)
        ax.errorbar([x], [tv["measured"]], yerr=[[tv["measured"] - tv["ci"][0]], [tv["ci"][1] - tv["measured"]]],
                    fmt="o", color=col, capsize=3, label=label(m))
        if tv.get("from_ar") is not None:
            ax.plot([x], [tv["from_ar"]], "x", color=col, ms=8)
        if b is not None:                     # chains: the predicted per-image bound (trees have none)
            ax.plot([x], [min(b["measured"], 1.0)], "o", mfc="none", color=col, ms=10)
    ax.axhline(1.0, color="0.6", lw=0.8, ls="--")
    ax.set_xlabel("measured tokens per target call")
    ax.set_ylabel("TV(P^, P) to the target")
    ax.set_title("measured TV (filled, 95% CI), from AR images (x), predicted bound (open, clipped at 1)")
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
