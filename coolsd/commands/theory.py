"""`coolsd theory ...`: exact numbers for synthetic Markov chains."""
from __future__ import annotations

import json


def register(sub):
    th = sub.add_parser("theory", help="exact theory on synthetic Markov chains")
    tsub = th.add_subparsers(dest="theory_command", required=True)
    t = tsub.add_parser("table", help="E[tau], TV bound and exact TV of every verifier on one chain")
    add_chain_args(t)
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_cost_args(t)
    t.set_defaults(func=run_table)
    register_anneal(tsub)


def add_chain_args(p):
    p.add_argument("--chain", choices=["random", "ambiguous", "iid"], default="ambiguous",
                   help="chain family (default: ambiguous, near-uniform rows as for image tokens)")
    p.add_argument("--V", type=int, default=8, help="vocabulary size (default 8)")
    p.add_argument("--L", type=int, default=4, help="draft length (default 4)")
    p.add_argument("--tv", type=float, default=0.4, help="row-wise TV(P, Q) (default 0.4)")
    p.add_argument("--seed", type=int, default=0)


def add_cost_args(p):
    """--max-seconds: the run-time budget of the cost guard (theory.core.checks.check_cost), 0 = no limit."""
    from theory.core import checks

    p.add_argument("--max-seconds", type=float, default=checks.MAX_SECONDS,
                   help=f"refuse a run estimated to take longer (default {checks.MAX_SECONDS:g} s; 0: no limit)")


def max_seconds(args):
    from theory.core import checks

    v = checks.real("--max-seconds", args.max_seconds, 0)
    return None if v == 0 else v


def make_chain(args):
    from theory.markov import chains

    if args.chain == "random":
        return chains.random_pair(args.V, tv=args.tv, seed=args.seed)
    if args.chain == "iid":
        return chains.iid_pair(args.V, tv=args.tv, seed=args.seed)
    return chains.ambiguous_pair(args.V, spread=0.5, tv=args.tv, seed=args.seed)


# the table's rows: (method of theory.rules.methods, parameters); "k" is filled in from V
TABLE_METHODS = (("vanilla", {}), ("cool-sd", {"delta": 1.5}), ("cool-sd", {"delta": 3.0}), ("uniform-rsd", {"c": 1.5}),
                 ("linear-rsd", {"first": 3.0, "last": 1.0}), ("lantern", {"delta": 0.2}), ("lantern+G*", {"delta": 0.2}),
                 ("lantern++", {"lambda": 2.0}), ("typical", {}), ("greedy", {}))


def default_verifiers(V: int, L: int = 4, seed: int = 0):
    import numpy as np

    from theory.rules import methods
    from theory import rules

    nb = rules.lantern_neighbors(np.random.default_rng(seed).normal(size=(V, 2)))
    k = max(1, min(3, V - 2))
    return [methods.build(name, L, nb, {**p, **({"k": k} if methods.get(name).needs_neighbors else {})})
            for name, p in TABLE_METHODS]


def theory_table(P, Q, L: int, verifiers, init=0, max_sequences=10**7, max_bytes=None, max_seconds=None,
                 progress: bool = False):
    """E[tau], B and exact TV (None above max_sequences) of each verifier. Every verifier's table
    memory and time are estimated first (``markov.tables_bytes`` / ``tables_seconds``), so an oversized
    table is refused before any of them is computed; ``progress``: a bar over the verifiers."""
    from tqdm import tqdm

    from theory.core import checks
    from theory import markov

    check_table_size(P.shape[0], L, verifiers, max_bytes if max_bytes is not None else checks.MAX_BYTES,
                     max_seconds)
    rows = []
    for v in tqdm(verifiers, desc="theory table", disable=not progress, leave=False):
        F, G = markov.rule_tables(P, Q, L, v, max_seconds=None)     # the time of all of them was checked above
        e = markov.expected_accepted(P, Q, F, init)
        b = markov.tv_bound(P, Q, F, G, init)
        try:
            t = markov.exact_tv(P, Q, F, G, init, max_sequences=max_sequences)
        except ValueError:
            t = None
        rows.append({"name": v.name, "params": {k: _plain(x) for k, x in v.params.items()},
                     "expected_accepted": e, "tokens_per_target_call": e + 1, "tv_bound": b, "exact_tv": t})
    return rows


def check_table_size(V: int, L: int, verifiers, max_bytes, max_seconds=None) -> tuple[str, float]:
    """SizeError naming the largest verifier when its tables would exceed ``max_bytes``, or when all the
    tables together would take longer than ``max_seconds`` (``markov.tables_seconds``; the bound and E[tau]
    cost about as much again). Returns (the estimate as text, the estimated seconds)."""
    from theory.core import checks
    from theory import markov

    worst = max(verifiers, key=lambda v: markov.tables_bytes(v, V, L))
    secs = 2 * sum(markov.tables_seconds(v, V, L) for v in verifiers)
    est = checks.check_cost(f"--V {V} --L {L}: the {worst.name} tables", markov.tables_bytes(worst, V, L), secs,
                            max_bytes, max_seconds, "use a smaller --V or --L, or raise --max-seconds")
    return est, secs


