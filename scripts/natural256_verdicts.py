"""MNIST against natural256, verdict by verdict (issue 49): which of the toolkit's verdicts hold on the natural-image
model, which flip, and by how much. Reads the committed reports (contract formats) of both models:

* the chain frontier's ``report.json`` (``claims``: the paper's comparisons, KL and TV verdicts with z) and the
  predicted sweep's ``predicted.json`` (Spearman correlation of predicted KL(P||P^) with measured KL, over settings);
* ``scripts/trees_fidelity.py``'s ``report.json`` (Cool-SD against LANTERN++ on the static tree: verdicts with z; how
  many images give Cool-SD KL(P||P^) = inf).

  python scripts/natural256_verdicts.py --mnist docs/results --natural256 docs/results/natural256 \
      --out docs/results/natural256/verdicts.md
"""
from __future__ import annotations

import argparse
import json
import pathlib

from scipy.stats import spearmanr


def _images(rep, tree: str) -> str:
    """The fewest images of any setting on ``tree`` in a trees_fidelity report, as text (thousands separated)."""
    n = [s["n_images"] for s in (rep or {}).get("settings", []) if s.get("tree") == tree]
    return f"{min(n):,}" if n else "no"


def _load(path: pathlib.Path):
    return json.loads(path.read_text()) if path.is_file() else None


def chain_claims(rep) -> dict:
    """{claim id: (KL verdict, z), ...} of a frontier report."""
    if rep is None:
        return {}
    out = {}
    for c in rep.get("claims", []):
        k = c.get("kl_to_target") or {}
        out[c["id"]] = (k.get("verdict"), k.get("z"), c.get("claim"))
    return out


def spearman(pred) -> tuple[float | None, int]:
    """Spearman correlation of predicted KL(P||P^) and measured KL(P^||P) per token over the relaxed settings."""
    if pred is None:
        return None, 0
    rows = [s for s in pred["comparison"]["settings"] if s["key"] != "vanilla"
            and s.get("kl_ar_predicted") is not None and s.get("kl_sd_measured") is not None]
    if len(rows) < 3:
        return None, len(rows)
    return float(spearmanr([r["kl_ar_predicted"] for r in rows], [r["kl_sd_measured"] for r in rows])[0]), len(rows)


def tree_verdicts(rep, tree: str = "eagle25") -> list[tuple]:
    """[(b, verdict, z, delta KL)] of Cool-SD's frontier against each LANTERN++ setting on ``tree``."""
    if rep is None:
        return []
    return [(v["b"], v["verdict"], v.get("z"), v.get("delta_kl_per_token")) for v in rep["verdicts"]
            if v["a"].startswith("cool-sd frontier") and f"({tree})" in v["a"]]


def inf_share(rep, tree_key: str = "eagle25") -> list[str]:
    """Cool-SD settings on the static tree: how many images have KL(P||P^) = inf."""
    if rep is None:
        return []
    out = []
    for s in rep["settings"]:
        if s["name"].startswith("cool-sd") and s.get("tree", tree_key) == tree_key:
            k = s["kl_ar_per_token"]
            out.append(f"{s['name']}: " + (f"{k['measured']:.4f}" if k.get("measured") is not None else "inf"))
    return out


def tuned_verdicts(rep) -> dict:
    """{schedule family: "verdict (z = ...) at target; ..."} of the tuned-schedule study's report (its settings
    against Cool-SD interpolated at their measured tokens per call)."""
    out: dict = {}
    for v in (rep or {}).get("verdicts", []):
        fam = v["a"].split("@")[0]
        out.setdefault(fam, []).append(f"{v['verdict']}{fmt_z(v['z'])} at {v['target']:g}")
    return {k: "; ".join(v) for k, v in out.items()}


