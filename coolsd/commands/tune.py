"""`coolsd tune`: an acceptance schedule tuned to a model (docs/theory.md sections 8b and 8c).

Objective "kl" (default) / "tv": the exact KL(P||P^) per token / TV of the rule on plain-AR images (their
teacher-forced rows: ``--ar-rows FILE``, or ``--model M --ar-images N`` to make them), against the tokens per
target call predicted from a recorded vanilla run (``--record``, ``coolsd generate --record``; or made with
``--record-images N``). Objective "bound": the per-round T11 bound (section 8b; an unstamped record runs the
earlier tuner, whose tokens per call are 1 + the mean accepted drafts per drafted round).

  coolsd generate --model mnist --draft eagle --method vanilla --num-images 200 --record rec.npz
  coolsd tune --record rec.npz --model mnist --ar-images 2000 --save-ar-rows ar.npz --kl-budget 0.01 --out s.json
  coolsd tune --record rec.npz --ar-rows ar.npz --tokens-per-call 3.3 --family entropy --out e.json
  coolsd generate --model mnist --draft eagle --method scaled --weights s.json
  coolsd generate --model mnist --draft eagle --method row-scaled --schedule e.json
"""
from __future__ import annotations

import json

from coolsd.io import check_outputs, json_safe
from coolsd.options import add_mode_flags

FAMILIES = ("free", "uniform", "exponential", "linear", "level", "entropy", "maxp")
FRONTIER_MAX = 1000        # frontier points: more only repeat the curve (each is a tune per family)
MIN_AR_IMAGES = 4          # the exact tuner fits on a part of the AR images and holds the rest out (2 + 2 at least)
# families whose schedule coolsd generate cannot run (no --method takes it): tuned for the figures, not written
NOT_RUNNABLE = {"level": "coolsd generate runs no level schedule (--method scaled takes weights, row-scaled a "
                         "row-conditioned schedule); tune --family free, uniform, exponential, linear, entropy or maxp "
                         "for a schedule file, or drop --out to see the level family's figures"}
# optimistic generation rate (tokens per second, CPU; the sweep's lower-bound rate): the AR / record cost estimate
MAKE_TOKENS_PER_SECOND = {"cpu": 500.0, "cuda": 5000.0}


def register(sub):
    t = sub.add_parser("tune", help="tune an acceptance schedule on the exact law (AR images) or the bound (records)")
    t.add_argument("--objective", choices=["kl", "tv", "bound"], default=None,
                   help="kl (default; a budget implies its own): KL(P||P^) per token on AR images; tv: TV on AR images; "
                        "bound: the per-round T11 bound (section 8b)")
    g = t.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens-per-call", type=float, default=None,
                   help="target predicted tokens per target call (the objective is minimised there)")
    g.add_argument("--kl-budget", type=float, default=None, help="fastest schedule with KL(P||P^) <= X nats per token")
    g.add_argument("--tv-budget", type=float, default=None, help="fastest schedule with TV(P^, P) <= X")
    g.add_argument("--bound-budget", type=float, default=None, help="fastest schedule with mean T11 bound per round <= X")
    t.add_argument("--record", default=None, help=".npz of recorded vanilla rounds (coolsd generate --record)")
    t.add_argument("--ar-rows", default=None, help=".npz of AR images' teacher-forced rows (--save-ar-rows makes one)")
    m = t.add_argument_group("making the inputs from a model (real.registry)")
    m.add_argument("--model", default=None, help="make the AR rows (and, without --record, the record) with this model")
    m.add_argument("--draft", default=None, help="draft kind (default: the record's, else the model's)")
    add_mode_flags(m, "chain", ("L",), L="chain drafts per round (default: the record's, else 4)")
    m.add_argument("--ar-images", type=int, default=None, help="AR images to draw and score")
    m.add_argument("--ar-source", choices=["ar", "vanilla"], default="ar",
                   help="draw the AR images by plain AR (default) or a vanilla SD run (distributed as P too)")
    m.add_argument("--record-images", type=int, default=None, help="without --record: images of the vanilla run")
    m.add_argument("--save-ar-rows", default=None, help="write the AR rows made here (npz with stamp)")
    m.add_argument("--save-record", default=None, help="write the record made here")
    m.add_argument("--batch-size", type=int, default=64)
    m.add_argument("--device", default="cpu")
    t.add_argument("--family", default="free", choices=list(FAMILIES),
                   help="schedule family (default free: any w_1..w_L); entropy / maxp: w_i = exp(a_i + b phi(p)), the "
                        "target row's entropy or max probability (method row-scaled)")
    t.add_argument("--fit-fraction", type=float, default=0.5, help="AR images the search uses (the rest: held out)")
    t.add_argument("--out", default=None, help="write the schedule JSON here (coolsd generate --weights / --schedule)")
    t.add_argument("--validate", action="store_true", help="section 8b tuner (--objective bound): fit/held-out halves")
    t.add_argument("--frontier", type=int, default=0, metavar="N", help="section 8b tuner: frontier points")
    t.add_argument("--max-rounds", type=int, default=None, help="section 8b tuner: subsample of rounds")
    t.add_argument("--max-seconds", type=float, default=600.0,
                   help="refuse a --frontier whose estimate (the time of the first tune x points x families) exceeds "
                        "this (default 600; 0 = no limit)")
    t.add_argument("--seed", type=int, default=0, help="fit/held-out split and bootstrap; AR images (record: seed + 1)")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=run)


