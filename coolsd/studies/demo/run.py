"""The main job (``coolsd demo``): predicted vs measured trade-offs of relaxed speculative decoding on the
shipped MNIST models (never trains).

Runs (``specs``), on the same digits (class i mod 10; batch k of them with seed + k), generated round robin
over batches and split over ``Settings.workers`` processes (``coolsd.studies.demo.generation``): plain AR (the
speed and quality baseline); vanilla SD with chain drafts (L = 4, the EAGLE-1 drafter) recording the processed P
and Q rows of every round; Cool-SD at several deltas, UniformRSD, LANTERN, LANTERN++, LANTERN+G*; static
trees (EAGLE-1's 25-node tree) with vanilla (recording), Cool-SD and every other rule; optionally
(``extra_draft``, ``--extra-draft small``) one vanilla chain run with the independent small draft,
reported apart.

Predictions use only the recorded vanilla rows (``coolsd.studies.demo.predict``).
Measured: tokens per target call (SE over rounds), wall-clock speed-up over plain AR, Frechet distance of
the decoded digits to the held-out digits in the shipped classifier's space (delete-one jackknife SE,
the sweep's ``coolsd.quality.estimators.fd_with_ci``), class accuracy, the target's NLL per
token of the generated codes (``coolsd.studies.demo.quality``); for chain runs the exact TV and KL to the
target with 95% intervals and the per-image TV bound (``coolsd.studies.demo.fidelity``; in a worker of its own
beside the predictions when ``workers`` > 1).

Outputs in ``out``: report.json (the contract: ``{"methods": [{"name", "params", "drafting",
"accepted_length": {"predicted", "measured", "measured_se"}, "speedup": {"predicted", "measured"},
"frechet_distance", "class_accuracy", "tv_bound", ...}], ...}``), report.md and the PNG figures of
``coolsd.studies.demo.report``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import platform
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory import rules

from . import report as demo_report
from .predict import chain_arrays, chain_prediction, predicted_speedup, sweep_predictions, time_verifier, \
    tree_prediction, tree_records, unit_costs
from .fidelity import round_arrays, target_scores
from .generation import digit_classes, generate_all, models_and_runs
from .quality import fd_with_se, manifest_floor, real_floor
from .report import find_method
from .settings import T_IMAGE, Settings, chain_drafted, tree_drafted
from coolsd.workers import Spawned

@dataclass
class Result:
    spec: Spec | None
    gens: list
    tokens: torch.Tensor
    stats: dict
    extra: dict = field(default_factory=dict)


def run_demo(out: str | pathlib.Path, settings: Settings | None = None, progress: bool = True) -> dict:
    """Run the whole job and write report.json, report.md and the figures into ``out``; returns the report."""
    from real.decode import engine
    from real.decode.sampling import Processing
    from real.zoo.checkpoint import read_manifest

    s = settings or Settings()
    if s.n_images < 2:
        raise ValueError(f"n_images must be >= 2 (standard errors), got {s.n_images}")
    if not set(s.tree_deltas) <= set(s.deltas):
        raise ValueError(f"tree_deltas {s.tree_deltas} must be among the chain deltas {s.deltas} (chain vs tree)")
    if str(s.device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
    if not isinstance(s.workers, int) or isinstance(s.workers, bool) or s.workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {s.workers!r}")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_job = time.perf_counter()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    job = None
    try:
        models = models_and_runs(s)
        target, drafts, runs = models
        tree = s.tree_obj()
        proc = Processing(temperature=s.temperature, cfg_scale=s.cfg_scale)
        classes = digit_classes(s)
        gens = generate_all(s, models, progress)
        results = {"ar": Result(None, [], torch.stack([g.tokens for g in gens["ar"]]), engine.summarize(gens["ar"]))}
        rounds = {sp.key: np.array([len(x.rounds) for x in gens[sp.key]]) for sp in runs}
        for sp in runs:
            g = gens.pop(sp.key)
            extra = {"rounds": round_arrays(g, T_IMAGE)} if not sp.tree_drafted else {}
            results[sp.key] = Result(sp, g if sp.record else [], torch.stack([x.tokens for x in g]), engine.summarize(g),
                                     extra)
        # the target's passes over the codes (exact fidelity, NLL) in another worker while this one predicts
        runs_out = {k: (r.tokens, r.extra) for k, r in results.items()}
        job = Spawned(target_scores, s, runs_out) if s.workers > 1 else None
        torch.set_num_threads(max(old_threads, 1) if job is None else s.threads)   # the cores are shared
        report = _analyse(s, runs, results, target, tree, classes, progress)
        report["batch_note"] = _batch_note(s, runs, rounds, target, drafts, proc)
        sc = job.result() if job is not None else target_scores(s, runs_out, models=models)
        report["baseline"].update(sc["nll"]["ar"])
        for m, sp in zip([m for m in report["methods"] + report["other_drafts"]],
                         [sp for sp in runs if not sp.extra] + [sp for sp in runs if sp.extra]):
            m.update(sc["nll"][sp.key])
            m.update(sc["fidelity"][sp.key])
        report["fidelity_s"] = sc["fidelity_s"]
    finally:
        torch.set_num_threads(old_threads)
        if job is not None:
            job.close()
    report["manifest"] = {k: {"sha256": v["sha256"], "command": v.get("command")}
                          for k, v in read_manifest()["files"].items()}
    report["predicted_sweeps"] = sweep_predictions(report, results, s)
    report["figures"] = demo_report.figures(out, report, results, s)
    report["wall_clock_s"] = time.perf_counter() - t_job
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(demo_report.markdown(report))
    return report


def _batch_note(s: Settings, runs, rounds: dict, target, drafts: dict, proc) -> dict:
    """Where SD stops paying with batch size on this machine (``coolsd.studies.batching``), for the chain
    methods of the main table (tree rounds cost otherwise; ``benchmarks/bench_tree.py``)."""
    from coolsd.studies import batching

    Bs = batching.batches_up_to(s.batch_size)
    costs = {B: batching.unit_costs(target, drafts[s.chain_draft], B, proc, s.L) for B in Bs}
    per = {" ".join([sp.name, *(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sp.params.items())]):
           batching.stops_paying(rounds[sp.key], costs, T_IMAGE, s.L)
           for sp in runs if not sp.tree_drafted and sp.draft == s.chain_draft and not sp.extra}
    return {"batches": list(Bs), "unit_costs": {str(B): c for B, c in costs.items()},
            "methods": {k: {"stops_paying_at": v["stops_paying_at"],
                            "predicted": {str(B): x for B, x in v["predicted"].items()}} for k, v in per.items()},
            "text": batching.note(per, s.batch_size, s.device)}


def _analyse(s: Settings, runs, results, target, tree, classes, progress: bool = False) -> dict:
    from real.zoo import vq
    from real.zoo.metrics import class_accuracy

    labels = torch.tensor(classes)
    ar = results["ar"]
    # the recorded vanilla run of each (drafting, draft) is the only input of that setting's predictions
    sources = {}
    for sp in runs:
        if sp.record:
            res = results[sp.key]
            data = tree_records(res.gens) if sp.tree_drafted else chain_arrays(res.gens, s.L)
            c = unit_costs(res.stats, ar.stats)
            c["cost_ratio_draft_over_ar_step"] = c["draft_step_s"] / c["ar_step_s"]
            c["cost_ratio_target_pass_over_ar_step"] = c["target_per_round_s"] / c["ar_step_s"]
            sources[(sp.drafting, sp.draft)] = (data, c)
    def quality(tokens: torch.Tensor, seed: int) -> dict:
        images = vq.decode(tokens)
        fd, fd_se = fd_with_se(images)
        acc = class_accuracy(images, labels)
        return {"frechet_distance": fd, "frechet_distance_se": fd_se, "class_accuracy": acc,
                "class_accuracy_se": math.sqrt(acc * (1 - acc) / len(labels))}

    from tqdm import tqdm

    methods, others = [], []
    ar_q = quality(ar.tokens, 0)
    for j, sp in enumerate(tqdm(runs, desc="predict + measure", disable=not progress, unit="run")):
        res = results[sp.key]
        st = res.stats
        data, c = sources[(sp.drafting, sp.draft)]
        if not sp.tree_drafted:
            pred = chain_prediction(data, sp.rule, s.L, sp.draft == "eagle")
            verify_s = time_verifier(data, sp.verifier, None, device=s.device)
        else:
            pred = tree_prediction(data, sp.rule, tree,
                                   draft_law="point" if s.tree_candidates == "topk" else "without_replacement")
            verify_s = time_verifier(data, sp.verifier, tree, device=s.device)
        measured = st["tokens_per_target_call"]
        entry = {
            "name": sp.name, "params": sp.params, "drafting": sp.drafting, "draft": sp.draft,
            "L": tree.depth if sp.tree_drafted else s.L,
            **({"tree": {"nodes": tree.n_nodes, "depth": tree.depth, "name": s.tree}} if sp.tree_drafted else {}),
            "accepted_length": {"predicted": pred["tokens_per_call"], "measured": measured,
                                "measured_se": st["tokens_per_target_call_se"],
                                "relative_error": (pred["tokens_per_call"] - measured) / measured,
                                "predicted_rounds_per_image": pred["rounds"],
                                "measured_rounds_per_image": st["rounds"] / st["images"],
                                "predicted_per_round_mean": 1.0 + pred["per_round_accepted"]},
            "speedup": {"predicted": predicted_speedup(pred, c, verify_s), "measured": ar.stats["seconds"] / st["seconds"],
                        "verifier_s_per_round_timed": verify_s},
            **quality(res.tokens, j + 1),
            "tv_bound": pred["tv_bound"], "tv_bound_se": pred["tv_bound_se"],
            "tv_bound_rounds": pred.get("tv_bound_rounds", st["rounds"]),
            "acceptance_rate": st["acceptance_rate"], "seconds": st["seconds"], "rounds": st["rounds"],
            "images": st["images"], "time_split_s": {k: st[k] for k in ("time_draft_s", "time_target_s", "time_verify_s")},
            "predicted_from": f"vanilla {sp.drafting} run with the {sp.draft} draft: recorded P/Q rows "
                              + ("(T10/T11, theory.likelihood.recorded.predict_rounds)" if not sp.tree_drafted
                                 else "(theory.likelihood.recorded.predict_tree_rounds)"),
        }
        (others if sp.extra else methods).append(entry)
    floor = real_floor(s.n_images, s.seed)
    checks = _checks(methods)
    return {
        "methods": methods,
        "other_drafts": others,
        "baseline": {"name": "ar", "seconds": ar.stats["seconds"], "tokens_per_target_call": 1.0, **ar_q},
        "floors": {"real_digits_same_n": floor,
                   "manifest_fd_train_n_vs_heldout": manifest_floor()},
        "costs": {f"{k[0]} ({k[1]} draft)": v[1] for k, v in sources.items()},
        "checks": checks,
        "config": {**{k: v for k, v in dataclasses.asdict(s).items()}, "T": T_IMAGE,
                   "tree_paths": [list(p) for p in tree.paths],
                   "cool_sd_norm": rules.COOL_SD_NORM,
                   "cool_sd_weights": {str(d): [float(rules.cool_sd_schedule(d, s.nu)(i, np)) for i in range(1, s.L + 1)]
                                       for d in s.deltas},
                   "torch": torch.__version__, "python": platform.python_version()},
    }


def _checks(methods) -> dict:
    """The demo's pass/fail checks (report["checks"]), computed from the report itself: the vanilla chain
    prediction within 5 %, Cool-SD with delta > 1 accepting more than vanilla, trees over chains."""
    out = {}
    van = find_method(methods, "vanilla", "chain")
    a = van["accepted_length"]
    out["vanilla_chain_prediction_within_5pct"] = {"predicted": a["predicted"], "measured": a["measured"],
                                                    "relative_error": a["relative_error"],
                                                    "z": (a["predicted"] - a["measured"]) / a["measured_se"],
                                                    "pass": bool(abs(a["relative_error"]) < 0.05)}
    cs = []
    for m in methods:
        if m["name"] == "cool-sd" and chain_drafted(m["drafting"]) and m["params"]["delta"] > 1:
            b = m["accepted_length"]
            se = math.hypot(b["measured_se"], a["measured_se"])
            cs.append({"delta": m["params"]["delta"], "measured": b["measured"], "vanilla": a["measured"],
                       "difference_in_se": (b["measured"] - a["measured"]) / se, "pass": bool(b["measured"] > a["measured"])})
    out["cool_sd_delta_gt_1_accepts_more_than_vanilla"] = {"runs": cs, "pass": bool(cs) and all(c["pass"] for c in cs)}
    tv = []
    for m in methods:
        if tree_drafted(m["drafting"]):
            ch = find_method(methods, m["name"], "chain", **m["params"])
            if ch is not None:
                tv.append({"name": m["name"], "params": m["params"], "chain": ch["accepted_length"]["measured"],
                           "tree": m["accepted_length"]["measured"],
                           "pass": bool(m["accepted_length"]["measured"] > ch["accepted_length"]["measured"])})
    out["tree_raises_tokens_per_call_over_chain"] = {"runs": tv, "pass": bool(tv) and all(t["pass"] for t in tv)}
    return out
