"""`coolsd theory ...`: exact numbers for synthetic Markov chains."""
from __future__ import annotations

import json


def register(sub):
    th = sub.add_parser("theory", help="exact theory on synthetic Markov chains")
    tsub = th.add_subparsers(dest="theory_command", required=True)
    t = tsub.add_parser("table", help="E[tau], TV bound and exact TV of every verifier on one chain")
    add_chain_args(t)
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t.set_defaults(func=run_table)


def add_chain_args(p):
    p.add_argument("--chain", choices=["random", "ambiguous", "iid"], default="ambiguous",
                   help="chain family (default: ambiguous, near-uniform rows as for image tokens)")
    p.add_argument("--V", type=int, default=8, help="vocabulary size (default 8)")
    p.add_argument("--L", type=int, default=4, help="draft length (default 4)")
    p.add_argument("--tv", type=float, default=0.4, help="row-wise TV(P, Q) (default 0.4)")
    p.add_argument("--seed", type=int, default=0)


def make_chain(args):
    from theory import chains

    if args.chain == "random":
        return chains.random_pair(args.V, tv=args.tv, seed=args.seed)
    if args.chain == "iid":
        return chains.iid_pair(args.V, tv=args.tv, seed=args.seed)
    return chains.ambiguous_pair(args.V, spread=0.5, tv=args.tv, seed=args.seed)


def default_verifiers(V: int, L: int = 4, seed: int = 0):
    import numpy as np

    from theory import rules

    nb = rules.lantern_neighbors(np.random.default_rng(seed).normal(size=(V, 2)))
    k = max(1, min(3, V - 2))
    return [rules.vanilla(), rules.cool_sd(1.5), rules.cool_sd(3.0), rules.uniform_rsd(1.5),
            rules.linear_rsd(3.0, 1.0, L), rules.lantern(nb, k, 0.2), rules.lantern(nb, k, 0.2, resample="optimal"),
            rules.lantern_pp(nb, k, 2.0), rules.typical(), rules.greedy()]


def theory_table(P, Q, L: int, verifiers, init=0, max_sequences=10**7):
    from theory import markov

    rows = []
    for v in verifiers:
        F, G = markov.rule_tables(P, Q, L, v)
        e = markov.expected_accepted(P, Q, F, init)
        b = markov.tv_bound(P, Q, F, G, init)
        try:
            t = markov.exact_tv(P, Q, F, G, init, max_sequences=max_sequences)
        except ValueError:
            t = None
        rows.append({"name": v.name, "params": {k: _plain(x) for k, x in v.params.items()},
                     "expected_accepted": e, "tokens_per_target_call": e + 1, "tv_bound": b, "exact_tv": t})
    return rows


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
    if args.V < 2 or args.L < 1:
        raise ValueError(f"need V >= 2 and L >= 1, got V={args.V}, L={args.L}")
    P, Q = make_chain(args)
    rows = theory_table(P, Q, args.L, default_verifiers(args.V, args.L, args.seed))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"chain={args.chain} V={args.V} L={args.L} TV(P,Q)={args.tv} seed={args.seed}; start state 0")
        print(format_table(rows))