def _check_args(args, checks):
    """Numbers and paths, before any file is read or model built. Returns the frozen ``coolsd.validate.RunConfig``
    (the objective resolved, the output paths resolved; the Namespace is not changed)."""
    from coolsd.io import check_output_file

    objective = args.objective
    for flag in ("kl_budget", "tv_budget", "bound_budget"):
        v = getattr(args, flag)
        if v is not None:
            name = "--" + flag.replace("_", "-")
            checks.real(name, v)
            if not (v > 0 or (flag == "bound_budget" and v == 0)):   # a bound budget of 0: the lossless rule (issue 26)
                raise ValueError(f"{name} must be > 0 (0 is the lossless rule itself: vanilla), got {v:g}")
            implied = flag.split("_")[0]
            if objective not in (None, implied):
                raise ValueError(f"{name} bounds the {implied.upper()}: use --objective {implied} (or none), not "
                                 f"--objective {objective}")
            objective = implied
    objective = objective or "kl"
    if args.tokens_per_call is not None:
        checks.real("--tokens-per-call", args.tokens_per_call, 1)
    if args.max_rounds is not None:
        checks.integer("--max-rounds", args.max_rounds, lo=2)
    checks.integer("--frontier", args.frontier, lo=0, hi=FRONTIER_MAX)
    from coolsd import validate

    validate.common(args, available=False)     # --seed, --batch-size, --device, --max-seconds: the shared checks
    checks.real("--fit-fraction", args.fit_fraction, 0, 1, lo_open=True, hi_open=True)
    for flag, lo in (("ar_images", MIN_AR_IMAGES), ("record_images", 1), ("L", 1)):
        if getattr(args, flag) is not None:
            checks.integer("--" + flag.replace("_", "-"), getattr(args, flag), lo=lo)
    if args.ar_rows is not None and args.save_ar_rows is not None:
        raise ValueError("--save-ar-rows writes the AR rows made here (--model M --ar-images N); with --ar-rows "
                         "nothing is made: drop one")
    if args.record is not None and args.save_record is not None:
        raise ValueError("--save-record writes the record made here (--model M --record-images N); with --record "
                         "nothing is made: drop one")
    if args.family in NOT_RUNNABLE and args.out is not None:
        raise ValueError(f"--family {args.family} with --out: {NOT_RUNNABLE[args.family]}")
    if args.record is None and args.model is None:
        raise ValueError("--record: give the recorded vanilla rounds (coolsd generate --record FILE), or --model to "
                         "record them here")
    if args.ar_rows is not None and args.ar_images is not None:
        raise ValueError("give --ar-rows FILE or --ar-images N (with --model), not both")
    if args.ar_images is not None and args.model is None:
        raise ValueError("--ar-images makes AR rows from a model: give --model too")
    if args.record is None and args.record_images is None:
        raise ValueError("without --record, give --record-images N (the vanilla run to record) with --model")
    outs = {}
    for flag, suffix in (("--out", None), ("--save-ar-rows", ".npz"), ("--save-record", ".npz")):
        dest = flag[2:].replace("-", "_")
        if getattr(args, dest) is not None:
            outs[flag] = str(check_output_file(flag, getattr(args, dest), suffix))
    from coolsd.io import check_input_file

    for flag, path in (("--record", args.record), ("--ar-rows", args.ar_rows)):
        if path is not None:       # a FIFO / device / directory / .npy refused unopened (read whole in run)
            check_input_file(flag, path, "npz", hint="write one with coolsd generate --record / tune --save-ar-rows")
    check_outputs(outs, {"--record": args.record, "--ar-rows": args.ar_rows})
    _check_making_cost(args)
    return validate.RunConfig.of(args, {"objective": objective, **{f[2:].replace("-", "_"): p for f, p in outs.items()}})