def fmt_z(z) -> str:
    return "" if z is None else f" (z = {z:+.1f})"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mnist", type=pathlib.Path, default=pathlib.Path("docs/results"))
    p.add_argument("--natural256", type=pathlib.Path, default=pathlib.Path("docs/results/natural256"))
    p.add_argument("--out", type=pathlib.Path, required=True)
    a = p.parse_args(argv)
    m, n = a.mnist, a.natural256
    rows = []
    cm, cn = chain_claims(_load(m / "frontier/report.json")), chain_claims(_load(n / "frontier/report.json"))
    for cid in sorted(set(cm) | set(cn)):
        vm, vn = cm.get(cid, (None, None, None)), cn.get(cid, (None, None, None))
        rows.append((f"chain L = 4: {vm[2] or vn[2]} (KL)", f"{vm[0]}{fmt_z(vm[1])}", f"{vn[0]}{fmt_z(vn[1])}"))
    sm, km = spearman(_load(m / "frontier/predicted.json"))
    sn, kn = spearman(_load(n / "frontier/predicted.json"))
    rows.append(("predicted frontier: Spearman of predicted KL(P||P^) vs measured KL(P^||P) over settings",
                 "n/a" if sm is None else f"{sm:.3f} ({km} settings)", "n/a" if sn is None else f"{sn:.3f} ({kn} settings)"))
    tm, tn = _load(m / "trees_fidelity/report.json"), _load(n / "trees_fidelity/report.json")
    def key(b):   # LANTERN++'s lambda and resampler (natural256 ran k = 10, the paper's; MNIST the default k ~ V / 16)
        b = b.split(" (")[0].replace("k=10:", "")
        return b if "resampler" in b else b + ":resampler=lantern"
    for tree, label, short in (("eagle25", "static 25-node tree", "static tree"),
                               ("dynamic", "release dynamic tree", "release dynamic tree")):
        vm = {key(b): (v, z) for b, v, z, _ in tree_verdicts(tm, tree)}
        vn = {key(b): (v, z) for b, v, z, _ in tree_verdicts(tn, tree)}
        for b in sorted(set(vm) | set(vn)):
            x, y = vm.get(b, ("not run", None)), vn.get(b, ("not run", None))
            rows.append((f"{label}: Cool-SD frontier vs {b} (KL(P^||P))", f"{x[0]}{fmt_z(x[1])}",
                         f"{y[0]}{fmt_z(y[1])}"))
        rows.append((f"{short}: Cool-SD's KL(P||P^)", "; ".join(inf_share(tm, tree)) or "not run",
                     "; ".join(inf_share(tn, tree)) or "not run"))
    um, un = tuned_verdicts(_load(m / "tuned_exact/report.json")), tuned_verdicts(_load(n / "tuned/report.json"))
    for fam in sorted(set(um) | set(un)):
        rows.append((f"tuned schedules, fresh images: {fam} vs Cool-SD at equal measured tokens per call (KL(P^||P))",
                     um.get(fam, "not run"), un.get(fam, "not run")))
    lines = ["# MNIST against natural256, verdict by verdict (issue 49)", "",
             "Each row: the verdict on the shipped MNIST models and on natural256, with its z where it has one. "
             "Sources: `docs/results/{frontier,trees_fidelity}` (MNIST) and `docs/results/natural256/{frontier,"
             "trees_fidelity}` (natural256). Made by `python scripts/natural256_verdicts.py`. Static tree: natural256 ran "
             f"{_images(tn, 'eagle25')} images per setting and LANTERN++ with k = 10 neighbours (the paper's), MNIST "
             f"{_images(tm, 'eagle25')} images with the default k (about V / 16); dynamic tree: natural256 "
             f"{_images(tn, 'dynamic')} images per setting, MNIST {_images(tm, 'dynamic')}; tuned schedules: "
             "1,000 fresh images per setting on natural256, 2,000 on MNIST. Every z counts the measured tokens per "
             "call's error (delta method). \"not run\": the study was not run on that model.", "",
             "| verdict | MNIST | natural256 |", "|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines) + "\n")
    (a.out.with_suffix(".json")).write_text(json.dumps([dict(zip(("verdict", "mnist", "natural256"), r)) for r in rows],
                                                       indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
