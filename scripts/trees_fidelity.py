"""The paper's comparison on draft trees, measured exactly (issue 38): Cool-SD vs LANTERN++ (as released, and with G*)
at equal measured tokens per target call, by KL(P^||P) per token with 95% intervals.

Input: the report.json of one ``coolsd sweep`` per tree (``--static DIR``: ``--tree eagle25 --tree-candidates topk``;
``--dynamic DIR``: ``--tree dynamic --tree-sampling release``), each with vanilla, Cool-SD at several deltas and
LANTERN++ at several lambdas with its own resampler and with G* (``resampler=optimal``). Every image of every setting
was scored exactly by the sweep's merge (``coolsd.studies.sweep.fidelity``: teacher-forced tree rows,
``theory.likelihood.tree_log_likelihood``), KL(P^||P) from the setting's own images, KL(P||P^) and a second TV from
the plain-AR images.

Output (``--out``): report.json with exactly the contract

  {"settings": [{"name", "tree", "candidates", "tokens_per_call": {"measured", "ci"}, "kl_per_token": {"measured",
                 "ci"}, "kl_ar_per_token": {"measured", "ci"}, "tv": {"measured", "ci"}, "n_images"}, ...],
   "verdicts": [{"a", "b", "delta_kl_per_token", "se", "z", "verdict"}, ...]}

(an infinite KL, which happens when the sampler gives probability 0 to images the target emits, is "measured": null,
"ci": null; report.md gives the count), and report.md. Verdicts: A's KL(P^||P) per token interpolated linearly along
A's frontier (Cool-SD's delta, or LANTERN++ G*'s lambda) at B's measured tokens per call, minus B's
(``coolsd.studies.sweep.metrics.frontier_difference``: independent settings, SE by the delta method over both the
KLs and the measured tokens per call); "A lower" when z <= -2, "B lower" when z >= 2, else "not separable"; "not testable"
when B's tokens per call lie outside A's range.

  python scripts/trees_fidelity.py --static RUN/static --dynamic RUN/dynamic --out docs/results/trees_fidelity
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from coolsd.studies.sweep.metrics import frontier_difference   # noqa: E402

Z95 = 1.959963984540054
Z = 2.0


def _ci(m: float, se: float) -> list:
    return [m - Z95 * se, m + Z95 * se]


def _kl(d: dict | None, T: int):
    """({"measured", "ci"} per token, SE per token or None, infinite count) of a sweep KL entry."""
    if not d or d.get("measured") is None:
        return {"measured": None, "ci": None}, None, (d or {}).get("n_infinite")
    pt = d["per_token"]
    return {"measured": pt["measured"], "ci": list(pt["ci"])}, d["se"] / T, 0


def settings_of(rep: dict, tree: str, candidates: str) -> list[dict]:
    """The contract's setting entries of one sweep report (plus private fields, dropped before writing)."""
    T = int(rep["config"]["num_tokens"])
    out = []
    for m in rep["methods"]:   # a loop over the sweep's settings
        a = m["accepted_length"]
        kl, kl_se, kl_inf = _kl(m.get("kl_to_target"), T)
        kla, _, kla_inf = _kl(m.get("kl_from_ar"), T)
        tv = m.get("tv_to_target") or {}
        out.append({"name": m["key"], "tree": tree, "candidates": candidates,
                    "tokens_per_call": {"measured": a["measured"], "ci": _ci(a["measured"], a["measured_se"])},
                    "kl_per_token": kl, "kl_ar_per_token": kla,
                    "tv": {"measured": tv.get("measured"), "ci": tv.get("ci")}, "n_images": m["images"],
                    "_kl_se": kl_se, "_tpc_se": a["measured_se"], "_method": m["name"], "_params": m["params"],
                    "_kl_inf": kl_inf, "_kla_inf": kla_inf, "_tv_ar": (tv.get("from_ar"), tv.get("from_ar_ci")),
                    "_reason": m.get("fidelity_reason")})
    return out


def _family(entries: list[dict], method: str, resampler: str | None = None) -> list[dict]:
    return [e for e in entries if e["_method"] == method
            and (resampler is None or e["_params"].get("resampler", "lantern") == resampler)]


def verdicts(entries: list[dict], tree: str) -> list[dict]:
    """Cool-SD's frontier against every LANTERN++ point (both resamplers), and LANTERN++ G*'s frontier against every
    LANTERN++ (own resampler) point, at B's measured tokens per call."""
    pairs = [(f"cool-sd frontier ({tree})", _family(entries, "cool-sd"), e) for e in _family(entries, "lantern++")]
    pairs += [(f"lantern++ G* frontier ({tree})", _family(entries, "lantern++", "optimal"), e)
              for e in _family(entries, "lantern++", "lantern")]
    out = []
    for a_name, fa, eb in pairs:   # a loop over the comparisons (a handful)
        fa = [e for e in fa if e["kl_per_token"]["measured"] is not None]
        row = {"a": a_name, "b": f"{eb['name']} ({tree})", "delta_kl_per_token": None, "se": None, "z": None}
        if eb["kl_per_token"]["measured"] is None or len(fa) < 2:
            out.append({**row, "verdict": "not testable (a KL is missing or infinite)"})
            continue
        r = frontier_difference([e["tokens_per_call"]["measured"] for e in fa],
                                [e["kl_per_token"]["measured"] for e in fa], [e["_kl_se"] for e in fa],
                                [eb["tokens_per_call"]["measured"]], [eb["kl_per_token"]["measured"]], [eb["_kl_se"]],
                                [e["_tpc_se"] for e in fa], [eb["_tpc_se"]])
        if r is None:
            out.append({**row, "verdict": "not testable (B's tokens per call lie outside A's range)"})
            continue
        v = "A lower KL" if r["z"] <= -Z else "B lower KL" if r["z"] >= Z else "not separable"
        out.append({**row, "delta_kl_per_token": r["difference"], "se": r["se"], "z": r["z"], "verdict": v})
    return out