def _check_making_cost(args) -> None:
    """--ar-images / --record-images made from --model: their rough cost (images x tokens at an optimistic rate, the
    teacher-forced scoring doubling it) against --max-seconds, printed when long; before any model is built."""
    if args.model is None or not (args.ar_images or (args.record is None and args.record_images)):
        return
    from coolsd import validate
    from real.specs import spec

    T = spec(args.model).tokens or 256
    n = (args.ar_images or 0) + (0 if args.record is not None else (args.record_images or 0))
    rate = MAKE_TOKENS_PER_SECOND["cuda" if str(args.device).startswith("cuda") else "cpu"]
    secs = 2.0 * n * T / rate
    what = f"making {n} images of --model {args.model} ({T} tokens each, AR rows scored)"
    est = validate.check_seconds(what, secs, args.max_seconds, "fewer --ar-images / --record-images, or raise "
                                 "--max-seconds (0 = no limit); the estimate is a rough lower bound")
    validate.announce(est, "tune: making the inputs", args.json, seconds=secs)


def run(args) -> int:
    from coolsd import validate
    from theory.core import checks
    from theory.likelihood import arrows

    args = _check_args(args, checks)          # the frozen run config from here on (read like the Namespace)
    rec = None
    if args.record is not None:
        rows = _tree_record(args)
        if rows is not None:             # static-tree rounds: the section 8b bound tuner takes them
            return _legacy(args, rows)
        rec = arrows.load_record(args.record, "--record", legacy=True)     # read and checked whole, now
        if not isinstance(rec, arrows.StampedRecord):
            if args.objective != "bound":
                raise ValueError(f"--record: {args.record!r} has no stamp (recorded before stamps were written); the "
                                 f"exact-law objectives need one: record it again with coolsd generate --method vanilla "
                                 f"--record FILE (or use --objective bound, the section 8b tuner)")
            return _legacy(args, validate.record_file("--record", args.record))
    legacy_flags = [f for f in ("validate", "max_rounds", "frontier") if getattr(args, f) not in (None, False, 0)]
    if legacy_flags and args.objective == "bound" and rec is not None and args.ar_rows is None and args.model is None:
        return _legacy(args, rec.rows)          # section 8b's tuner with its --validate / --frontier / --max-rounds
    if legacy_flags:
        raise ValueError(f"--{legacy_flags[0].replace('_', '-')} belongs to the section 8b tuner (--objective bound "
                         "with --record only)")
    ar = arrows.load_ar_rows(args.ar_rows, "--ar-rows") if args.ar_rows else None
    if ar is not None and rec is not None:
        arrows.check_stamps(ar.stamp, rec.stamp, "--ar-rows vs --record")
    if ar is not None and ar.n < MIN_AR_IMAGES and args.objective in ("kl", "tv"):
        raise ValueError(f"--ar-rows: {args.ar_rows!r} holds {ar.n} images; the exact tuner fits on a part and holds "
                         f"the rest out: it needs at least {MIN_AR_IMAGES}")
    if rec is not None:
        _check_target(args, rec)         # the reachable range depends on the record alone: before any AR row is made
    if args.model is not None:
        rec, ar = _make(args, rec, ar)
    objective = args.objective
    if objective in ("kl", "tv") and ar is None:
        raise ValueError("the kl / tv objectives need AR rows: --ar-rows FILE, or --model M --ar-images N")
    from theory.likelihood import exact_tune

    res = exact_tune.tune_exact(ar, rec, args.family, objective, tokens_per_call=args.tokens_per_call,
                                kl_budget=args.kl_budget, tv_budget=args.tv_budget, bound_budget=args.bound_budget,
                                seed=args.seed, fit_fraction=args.fit_fraction)
    out = {**res.to_dict(), "record": args.record or args.save_record, "ar_rows": args.ar_rows or args.save_ar_rows,
           "tokens_per_call_definition": "T / expected target calls per image (coolsd demo's renewal over positions, "
                                         "from the recorded vanilla rounds: theory.likelihood.speed)"}
    _write(args, out)
    if args.json:
        print(json.dumps(json_safe(out), allow_nan=False))
    else:
        print(_format(res, out, args))
    return 0