def _plain(x):
    return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)


def format_table(rows) -> str:
    head = f"{'verifier':14s} {'params':34s} {'E[tau]':>8s} {'tok/call':>9s} {'TV bound':>9s} {'exact TV':>9s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items()
                           if k != "schedule")
        t = "n/a" if r["exact_tv"] is None else f"{r['exact_tv']:.4f}"
        lines.append(f"{r['name']:14s} {params[:34]:34s} {r['expected_accepted']:8.4f} "
                     f"{r['tokens_per_target_call']:9.4f} {r['tv_bound']:9.4f} {t:>9s}")
    return "\n".join(lines)


def run_table(args):
    from theory.core import checks

    from coolsd import validate

    checks.integer("--V", args.V, lo=2)
    checks.integer("--L", args.L, lo=1)
    checks.real("--tv", args.tv, 0, 1, hi_open=True)
    validate.common(args)     # the shared options (--seed, --threads, --device, --max-seconds ...): coolsd.validate
    # size check first, on stand-in verifiers of the same kinds (the estimate needs the rules' k, not the
    # V x V neighbour table, which alone takes seconds at V = 6000): refused before any V-sized work
    est, secs = check_table_size(args.V, args.L, default_verifiers(min(args.V, 8), min(args.L, 4), args.seed),
                                 checks.MAX_BYTES, max_seconds(args))
    validate.announce(est, "theory table", args.json, seconds=secs)
    verifiers = default_verifiers(args.V, args.L, args.seed)
    P, Q = make_chain(args)
    rows = theory_table(P, Q, args.L, verifiers, max_seconds=max_seconds(args), progress=secs > 10 and not args.json)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"chain={args.chain} V={args.V} L={args.L} TV(P,Q)={args.tv} seed={args.seed}; start state 0")
        print(format_table(rows))


# --------------------------------------------------------------------------- coolsd theory anneal

PARETO_CHAINS = (("ambiguous", "mixed", 6, 4, 0.2, "inside TV<=2/5"),
                 ("ambiguous", "mixed", 6, 4, 0.5, "outside TV<=2/5"))
CAPTION = ("Equal-E[tau] trade-off of acceptance schedules (G* resampling) on two order-1 chains "
           "(ambiguous rows, V = 6, L = 4, row TVs spread around the mean; top: max row TV <= 2/5, the paper's "
           "assumption; bottom: outside it). x: expected accepted drafts E[tau] per round; y: TV upper bound B "
           "(left) and exact TV (right) of one round, lower is better. 'optimal' is the free-weight schedule "
           "minimising that panel's objective.")


ANNEAL_FILES = ("anneal_cases.csv", "anneal_summary.json", "anneal_pareto.png")


def register_anneal(tsub):
    a = tsub.add_parser("anneal", help="annealing study: decaying vs uniform vs increasing schedules at equal E[tau]")
    a.add_argument("--out", required=True, help="output directory (CSV, JSON, PNG)")
    a.add_argument("--tvs", type=float, nargs="+", default=[0.1, 0.25, 0.4, 0.55, 0.7],
                   help="mean row TV(P, Q) levels (default 0.1 0.25 0.4 0.55 0.7)")
    a.add_argument("--Vs", type=int, nargs="+", default=[4, 8, 24], help="vocabulary sizes (default 4 8 24)")
    a.add_argument("--Ls", type=int, nargs="+", default=[2, 4], help="draft lengths (default 2 4)")
    a.add_argument("--seeds", type=int, default=2, help="chains per configuration (default 2)")
    a.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                   help="targets E[tau] as fractions of the way from vanilla to the largest reachable")
    a.add_argument("--no-optimize", action="store_true", help="skip the optimal-schedule columns (faster)")
    a.add_argument("--points", type=int, default=10, help="E[tau] points per Pareto curve (default 10)")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    add_cost_args(a)
    a.set_defaults(func=run_anneal)


