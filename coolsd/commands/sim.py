"""`coolsd sim ...`: Monte-Carlo of relaxed speculative decoding checked against the exact theory."""
from __future__ import annotations

import json


def register(sub):
    sm = sub.add_parser("sim", help="Monte-Carlo simulation checked against the exact theory")
    ssub = sm.add_subparsers(dest="sim_command", required=True)

    v = ssub.add_parser("validate", help="simulated rounds vs exact E[tau], exact law Phat, P and exact TV "
                                         "(exit 0 iff every expected outcome occurred)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--alpha", type=float, default=1e-3, help="chi-square level (default 1e-3)")
    v.add_argument("--z-max", type=float, default=4.0, help="largest |z| accepted for mean tau and TV (default 4)")
    v.add_argument("--se", type=float, default=0.005, help="target standard error of mean tau (default 0.005)")
    v.add_argument("--tv-bias", type=float, default=0.03,
                   help="largest upward bias of the plug-in TV under P used to size n (default 0.03)")
    v.add_argument("--n-rounds", type=int, default=None, help="rounds per run (default: chosen from --se, the "
                                                              "power against the negative control and --tv-bias)")
    v.add_argument("--backend", choices=["numpy", "jax"], default="numpy", help="backend of the table path")
    v.add_argument("--paths", default="table,rule", help="comma-separated: table, rule (default both)")
    v.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from coolsd.commands.theory import add_cost_args

    add_cost_args(v)
    v.set_defaults(func=run_validate)

    s = ssub.add_parser("sources", help="vanilla, UniformRSD, Cool-SD, LANTERN, LANTERN++, LANTERN+G* on "
                                        "image-like sources: accepted length vs TV")
    s.add_argument("--which", default="codebook,grid", help="comma-separated: codebook, grid (default both)")
    s.add_argument("--L", type=int, default=4, help="draft length (default 4)")
    s.add_argument("--k", type=int, default=2, help="LANTERN neighbourhood size k (default 2)")
    s.add_argument("--n-rounds", type=int, default=40_000, help="rounds per method on the codebook (default 40000)")
    s.add_argument("--n-images", type=int, default=48, help="images per method on the grid (default 48)")
    s.add_argument("--V", type=int, default=None, help="vocabulary size (default: codebook 12, grid 32)")
    s.add_argument("--ambiguity", type=float, default=None,
                   help="row flatness (default: codebook 0.6 latent units, grid 2.0 tokens)")
    s.add_argument("--grid-size", type=int, default=16, help="grid side H = W (default 16)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--figure", default=None, help="write a PNG of accepted length vs TV per method here")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_cost_args(s)
    s.set_defaults(func=run_sources)


def run_validate(args):
    from sim import validation as va
    from theory.core import checks

    from coolsd import validate

    validate.common(args)     # the shared options (--seed, --threads, --device, --max-seconds ...): coolsd.validate
    paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
    bad = set(paths) - {"table", "rule"}
    if bad or not paths:
        raise ValueError(f"--paths takes table and/or rule, got {args.paths!r}")
    checks.real("--alpha", args.alpha, 0, 1, lo_open=True, hi_open=True)
    for name in ("z_max", "se", "tv_bias"):
        checks.real("--" + name.replace("_", "-"), getattr(args, name), 0, lo_open=True)
    if args.n_rounds is not None:    # every (chain, verifier, path) job simulates n rounds: cost of them all
        from coolsd.commands.theory import max_seconds
        from sim.rounds import check_rounds_cost

        jobs = sum(len(va.default_verifiers(c.neighbors, c.L)) for c in va.default_chains()) * len(paths)
        est, secs = check_rounds_cost("--n-rounds", checks.count("--n-rounds", args.n_rounds), 4, 8,
                                      "rule" if "rule" in paths else "table", jobs, max_seconds=max_seconds(args))
        from coolsd import validate

        validate.announce(est, "sim validate", args.json, seconds=secs)
    rep = va.validate(n_rounds=args.n_rounds, seed=args.seed, alpha=args.alpha, z_max=args.z_max,
                      se_target=args.se, tv_bias_target=args.tv_bias, paths=paths, backend=args.backend,
                      progress=not args.json)
    if args.json:
        print(json.dumps({"ok": rep.ok, "notes": rep.notes,
                          "checks": [dict(c.__dict__, ok=c.ok) for c in rep.checks]}, indent=2))
    else:
        print(va.format_report(rep))
    return 0 if rep.ok else 1