def _tree_record(args):
    """A tree record (``coolsd generate --tree ... --record``): dynamic-tree rounds are refused with what tune takes;
    static-tree rounds are returned (``TreeRows``) for ``--objective bound``, refused for the exact-law objectives
    (``arrows.load_record`` says why). None for a chain record."""
    from coolsd import validate
    from theory.core import checks

    from real.decode.modes import REGISTRY

    keys = checks.npz_arrays("--record", args.record)
    if any(d.grown_tree and d.record_marker in keys for d in REGISTRY.values()):     # per-round trees
        raise ValueError(f"--record: {args.record!r} holds dynamic-tree rounds (coolsd generate --tree dynamic "
                         "--record); coolsd tune takes chain rounds (every objective) or static-tree rounds (--objective "
                         "bound): record a chain or a static --tree run")
    if "tree_paths" in keys and args.objective == "bound":
        return validate.record_file("--record", args.record)
    return None


def _make(args, rec, ar):
    """Make the missing inputs from ``--model`` (AR rows; the record without --record), with the record's draft, L
    and processing when there is one; stamps compared before any model is built when they can be."""
    from coolsd import rowfiles
    from theory.likelihood import arrows

    st = rec.stamp if rec is not None else None
    if st is not None:
        for flag, val, key in (("--model", args.model, "model"), ("--draft", args.draft, "draft"), ("--L", args.L, "L")):
            if val is not None and val != st[key]:
                raise ValueError(f"{flag} {val!r} does not match the record's stamp ({key} = {st[key]!r})")
    draft = args.draft or (st["draft"] if st else None)
    L = args.L or (st["L"] if st else 4)
    proc = dict(st["processing"]) if st else {}
    conditions = (st or {}).get("conditions") or {}
    if ar is None and args.ar_images is not None and set(conditions) - {"class_id"}:
        raise ValueError(f"--record was made under {sorted(conditions)[0]} conditions; AR rows made here draw classes: "
                         "give AR rows of the same prompts with --ar-rows")
    class_id = conditions.get("class_id") if isinstance(conditions.get("class_id"), int) else None
    if rec is None:
        arrays = rowfiles.make_record(args.model, args.record_images, draft=draft, L=L, seed=args.seed + 1,
                                      batch_size=args.batch_size, device=args.device, **proc)
        if args.save_record:
            rowfiles.save_record(args.save_record, arrays)
        rec = arrows.StampedRecord(arrows.Rows(arrays["p"], arrays["q"], arrays["drafts"], arrays["n_drafted"],
                                               arrays["image"]), arrays["start"], json.loads(str(arrays["stamp"])))
        draft, proc = rec.stamp["draft"], dict(rec.stamp["processing"])
        _check_target(args, rec)         # before the AR rows are made
    if ar is None and args.ar_images is not None:
        ar = rowfiles.make_ar_rows(args.model, args.ar_images, draft=draft, L=L, seed=args.seed, source=args.ar_source,
                                   batch_size=args.batch_size, device=args.device, class_id=class_id, **proc)
        arrows.check_stamps(ar.stamp, rec.stamp, "AR rows made here vs --record")
        if args.save_ar_rows:
            rowfiles.save_ar_rows(args.save_ar_rows, ar)
    return rec, ar


def _check_target(args, rec) -> None:
    """--tokens-per-call within the family's reachable range on the record (``exact_tune.check_target``)."""
    if args.tokens_per_call is None or args.family not in FAMILIES:
        return
    from theory.likelihood import exact_tune

    try:
        exact_tune.check_target(rec, args.family, args.tokens_per_call)
    except ValueError as e:
        raise ValueError(f"--tokens-per-call {args.tokens_per_call:g}: {e}") from None


def _write(args, out: dict) -> None:
    if args.out:
        from coolsd.io import atomic_file

        with atomic_file(args.out, "w") as f:
            f.write(json.dumps(json_safe(out), indent=2, allow_nan=False) + "\n")


def _ci(d) -> str:
    if not d or d.get("measured") is None:
        return (d or {}).get("reason", "-")
    return f"{d['measured']:.5g} (95% CI {d['ci'][0]:.5g}-{d['ci'][1]:.5g}; {d['n']} images)"


