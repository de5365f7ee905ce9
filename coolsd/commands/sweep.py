"""`coolsd sweep`: a grid of (method, parameters) on a model, N images each, sharded over ranks.

  coolsd sweep --model mnist --grid cool-sd:delta=2,4 vanilla --images 16 --out DIR
  torchrun --nproc-per-node 2 -m coolsd sweep --model mnist --grid cool-sd:delta=2,4 vanilla --images 16 --out DIR

Rerunning the same command resumes (finished units are kept, never recomputed); a directory made by
another grid or model is refused. See ``coolsd.studies.sweep``.
"""
from __future__ import annotations

import argparse


def register(sub):
    s = sub.add_parser("sweep", help="quality/speed frontiers over a grid of settings (torchrun for several ranks)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--model", default="mnist", help="model pair from real.registry (default mnist)")
    s.add_argument("--grid", nargs="+", default=None, metavar="ITEM",
                   help="grid items METHOD[:NAME=V1,V2[:NAME=...]] (methods and parameters of theory.rules.methods; "
                        "'ar' = plain AR, always run as the baseline). Default: the paper's three comparisons: "
                        + " ".join(_default()))
    s.add_argument("--grid-file", default=None, help="TOML file with grid = [ITEM, ...] and/or [[setting]] tables")
    s.add_argument("--images", type=int, default=64, help="images per setting (default 64)")
    s.add_argument("--out", required=True, help="results directory (created; reused to resume)")
    s.add_argument("--unit-images", type=int, default=None,
                   help="images per work unit, dividing --images (default 8, or --images when fewer)")
    s.add_argument("--batch-size", type=int, default=None, help="images per engine batch, <= --unit-images (default: the engine's)")
    s.add_argument("--seed", type=int, default=0)
    from coolsd.options import add_drafting_args

    add_drafting_args(s)
    s.add_argument("--record-images", type=int, default=256,
                   help="vanilla images whose P/Q rows are stored for the predictions (default 256)")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--cfg-scale", type=float, default=None, help="CFG scale (default: the model's)")
    s.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun: cuda:LOCAL_RANK)")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank (default 1)")
    s.add_argument("--max-units", type=int, default=None,
                   help="stop after this many units per rank (run in chunks; rerun to continue)")
    s.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default float32 on CPU, bfloat16 on CUDA)")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--max-seconds", type=float, default=SWEEP_MAX_SECONDS,
                   help="refuse a sweep whose rough estimate (images x settings x tokens at an optimistic rate) exceeds "
                        f"this (default {SWEEP_MAX_SECONDS:g} s = 1 day; 0 = no limit); the estimate is printed first")
    s.add_argument("--predict", action="store_true",
                   help="predict the whole frontier from plain-AR images and the recorded vanilla run only (no image "
                        "generated under a relaxed rule): tokens per call, KL(P||P^) per token and TV from the AR images "
                        "with CIs, the per-image bound; writes predicted.json / .md / PNGs (coolsd.studies.sweep.predict)")
    s.add_argument("--measured", default=None, metavar="REPORT_JSON",
                   help="with --predict: a measured sweep's report.json of the same grid, drawn and tabulated against "
                        "the predictions")
    q = s.add_argument_group("image quality (coolsd.quality; MNIST always uses its shipped classifier; "
                             "docs/guide/quality.md)")
    q.add_argument("--quality", default=None, metavar="fid[,clip]",
                   help="fid: FID (jackknife CI), KID, IS, precision/recall against --quality-ref; clip: CLIP score "
                        "against --quality-captions (text-conditioned models)")
    q.add_argument("--quality-weights", default=None, metavar="FILE",
                   help="feature extractor for fid: weights-inception-2015-12-05-6726825d.pth (torch-fidelity's "
                        "release), or a coolsd.quality.save_extractor file (default $COOLSD_QUALITY_WEIGHTS)")
    q.add_argument("--quality-ref", default=None, metavar="NPZ|DIR",
                   help="reference for fid: an ADM reference batch (VIRTUAL_imagenet256_labeled.npz), a "
                        "coolsd.quality.save_reference npz, or a folder of images")
    q.add_argument("--quality-clip", default=None, metavar="DIR",
                   help="transformers CLIP directory for clip (default $COOLSD_QUALITY_CLIP)")
    q.add_argument("--quality-captions", default=None, metavar="FILE",
                   help="clip: one caption per line, one per prompt (default: the --prompts)")
    q.add_argument("--quality-image-size", type=int, default=None, metavar="PX",
                   help="resize generated images to PX x PX (bicubic) before the extractor, as LlamaGen's "
                        "--image-size-eval (384 -> 256)")
    from coolsd.commands.generate import add_checkpoint_args

    add_checkpoint_args(s, skip=("class_id",))     # --draft and the model files; real.specs says which apply
    s.set_defaults(func=run)




SWEEP_MAX_SECONDS = 86400.0
# optimistic generation rates (tokens per second, all images of a unit together): the estimate is a lower bound
SWEEP_TOKENS_PER_SECOND = {"cpu": 500.0, "cuda": 5000.0}
UNIT_BYTES_PER_TOKEN = 80.0        # a stored unit: tokens and per-round records, per generated token (compressed less)


