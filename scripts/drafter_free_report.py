"""report.md of study (d) (``drafter_free_natural256.py``) from its report.json dict."""
from __future__ import annotations


def _ci(v, lo, hi, f="{:.4f}") -> str:
    return f"{f.format(v)} [{f.format(lo)}, {f.format(hi)}]"


def markdown(rep: dict) -> str:
    c = rep["config"]
    S = rep["settings"]
    lines = ["# Drafter-free decoding on natural256 (issue 49, study d)", "",
             f"{c['images']} fresh images per setting (class i mod 16, seed {c['seed']}), CFG {rep['cfg_scale']}, "
             f"temperature 1, batch {c['batch']}, window W = {c['window']} (SJD-PAC-P: K = {c['pac_width']}, "
             f"D = {c['pac_depth']}), {rep['tokens_per_image']} tokens per image, one torch thread. Speed-up: plain "
             "AR's CPU seconds per image over the setting's (process CPU time of the generating process at batch "
             f"{c['batch']}: time slices lost to other processes do not count); wall seconds come from a shared "
             "2-core machine and are indicative only.", "",
             "## Speed", "",
             "| setting | tokens / call [95% CI] | target calls / image | one-token share (all / drafted calls) | "
             "CPU s / image | speed-up vs AR (CPU) | wall s / image |", "|---|---|---|---|---|---|---|"]
    for n, e in S.items():
        dr = e["one_token_share_drafted_calls"]
        lines.append(f"| {e['label']} | {_ci(e['tokens_per_call'], *e['tokens_per_call_ci'], f='{:.3f}')} | "
                     f"{e['target_calls_per_image']:.1f} | {e['one_token_share_all_calls']:.3f} / "
                     f"{'-' if dr is None else f'{dr:.3f}'} | {e['cpu_per_image']:.3f} | {e['cpu_speedup_vs_ar']:.2f} | "
                     f"{e['wall_per_image']:.3f} |")
    lines += ["", "## Fidelity", "", "Exact likelihood: " + rep["exact_likelihood"] + ". Measured instead (see the "
              "docstring of scripts/drafter_free_fidelity.py): token-level tests whose null is exact (under the "
              "target's law the PIT of each token is Uniform(0, 1) and the excess surprise -log p(x) - H(row) has mean "
              "0, token by token), and image-level comparisons with the plain-AR images of the same run.", "",
              "### Token level (exact nulls; SEs over images)", "",
              "| setting | excess surprise / token [95% CI] (z) | mean PIT (z vs 1/2) | TV lower bound, PIT [95% CI] (z) | "
              "KL(P^‖P) / token, lower bound (PIT), bias-corrected [95% CI] | plug-in (its mean under P) |", "|---|---|---|---|---|---|"]
    for n, e in S.items():
        x, p = e["excess_surprise_per_token"], e["pit"]
        tv, kl = p["tv_lower_bound"], p["kl_forward_per_token_lower_bound"]
        lines.append(f"| {e['label']} | {_ci(x['value'], *x['ci'])} ({x['z']:+.2f}) | {p['pit_mean']:.4f} "
                     f"({p['pit_mean_z']:+.2f}) | {_ci(tv['value'], *tv['ci'], f='{:.4f}')} ({tv['z']:+.2f}) | "
                     f"{_ci(kl['value'], *kl['ci'], f='{:.2e}')} | {kl['plug_in']:.2e} ({kl['floor_under_P']:.1e}) |")
    lines += ["", "### Image level (against the plain-AR images)", "",
              "| setting | NLL / token (SE) | NLL shift vs AR [95% CI] (z) | FD to held-out [95% CI] | FD shift vs AR (z) | "
              "TV lower bound [95% CI] (z) | KL(P^‖P) / token, lower bound, bias-corrected [95% CI] | KL(P‖P^) / token, "
              "lower bound, bias-corrected [95% CI] | chosen statistic |", "|---|---|---|---|---|---|---|---|---|"]
    for n, e in S.items():
        fd = e["fd_heldout"]
        row = (f"| {e['label']} | {e['nll_per_token']:.4f} ({e['nll_per_token_se']:.4f}) | ")
        if n == "ar":
            row += f"- | {_ci(fd['fd'], *fd['ci'], f='{:.1f}')} | - | - | - | - | - |"
        else:
            s, t = e["nll_shift_vs_ar"], e["two_sample"]
            tv, kf, kr = t["tv_lower_bound"], t["kl_forward_lower_bound"], t["kl_reverse_lower_bound"]
            row += (f"{_ci(s['value'], *s['ci'])} ({s['z']:+.2f}) | {_ci(fd['fd'], *fd['ci'], f='{:.1f}')} | "
                    f"{e['fd_shift_vs_ar']['value']:+.1f} ({e['fd_shift_vs_ar']['z']:+.2f}) | "
                    f"{_ci(tv['value'], *tv['ci'], f='{:.3f}')} ({tv['z']:+.2f}) | "
                    f"{_ci(kf['per_token'], *kf['per_token_ci'], f='{:.2e}')} | "
                    f"{_ci(kr['per_token'], *kr['per_token_ci'], f='{:.2e}')} | {t['statistic']} |")
        lines.append(row)
    lines += ["", f"log P(x) as scored here against `real.decode.score.score` (the engine's law) on 4 AR images: "
              f"largest difference {rep['log_p_check_max_abs_diff_vs_engine_score']:.2e} nats.", "",
              "## Verdicts", ""]
    for v in rep["verdicts"]:
        if "z" in v:
            lines.append(f"* **{v['id']}**: {v['statement']}: difference {v['difference']:+.3f} tokens per call "
                         f"(SE {v['se']:.3f}, z = {v['z']:+.2f}): {'holds' if v['holds'] else 'does not hold'}.")
        elif "comparison" in v:
            d = v["comparison"]
            lines.append(f"* **{v['id']}**: {v['statement']}: " + ("-" if d is None else
                         f"difference {d['difference']:+.2e} (SE {d['se']:.2e}, z = {d['z']:+.2f})") + f": {v['verdict']}.")
        else:
            lines.append(f"* **{v['id']}**: {v['statement']}: PIT TV-bound z = {v['pit_tv_lower_bound_z']:+.2f}, excess "
                         f"surprise z = {v['excess_surprise_z']:+.2f} (image level: TV-bound z = "
                         f"{v['image_tv_lower_bound_z']:+.2f}, NLL-shift z = {v['nll_shift_z']:+.2f}): "
                         f"{'yes' if v['holds'] else 'no'} (expected: {v['expected']}).")
    if rep["missing_settings"]:
        lines += ["", "Settings not complete: " + ", ".join(rep["missing_settings"]) + "."]
    return "\n".join(lines) + "\n"
