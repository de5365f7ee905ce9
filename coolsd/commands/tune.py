"""`coolsd tune`: an acceptance schedule tuned to a model's recorded rounds (theory.likelihood.tune).

  coolsd generate --model mnist --method vanilla --num-images 150 --record rows.npz
  coolsd tune --record rows.npz --tokens-per-call 3.2 --out schedule.json
  coolsd tune --record rows.npz --bound-budget 0.3 --family exponential --out schedule.json
  coolsd generate --model mnist --method scaled --weights schedule.json
"""
from __future__ import annotations

import json


def register(sub):
    t = sub.add_parser("tune", help="tune an acceptance schedule on recorded rounds (coolsd generate --record)")
    t.add_argument("--record", required=True, help=".npz of recorded rows (coolsd generate --record)")
    g = t.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens-per-call", type=float, default=None,
                   help="target predicted tokens per target call (1 + mean accepted drafts per round)")
    g.add_argument("--bound-budget", type=float, default=None, help="budget on the mean predicted TV bound per round (T11)")
    t.add_argument("--family", default="free", choices=["free", "uniform", "exponential", "linear", "level"],
                   help="schedule family (default free: any w_1..w_L)")
    t.add_argument("--out", default=None, help="write the schedule JSON here (for coolsd generate --weights)")
    t.add_argument("--validate", action="store_true",
                   help="also fit on half of the recorded images and predict on the other half (with bootstrap CIs)")
    t.add_argument("--frontier", type=int, default=0, metavar="N",
                   help="also report each family's predicted frontier at N targets (slow: minutes on real rows)")
    t.add_argument("--max-rounds", type=int, default=None,
                   help="fit on a seeded subsample of this many rounds (default: all)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=run)


def run(args) -> int:
    import numpy as np

    from coolsd import validate
    from coolsd.io import check_output_file
    from theory.core import checks
    from theory.likelihood import tune

    if args.max_rounds is not None:
        checks.integer("--max-rounds", args.max_rounds, lo=2)
    checks.integer("--frontier", args.frontier, lo=0)
    checks.seed(args.seed, "--seed")
    if args.tokens_per_call is not None:
        checks.real("--tokens-per-call", args.tokens_per_call, 1)
    if args.bound_budget is not None:
        checks.real("--bound-budget", args.bound_budget, 0)
    if args.out is not None:          # checked now: a refused path costs nothing, not a minute of tuning
        args.out = str(check_output_file("--out", args.out))
    rows = validate.record_file("--record", args.record)     # read and checked whole, before any tuning
    if args.max_rounds is not None and rows.R > args.max_rounds:
        rows = rows.subset(np.sort(np.random.default_rng(args.seed).choice(rows.R, args.max_rounds, replace=False)))
    res = tune.tune(rows, args.family, tokens_per_call=args.tokens_per_call, bound_budget=args.bound_budget,
                    seed=args.seed)
    out = {**res.to_dict(), "L": rows.L, "rounds": rows.R, "record": args.record,
           "vanilla_tokens_per_call": tune.reachable(rows, "free")[0]}
    if args.validate:
        out["validation"] = tune.split_validation(rows, args.family, tokens_per_call=args.tokens_per_call,
                                                  bound_budget=args.bound_budget, seed=args.seed)
    if args.frontier:
        out["frontier"] = tune.frontier(rows, n_points=args.frontier, seed=args.seed)
    if args.out:
        from coolsd.io import atomic_file

        with atomic_file(args.out, "w") as f:
            f.write(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out))
    else:
        key = "levels" if res.family == "level" else "weights"
        print(f"{res.family} schedule ({key}): {', '.join(f'{v:.4g}' for v in res.values)}")
        print(f"  predicted tokens per call {res.tokens_per_call:.4f} +- {res.tokens_per_call_se:.4f}  "
              f"(vanilla {out['vanilla_tokens_per_call']:.4f})")
        print(f"  predicted TV bound / round {res.bound:.4f} +- {res.bound_se:.4f}")
        if args.validate:
            v = out["validation"]
            print(f"  held-out half: tokens per call {v['heldout']['tokens_per_call']:.4f} "
                  f"(95% CI {v['heldout']['tokens_per_call_ci95'][0]:.4f}-{v['heldout']['tokens_per_call_ci95'][1]:.4f}),"
                  f" bound {v['heldout']['bound']:.4f}; in-sample optimism {v['gap']['bound']:+.4f} (bound)")
        if args.out:
            print(f"  wrote {args.out}")
    return 0