def check_sweep_cost(args, n_settings: int, T: int | None, unit: int) -> tuple[str, float]:
    """The sweep's rough cost before the store is made: every image it draws, T tokens each, at an optimistic rate
    (``SWEEP_TOKENS_PER_SECOND``: a lower bound), against --max-seconds; the stored units' size against the free
    space of --out's file system. A measured sweep draws --images of each of the ``n_settings`` settings and of plain
    AR; a predicted one (--predict) draws --images plain-AR images and the recorded vanilla run (--record-images)
    only, in units of ``unit`` images. Returns (estimate, seconds)."""
    import os
    import shutil

    from theory.core import checks

    T = int(T or 256)
    if args.predict:
        from coolsd.studies.sweep.predict import vanilla_images

        n_van = vanilla_images(args.images, unit, args.record_images)
        images = args.images + n_van
        what = f"--predict: {args.images} plain-AR + {n_van} vanilla images x {T} tokens"
    else:
        images = args.images * (n_settings + 1)
        what = f"--images {args.images} x {n_settings + 1} settings (AR included) x {T} tokens"
    tokens = float(images) * T
    rate = SWEEP_TOKENS_PER_SECOND["cuda" if str(args.device).startswith("cuda") else "cpu"]
    secs, nbytes = tokens / rate, tokens * UNIT_BYTES_PER_TOKEN
    limit = None if not args.max_seconds else float(args.max_seconds)
    from coolsd import validate

    est = validate.check_seconds(what, secs, limit, "the estimate is a rough lower bound: fewer --images or settings, or raise "
                                 "--max-seconds (0 = no limit)")
    parent = os.path.abspath(os.path.join(os.path.expanduser(str(args.out)), os.pardir))
    if os.path.isdir(parent):
        free = shutil.disk_usage(parent).free
        if nbytes > free:
            raise ValueError(f"{what}: the units would take about {checks.fmt_bytes(nbytes)}, more than the "
                             f"{checks.fmt_bytes(free)} free under {parent!r}; fewer --images or another --out")
    return f"{est} and {checks.fmt_bytes(nbytes)} of units (a rough lower bound)", secs


def _default():
    from coolsd.studies.sweep.grid import DEFAULT_GRID

    return DEFAULT_GRID


def config(args):
    """SweepConfig from the parsed arguments (every check before any work)."""
    from coolsd import validate
    from coolsd.studies.sweep import SweepConfig, ensure_vanilla, grid_from_toml, parse_grid
    from theory.core import checks

    model_spec, _, _ = validate.run_options(args)   # the shared layer, as generate reads it (batching included)
    from coolsd.io import check_store_dir

    check_store_dir("--out", args.out)     # a new directory or a sweep's own; a file / FIFO / device refused unopened
    items = list(args.grid or [])
    if args.grid_file:
        from coolsd.io import check_input_file

        items += grid_from_toml(check_input_file("--grid-file", args.grid_file, "toml"))
    if not items:
        items = list(_default())
    settings, _ = parse_grid(items)
    settings, added = ensure_vanilla(settings)
    from theory.rules import methods as registry

    for st in settings:           # what each method needs of the model: the same check as generate --method
        validate.method_model(st.method, registry.resolve(st.method, st.params_dict), args, f"--grid {st.key}",
                              model_spec)
    from real.decode.checks import MAX_IMAGES

    checks.integer("--images", args.images, lo=2, hi=MAX_IMAGES)
    unit = args.unit_images
    if unit is None:                      # default: blocks of 8 images, or one block of fewer
        unit = min(8, args.images)
    checks.integer("--unit-images", unit, lo=1, hi=MAX_IMAGES)
    checks.integer("--record-images", args.record_images, lo=0, hi=MAX_IMAGES)
    if args.images % unit:
        raise ValueError(f"--images {args.images} is not a multiple of --unit-images {unit} (every unit "
                         f"generates --unit-images images, so {-(-args.images // unit) * unit} "
                         f"would be generated): give --images {-(-args.images // unit) * unit}"
                         f" or a --unit-images dividing {args.images}")
    if args.batch_size is not None and args.batch_size > unit:
        raise ValueError(f"--batch-size {args.batch_size} exceeds --unit-images {unit} (each unit is one "
                         "engine call): raise --unit-images")
    if args.max_units is not None and args.max_units < 0:
        raise ValueError(f"--max-units must be >= 0, got {args.max_units}")
    from coolsd.quality.estimators import MIN_RELIABLE_IMAGES

    if args.images < MIN_RELIABLE_IMAGES:
        import sys

        print(f"coolsd: warning: --images {args.images} is below {MIN_RELIABLE_IMAGES}: the FD / NLL intervals "
              "and the claim verdicts of so few images are unreliable (a jackknife interval needs many images)",
              file=sys.stderr)
    from coolsd.options import drafting_spec

    if args.measured is not None and not args.predict:
        raise ValueError("--measured compares a predicted sweep with a measured one: add --predict")
    if args.predict and args.record_images < 1:
        raise ValueError("--predict needs recorded vanilla rows for the speed: --record-images >= 1")

    T = getattr(args, "num_tokens", None) or model_spec.tokens
    drafting = drafting_spec(args, T)   # the same parser as coolsd generate
    if drafting.mode.sweep_reason:
        raise ValueError(f"coolsd sweep {drafting.named}: {drafting.mode.sweep_reason}")
    if args.predict:                      # predictions score AR images exactly: the mode needs a likelihood
        from coolsd.options import run_processing

        try:
            drafting.mode.likelihood(drafting.build(), None, None, run_processing(args))
        except NotImplementedError as e:  # as generate --fidelity refuses it, before any image is drawn
            raise ValueError(f"--predict with {drafting.named}: {e}") from None
    measured = None
    if args.measured is not None:         # the same model, grid and drafting, before any work
        from coolsd.studies.sweep.measured import measured_report

        measured = measured_report(args.measured, model=args.model, settings=settings, drafting=drafting,
                                   draft=args.draft, temperature=args.temperature, cfg_scale=args.cfg_scale)
    from real.registry import BuildOptions

    qspec = _quality_spec(args)
    est, secs = check_sweep_cost(args, len(settings), T, unit)
    validate.announce(est, "sweep", seconds=secs, threshold_s=3600.0)    # a sweep over an hour: say so first
    dtype = args.dtype or ("bfloat16" if str(args.device).startswith("cuda") else "float32")
    files = {k: v for k, v in vars(BuildOptions.from_namespace(args)).items()
             if v is not None and k not in ("device", "draft", "seed", "num_images")}
    files["dtype"] = dtype
    model_options = tuple(sorted((k, list(v) if isinstance(v, (list, tuple)) else v) for k, v in files.items()))
    return SweepConfig(model=args.model, model_options=model_options, settings=tuple(settings), images=args.images,
                       unit_images=unit, seed=args.seed, drafting=drafting, draft=args.draft,
                       batch_size=args.batch_size,
                       record_images=args.record_images, temperature=args.temperature, cfg_scale=args.cfg_scale,
                       device=args.device, threads=args.threads,
                       grid_items=tuple(i if isinstance(i, str) else str(i) for i in items), vanilla_added=added,
                       quality=qspec, predict=bool(args.predict), measured=measured)