def run_sources(args):
    import pathlib

    from coolsd.io import atomic_path, check_output_file
    from sim import sources as so
    from theory.core import checks

    which = tuple(w.strip() for w in args.which.split(",") if w.strip())
    if not which or set(which) - {"codebook", "grid"}:
        raise ValueError(f"--which takes codebook and/or grid, got {args.which!r}")
    checks.integer("--L", args.L, lo=1)
    checks.integer("--k", args.k, lo=1)
    checks.integer("--n-rounds", args.n_rounds, lo=2)
    checks.integer("--n-images", args.n_images, lo=2)
    checks.integer("--grid-size", args.grid_size, lo=2)
    if args.V is not None:
        checks.integer("--V", args.V, lo=2)
    if args.ambiguity is not None:
        checks.real("--ambiguity", args.ambiguity, 0, lo_open=True)
    from coolsd import validate

    validate.common(args)     # the shared options (--seed, --threads, --device, --max-seconds ...): coolsd.validate
    from coolsd.commands.theory import max_seconds
    from sim.rounds import check_rounds_cost

    n_methods = sum(len(levels) for _, _, levels in so.GRID)
    if "codebook" in which:       # every method simulates --n-rounds rule rounds on the V-state codebook chain
        check_rounds_cost("--n-rounds", args.n_rounds, args.L, args.V or 12, "rule", n_methods,
                          max_seconds=max_seconds(args))
    if "grid" in which:           # whole images: about H W / 2 rounds of L drafts each, per image and method
        check_rounds_cost("--n-images / --grid-size", max(1, args.n_images * args.grid_size ** 2 // 2), args.L,
                          args.V or 32, "rule", n_methods, max_seconds=max_seconds(args))
    figure = args.figure
    if figure:  # checked now, written atomically at the end
        suffix = None if pathlib.Path(figure).suffix else ".png"    # matplotlib's default format
        figure = str(check_output_file("--figure", figure, suffix))
    cb = gr = None
    if "codebook" in which:
        kw = {"seed": args.seed}
        if args.V is not None:
            kw["V"] = args.V
        if args.ambiguity is not None:
            kw["ambiguity"] = args.ambiguity
        cb = so.codebook_source(**kw)
    if "grid" in which:
        kw = {"seed": args.seed, "H": args.grid_size, "W": args.grid_size}
        if args.V is not None:
            kw["V"] = args.V
        if args.ambiguity is not None:
            kw["ambiguity"] = args.ambiguity
        gr = so.grid_source(**kw)
    if cb is not None and args.k + 1 > cb.neighbors.shape[1]:
        raise ValueError(f"--k {args.k} needs k+1 <= V-1 latent neighbours (LANTERN's resampler)")
    rows = so.compare(which, L=args.L, k=args.k, n_rounds=args.n_rounds, n_images=args.n_images, seed=args.seed,
                      codebook=cb, grid=gr)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"L={args.L} k={args.k} seed={args.seed}; tokens per target call = tau + 1. codebook: "
              f"{args.n_rounds} rounds per method, start ~ stationary law, exact E[tau]+1 / TV / bound; "
              f"grid: {args.n_images} images of {args.grid_size}x{args.grid_size} per method, per-round bound "
              "estimated along drafted paths (T11), full-length rounds")
        print(so.format_rows(rows))
    if figure:
        with atomic_path(figure) as tmp:
            so.plot(rows, str(tmp))
        if not args.json:
            print(f"figure written to {figure}")
    return 0