def _f(x, nd=4):
    return "-" if x is None else f"{x:.{nd}f}"


def _c(d: dict, nd=4, inf=None) -> str:
    if d["measured"] is None:
        return f"inf ({inf} images)" if inf else "-"
    return f"{d['measured']:.{nd}f} [{d['ci'][0]:.{nd}f}, {d['ci'][1]:.{nd}f}]"


def markdown(entries: list[dict], ver: list[dict], meta: dict) -> str:
    lines = ["# Cool-SD vs LANTERN++ on draft trees, measured exactly", "",
             "Every image scored exactly (teacher-forced tree rows, `theory.likelihood.tree_log_likelihood`). "
             "KL(P^||P) from the setting's own images, KL(P||P^) and TV (AR) from the plain-AR images; 95% normal "
             "intervals over images. See COMMAND.md for the commands and wall clock.", ""]
    for tree in dict.fromkeys(e["tree"] for e in entries):
        lines += [f"## {tree} ({meta.get(tree, '')})", "",
                  "| setting | images | tokens/call [95% CI] | KL(P^‖P)/token [95% CI] | KL(P‖P^)/token [95% CI] | "
                  "TV, SD images [95% CI] | TV, AR images [95% CI] |", "|---|---|---|---|---|---|---|"]
        for e in [e for e in entries if e["tree"] == tree]:
            tva, tvaci = e["_tv_ar"]
            tv_ar = "-" if tva is None else f"{tva:.3f} [{tvaci[0]:.3f}, {tvaci[1]:.3f}]"
            tv = "-" if e["tv"]["measured"] is None else \
                f"{e['tv']['measured']:.3f} [{e['tv']['ci'][0]:.3f}, {e['tv']['ci'][1]:.3f}]"
            if e["_reason"]:
                tv = e["_reason"]
            lines.append(f"| {e['name']} | {e['n_images']} | {_c(e['tokens_per_call'], 3)} | "
                         f"{_c(e['kl_per_token'], 4, e['_kl_inf'])} | {_c(e['kl_ar_per_token'], 4, e['_kla_inf'])} | "
                         f"{tv} | {tv_ar} |")
        lines.append("")
    lines += ["## Verdicts at equal measured tokens per call", "",
              "A's KL(P^||P) per token interpolated along A's frontier at B's tokens per call, minus B's; z = "
              "difference / SE; |z| >= 2 decides.", "",
              "| A | B | ΔKL/token (A - B) | SE | z | verdict |", "|---|---|---|---|---|---|"]
    for v in ver:
        lines.append(f"| {v['a']} | {v['b']} | {_f(v['delta_kl_per_token'])} | {_f(v['se'])} | "
                     f"{_f(v['z'], 2)} | {v['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--static", required=True, help="the static-tree sweep's directory (report.json)")
    ap.add_argument("--dynamic", default=None, help="the dynamic-tree sweep's directory (report.json)")
    ap.add_argument("--dynamic-extra", default=None,
                    help="a second dynamic-tree sweep of the same tree (more Cool-SD deltas, say): its settings join "
                         "the dynamic tree's (its vanilla and AR figures are left out)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    entries, ver, meta = [], [], {}
    for path, tree in ((args.static, None), (args.dynamic, "dynamic")):
        if path is None:
            continue
        rep = json.loads((pathlib.Path(path) / "report.json").read_text())
        cfg = rep["config"]
        if tree is None:
            tree = str(cfg["tree"])
        cand = "topk" if cfg.get("dynamic") else (rep["config"].get("tree_candidates") or "topk")
        if cfg.get("dynamic"):
            total, depth, topk, sampling = cfg["dynamic"]
            meta[tree] = f"total {total}, depth {depth}, top {topk}, {sampling} construction"
        else:
            meta[tree] = f"static, {cand} candidates"
        e = settings_of(rep, tree, cand)
        if tree == "dynamic" and args.dynamic_extra:
            extra = json.loads((pathlib.Path(args.dynamic_extra) / "report.json").read_text())
            if extra["config"].get("dynamic") != cfg.get("dynamic"):
                raise SystemExit(f"--dynamic-extra: another tree ({extra['config'].get('dynamic')} vs {cfg.get('dynamic')})")
            have = {x["name"] for x in e}
            e += [x for x in settings_of(extra, tree, cand) if x["_method"] != "vanilla" and x["name"] not in have]
            e.sort(key=lambda x: (x["_method"] != "vanilla", x["_method"], x["tokens_per_call"]["measured"]))
        entries += e
        ver += verdicts(e, tree)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    public = [{k: v for k, v in e.items() if not k.startswith("_")} for e in entries]
    clean = json.loads(json.dumps({"settings": public, "verdicts": ver},
                                  default=lambda x: None), parse_constant=lambda c: None)
    for v in clean["verdicts"]:
        for k in ("delta_kl_per_token", "se", "z"):
            if isinstance(v[k], float) and not math.isfinite(v[k]):
                v[k] = None
    (out / "report.json").write_text(json.dumps(clean, indent=1, allow_nan=False) + "\n")
    (out / "report.md").write_text(markdown(entries, ver, meta))
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
