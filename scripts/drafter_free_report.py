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
             f"D = {c['pac_depth']}), {rep['tokens_per_image']} tokens per image. Wall seconds are from a shared "
             "2-core machine: indicative only.", "",
             "## Speed", "",
             "| setting | tokens / call [95% CI] | target calls / image | one-token share (all / drafted calls) | "
             "wall s / image |", "|---|---|---|---|---|"]
    for n, e in S.items():
        dr = e["one_token_share_drafted_calls"]
        lines.append(f"| {e['label']} | {_ci(e['tokens_per_call'], *e['tokens_per_call_ci'], f='{:.3f}')} | "
                     f"{e['target_calls_per_image']:.1f} | {e['one_token_share_all_calls']:.3f} / "
                     f"{'-' if dr is None else f'{dr:.3f}'} | {e['wall_per_image']:.3f} |")
    lines += ["", "## Fidelity", "", "Exact likelihood: " + rep["exact_likelihood"] + ". Measured instead, against "
              "the plain-AR images of the same run (see the script's docstring):", "",
              "| setting | NLL / token (SE) | NLL shift vs AR [95% CI] (z) | FD to held-out [95% CI] | FD shift vs AR (z) | "
              "TV lower bound [95% CI] (z) | KL(P^‖P) / token, lower bound [95% CI] | KL(P‖P^) / token, lower bound "
              "[95% CI] | chosen statistic |", "|---|---|---|---|---|---|---|---|---|"]
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
        else:
            lines.append(f"* **{v['id']}**: {v['statement']}: TV-bound z = {v['tv_lower_bound_z']:+.2f}, NLL-shift "
                         f"z = {v['nll_shift_z']:+.2f}: {'yes' if v['holds'] else 'no'} (expected: {v['expected']}).")
    if rep["missing_settings"]:
        lines += ["", "Settings not complete: " + ", ".join(rep["missing_settings"]) + "."]
    return "\n".join(lines) + "\n"
