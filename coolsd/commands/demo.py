"""`coolsd demo`: the main job. Runs plain AR, vanilla SD (recording P/Q rows), Cool-SD, UniformRSD,
LANTERN, LANTERN++ and LANTERN+G* on the shipped MNIST models (chain and static-tree drafting), predicts
each rule's tokens per target call, TV bound and speed-up from the vanilla records alone, measures them,
and writes DIR/report.md, DIR/report.json and PNG figures (``coolsd.studies.demo``)."""
from __future__ import annotations


def register(sub):
    from coolsd.options import add_mode_flags

    d = sub.add_parser("demo", help="the main job: predicted vs measured trade-offs on the shipped MNIST models",
                       description=__doc__)
    d.add_argument("--out", default="coolsd-demo", help="output directory (default ./coolsd-demo)")
    d.add_argument("--quick", action="store_true", help="tiny sample counts (10 digits per method; for tests)")
    d.add_argument("--images", type=int, default=None, help="digits per method (default 500, quick 10)")
    d.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    d.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads while generating (default 1: the models are too small to share a step)")
    d.add_argument("--seed", type=int, default=0)
    add_mode_flags(d, "chain", ("L",), L="chain draft length (default 4)")
    d.add_argument("--chain-draft", choices=["small", "eagle"], default=None)
    d.add_argument("--tree-draft", choices=["small", "eagle"], default=None)
    d.add_argument("--extra-draft", choices=["small", "eagle"], default=None,
                   help="one more vanilla chain run with this draft, reported apart (e.g. the independent small draft)")
    d.add_argument("--tree-rules", nargs="*", default=None, choices=["uniform-rsd", "lantern", "lantern++", "lantern+G*"],
                   help="relaxed rules also run with tree drafting besides vanilla and Cool-SD "
                        "(default: lantern lantern++; give none for chains only)")
    d.add_argument("--tree", choices=["small", "eagle25"], default=None,
                   help="static tree: small (10 nodes, depth 4) or eagle25 (EAGLE-1's 25 nodes, depth 5)")
    add_mode_flags(d, "tree", ("tree_candidates",))
    d.add_argument("--tree-mc", action="store_true",
                   help="also score the sampled-candidate tree runs by the Monte Carlo likelihood (docs/theory.md "
                        "section 11c, T14): KL and TV with intervals; about 10 more minutes on 2 cores")
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=run)


DEMO_FILES = ("report.md", "report.json", "pareto.png", "predicted_vs_measured.png", "samples.png", "fidelity.png")


def run(args):
    import dataclasses

    from coolsd.io import atomic_dir, check_output_dir
    from theory.core import checks

    from coolsd import validate

    validate.common(args)     # the shared options (--seed, --threads, --device, --max-seconds ...): coolsd.validate
    if args.images is not None:
        checks.integer("--images", args.images, lo=1)
    if args.L is not None:
        from real.specs import spec

        checks.integer("--L", args.L, lo=1, hi=spec("mnist").tokens)    # a round never drafts past the image
    out = check_output_dir("--out", args.out, DEMO_FILES)    # before the 8-minute run

    import torch

    from coolsd.studies.demo import Settings, run_demo
    from coolsd.studies.demo.report import main_table

    s = Settings()
    kw = {"seed": args.seed, "quick": args.quick, "threads": args.threads, "tree_mc": args.tree_mc}
    if args.quick:
        kw["n_images"] = 10
    if args.images is not None:
        kw["n_images"] = args.images
    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw["device"] = dev
    for name in ("L", "chain_draft", "tree_draft", "tree", "tree_candidates", "extra_draft"):
        v = getattr(args, name)
        if v is not None:
            kw[name] = v
    if args.tree_rules is not None:
        kw["tree_rules"] = tuple(args.tree_rules)
    s = dataclasses.replace(s, **kw)
    with atomic_dir(out) as tmp:   # the whole report or the previous one, never a mix
        report = run_demo(tmp, s, progress=not args.no_progress)
    print(main_table(report))
    ch = report["checks"]
    print("checks: " + ", ".join(f"{k}: {'PASS' if v['pass'] else 'FAIL'}" for k, v in ch.items()))
    print(f"report: {(out / 'report.md').resolve()}  (also report.json, pareto.png, predicted_vs_measured.png, "
          f"samples.png, fidelity.png; {report['wall_clock_s']:.0f} s)")
    return 0