def _quality_spec(args):
    """coolsd.quality.QualitySpec of the --quality flags, or None (the weights, reference and image checks need
    the model: ``coolsd.studies.sweep.quality.setup`` runs them before anything is generated)."""
    given = [f for f in ("quality_weights", "quality_ref", "quality_clip", "quality_captions", "quality_image_size")
             if getattr(args, f, None) is not None]
    if args.quality is None:
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} configures --quality; give --quality fid or clip too")
        return None
    if args.model == "mnist":
        raise ValueError("--quality: the MNIST models are always scored with the shipped classifier (FD against the "
                         "held-out digits); drop --quality")
    import os

    from coolsd.io import check_input_file
    from coolsd.quality import QualitySpec

    # the files named, checked now (a FIFO / device / .npy / oversized file refused unopened, before any model)
    # (a missing file is named by coolsd.quality's own message, with where to get one)
    present = lambda f: f is not None and os.path.lexists(f) and not os.path.isdir(f)   # noqa: E731
    if present(args.quality_weights):
        check_input_file("--quality-weights", args.quality_weights, "checkpoint")
    if present(args.quality_ref):
        check_input_file("--quality-ref", args.quality_ref, "npz",
                         hint="expected an ADM reference batch, a coolsd.quality.save_reference npz or an image folder")
    if args.quality_captions is not None:
        check_input_file("--quality-captions", args.quality_captions, "text")
    return QualitySpec.parse(args.quality, weights=args.quality_weights, reference=args.quality_ref,
                             clip=args.quality_clip, captions=args.quality_captions,
                             image_size=args.quality_image_size, device=args.device)


def run(args):
    from coolsd.studies.sweep import sweep

    cfg = config(args)
    res = sweep(cfg, args.out, max_units=args.max_units, progress=not args.no_progress)
    if res["rank"] != 0:
        return 0
    if cfg.predict and res["complete"]:
        print(f"predicted frontier: {args.out}/predicted.md (also predicted.json and PNGs)")
        return 0
    if not res["complete"]:
        print(f"sweep incomplete: {res['units'] - res['missing']} of {res['units']} units stored in {args.out}; "
              "rerun the same command to continue")
        return 0 if res["stopped_early"] else 3
    from coolsd.studies.sweep.report import fidelity_table, table

    rep = res["report"]
    print(table(rep))
    print(fidelity_table(rep))
    for c in rep["claims"]:
        print(f"claim {c['id']} ({c['a']} vs {c['b']}): FD {c['frechet_distance']['verdict']}, "
              f"NLL {c['nll_per_token']['verdict']}, TV to target {c['tv_to_target']['verdict']}, "
              f"KL to target {c['kl_to_target']['verdict']}")
    print(f"report: {args.out}/report.md (also report.json and PNGs)")
    return 0