def run_anneal(args):
    import csv
    import os
    import time

    from coolsd.io import atomic_dir, check_output_dir
    from coolsd.studies import anneal
    from theory.markov import chains, optimize

    from coolsd import validate
    from theory.core import checks

    checks.integer("--seeds", args.seeds, lo=1)
    checks.integer("--points", args.points, lo=2)
    for V in args.Vs:
        checks.integer("--Vs", V, lo=2)
    for L in args.Ls:
        checks.integer("--Ls", L, lo=1)
    if any(not 0 < f < 1 for f in args.fractions):
        raise ValueError(f"--fractions must lie in (0, 1), got {args.fractions}")
    if any(not 0 <= t < 1 for t in args.tvs):
        raise ValueError(f"--tvs must lie in [0, 1), got {args.tvs}")
    est, secs = anneal.check_cost(args.Vs, args.Ls, len(args.tvs), args.seeds, len(args.fractions),
                                  not args.no_optimize, max_seconds(args))
    out = check_output_dir("--out", args.out, ANNEAL_FILES)
    validate.announce(est, "theory anneal", args.quiet, seconds=secs)
    t0 = time.perf_counter()
    study = anneal.anneal_study(tvs=tuple(args.tvs), Vs=tuple(args.Vs), Ls=tuple(args.Ls),
                                seeds=tuple(range(args.seeds)), fractions=tuple(args.fractions),
                                optimize=not args.no_optimize, progress=not args.quiet)
    curves = []
    for kind, mode, V, L, tv, label in PARETO_CHAINS:
        P, Q = anneal.study_chain(kind, mode, V, tv, 7)
        c = optimize.pareto_curves(P, Q, L, chains.stationary(P), n_points=args.points,
                                   optimize=not args.no_optimize)
        c.update({"kind": kind, "tv_mode": mode, "V": V, "L": L, "tv": tv, "label": label,
                  "max_row_tv": float(chains.row_tv(P, Q).max())})
        curves.append(c)
    study["pareto"] = curves
    study["caption"] = CAPTION
    study["runtime_s"] = time.perf_counter() - t0

    cases = study["cases"]
    cols = list(dict.fromkeys(k for r in cases for k in r))
    with atomic_dir(out) as tmp:  # the whole report or the previous one, never a mix
        with open(os.path.join(tmp, "anneal_cases.csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(cases)
        with open(os.path.join(tmp, "anneal_summary.json"), "w") as fh:
            json.dump({k: v for k, v in study.items() if k != "cases"}, fh, indent=1, default=_json_default)
        plot_pareto(curves, os.path.join(tmp, "anneal_pareto.png"))
    print(format_anneal_summary(study["summary"]))
    print(f"wrote {args.out}/anneal_cases.csv ({len(cases)} cases), anneal_summary.json, anneal_pareto.png "
          f"in {study['runtime_s']:.0f} s")
    return 0


def _json_default(x):
    import numpy as np

    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x)}")


def format_anneal_summary(summary) -> str:
    head = (f"{'objective':9s} {'cases':22s} {'n':>4s} {'exp<uni':>8s} {'exp<inc':>8s} {'expF<uni':>9s} "
            f"{'inc best':>9s} {'opt nonincr':>12s}")
    lines = ["Fraction of cases where the first schedule has the lower objective at equal E[tau] "
             "(exp = Cool-SD nu=0.7, expF = exponential floored at w=1, uni = uniform, inc = increasing)",
             head, "-" * len(head)]
    for obj in ("bound", "exact_tv"):
        for group in ("all", "inside_tv_le_2/5", "outside_tv_gt_2/5"):
            s = summary[obj][group]
            if not s.get("n"):
                continue
            opt = f"{s['optimal_non_increasing']:.2f} ({s['n_optimized']})" if "n_optimized" in s else "n/a"
            lines.append(f"{obj:9s} {group:22s} {s['n']:4d} {s['exponential_beats_uniform']:8.2f} "
                         f"{s['exponential_beats_increasing']:8.2f} {s['exponential_floor_beats_uniform']:9.2f} "
                         f"{s['increasing_best_of_three']:9.2f} {opt:>12s}")
    return "\n".join(lines)


STYLE = {"exponential": ("C0", "-", "Cool-SD exponential (nu=0.7)"),
         "exponential_floor": ("C0", ":", "exponential, floor w>=1"),
         "linear": ("C2", "-", "linear decay"), "uniform": ("k", "--", "uniform"),
         "increasing": ("C3", "-", "increasing"), "optimal": ("C1", "-", "optimal (free weights)")}


def plot_pareto(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(curves), 2, figsize=(11, 4.2 * len(curves)), squeeze=False)
    for row, c in zip(axes, curves):
        x = c["expected_accepted"]
        for ax, obj, ylabel in ((row[0], "tv_bound", "TV upper bound B"), (row[1], "exact_tv", "exact TV")):
            for name, (color, ls, label) in STYLE.items():
                key = f"optimal_{'bound' if obj == 'tv_bound' else 'exact_tv'}" if name == "optimal" else name
                if key not in c or any(v is None for v in c[key][obj]):
                    continue
                ax.plot(x, c[key][obj], color=color, ls=ls, lw=2.2 if name == "optimal" else 1.5,
                        marker="o" if name == "optimal" else None, ms=3, label=label)
            ax.axvline(c["vanilla_accepted"], color="0.6", lw=0.8)
            ax.set_xlabel("E[tau] (accepted drafts per round)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel}: {c['kind']} rows, V={c['V']}, L={c['L']}, "
                         f"max row TV={c['max_row_tv']:.2f} ({c['label']})", fontsize=9)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Schedules at equal E[tau] (grey line: vanilla E[tau]); lower is better", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