def _format(res, out: dict, args) -> str:
    key = "levels" if res.family == "level" else "weights"
    what = {"target": f"at {res.constraint:.4g} predicted tokens per call",
            "budget": f"fastest with {res.objective.upper()} <= {res.constraint:.4g}"
                      f"{' nats per token' if res.objective == 'kl' else ''}"}[res.mode]
    lines = [f"{res.family} schedule ({key}): {', '.join(f'{v:.4g}' for v in out[key])}"
             + (f"; slope {out['slope']:.4g} on the row's {out['feature']}" if "slope" in out else "")
             + f"  [objective {res.objective}, {what}]",
             f"  predicted tokens per call {res.speed['tokens_per_call']:.4f} (95% CI {res.speed['ci95'][0]:.4f}-"
             f"{res.speed['ci95'][1]:.4f}; vanilla {res.vanilla_tokens_per_call:.4f}, all drafts accepted "
             f"{res.max_tokens_per_call:.4f})"]
    if res.fit is not None:
        lines.append(f"  fit ({res.fit['images']} images): KL(P||P^) {res.fit['kl']:.5g} nats/token, TV {res.fit['tv']:.4g}")
    if res.heldout is not None:
        kl = res.heldout["kl"].get("per_token")
        kl_txt = (f"{kl['measured']:.5g} nats/token (95% CI {kl['ci'][0]:.5g}-{kl['ci'][1]:.5g})" if kl
                  else res.heldout["kl"].get("reason", "-"))
        lines.append(f"  held out ({res.heldout['images']} images, log_likelihood): KL(P||P^) {kl_txt}, "
                     f"TV {_ci(res.heldout['tv'])}")
    lines.append(f"  predicted T11 bound per round {res.bound:.4f}")
    if args.out:
        lines.append(f"  wrote {args.out}")
    return "\n".join(lines)


def _legacy(args, rows) -> int:
    """The section 8b tuner (T11 at 1 + mean T10 per drafted round): an unstamped record, or --objective bound with
    its --validate / --frontier / --max-rounds."""
    import numpy as np

    from theory.likelihood import tune

    if args.tokens_per_call is None and args.bound_budget is None:
        raise ValueError("an unstamped record tunes the bound only: give --tokens-per-call or --bound-budget")
    imgs = np.unique(rows.image)
    if args.validate and (imgs.size < 4 or np.any(imgs < 0)):      # before the fit, not after it
        raise ValueError(f"--validate fits on half of the recorded images and predicts the other half: it needs a "
                         f"record of at least 4 images with an image index; {args.record!r} has {imgs.size}")
    if args.max_rounds is not None and rows.R > args.max_rounds:
        rows = rows.subset(np.sort(np.random.default_rng(args.seed).choice(rows.R, args.max_rounds, replace=False)))
    if args.family in ("entropy", "maxp"):
        raise ValueError(f"--family {args.family}: the unstamped-record bound tuner has the position families only")
    import time

    t0 = time.perf_counter()
    res = tune.tune(rows, args.family, tokens_per_call=args.tokens_per_call, bound_budget=args.bound_budget,
                    seed=args.seed)
    if args.frontier:             # the cost guard: the first tune's time x points x families, before the frontier
        from coolsd import validate

        secs = (time.perf_counter() - t0) * args.frontier * len(tune.FAMILIES)
        est = validate.check_seconds(f"--frontier {args.frontier} ({len(tune.FAMILIES)} families)", secs,
                                     args.max_seconds, "fewer --frontier points or --max-rounds, or raise "
                                     "--max-seconds (0 = no limit)")
        validate.announce(est, "tune --frontier", args.json, seconds=secs)
    out = {**res.to_dict(), "L": rows.L, "rounds": rows.R, "record": args.record, "objective": "bound",
           "vanilla_tokens_per_call": tune.reachable(rows, "free")[0],
           "tokens_per_call_definition": "1 + mean predicted accepted drafts per drafted round (section 8b)"}
    if args.validate:
        out["validation"] = tune.split_validation(rows, args.family, tokens_per_call=args.tokens_per_call,
                                                  bound_budget=args.bound_budget, seed=args.seed)
    if args.frontier:
        out["frontier"] = tune.frontier(rows, n_points=args.frontier, seed=args.seed)
    _write(args, out)
    if args.json:
        print(json.dumps(json_safe(out)))
        return 0
    key = "levels" if res.family == "level" else "weights"
    print(f"{res.family} schedule ({key}): {', '.join(f'{v:.4g}' for v in res.values)}  [objective bound, section 8b: "
          "tokens per call = 1 + mean accepted drafts per drafted round]")
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
