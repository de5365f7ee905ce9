"""`coolsd generate`'s validation (issue 26 / 41): every option, file and combination checked before any model is
built; ``validate_args`` is the entry point, ``check_bundle`` the checks that need the built models."""
from __future__ import annotations

from coolsd.io import check_output_file, check_outputs
from coolsd.options import drafting_spec, flag, given, method_params, run_processing
from coolsd.validate import RunConfig


def validate_args(args: RunConfig) -> RunConfig:
    """Check every ``coolsd generate`` input before any work: numbers, option/model compatibility,
    input files and output paths. Raises ValueError naming the option. ``args``: the parsed options, frozen
    (``RunConfig.of`` of the Namespace, nothing resolved yet). Returns the validated ``RunConfig``:
    ``--save`` / ``--record`` resolved to the file that will be written,
    ``--num-images`` to the number of images, ``--dtype`` to the run's, the drafting spec and the method's
    parameters."""
    from theory.core import checks

    from coolsd import validate
    from real.specs import spec

    _validate_numbers(args, checks)
    n_captions = _validate_model_options(args)
    T = args.num_tokens or spec(args.model).tokens      # tokens per image when the spec knows them
    drafting = drafting_spec(args, T)                     # the modes' own options (coolsd.options)
    params, schedules = _validate_method(args)
    _validate_compile(args)
    n_conds = len(args.prompts) if given(args, "prompts") else n_captions
    num_images = args.num_images
    if num_images is None:
        num_images = n_conds or 1
    else:
        checks.integer("--num-images", num_images, lo=1)
        if n_conds and num_images != n_conds:
            src = "--prompts" if given(args, "prompts") else "--captions"
            raise ValueError(f"--num-images {num_images} does not match the {n_conds} condition(s) given by "
                             f"{src} (one image per entry); drop --num-images or give {num_images} entries")
    from real.decode.checks import MAX_IMAGES

    checks.integer("--num-images", num_images, lo=1, hi=MAX_IMAGES)
    if args.batch_size is not None:
        checks.integer("--batch-size", args.batch_size, lo=1, hi=num_images)
        validate.batched_model(args)
    if getattr(args, "fidelity", False) and str(args.method).lower() != "ar":
        try:                                               # what the options alone show has no exact likelihood
            drafting.mode.likelihood(drafting.build(), None, None, run_processing(args))
        except NotImplementedError as e:
            raise ValueError(f"--fidelity with {drafting.named}: {e}") from None
    save = None if args.save is None else str(check_output_file("--save", args.save, ".npz"))
    record = None
    if args.record is not None:
        if str(args.method).lower() == "ar":
            raise ValueError("--record saves the P/Q rows of drafted rounds; --method ar drafts none: give a "
                             "speculative --method (e.g. vanilla) or drop --record")
        record = str(check_output_file("--record", args.record, ".npz"))
        _check_record_depth(drafting, T)
        _check_record_rounds(args, drafting, T)
    inputs = _input_files(args) | schedules
    check_outputs({"--save": save, "--record": record}, inputs)
    resolved = {"num_images": num_images, "save": save, "record": record,
                "dtype": validate.default_dtype(args.device, args.dtype),
                "draft": args.draft if drafting.mode.needs_draft else None}
    return RunConfig.of(args, resolved, drafting=drafting, method_params=params, inputs=inputs)


def _check_record_depth(drafting, T) -> None:
    """--record of a tree mode keeps the rounds that drafted the whole tree (static, grown or SJD-PAC's window):
    when its depth leaves no such round in a T-token image (the first drafted round starts after one token, so
    depth <= T - 2), nothing could be recorded: refused now, not after the generation (issue 50)."""
    mode = drafting.mode
    trees = mode.static_tree or mode.grown_tree or getattr(mode.build(drafting.opts), "trees", False)
    if T is None or mode.chain or not trees or drafting.max_depth <= T - 2:
        return
    raise ValueError(f"--record with {drafting.named}: its rounds draft {drafting.max_depth} levels, but in a {T}-token "
                     f"image no round can draft the whole tree (at most {T - 2} levels), so nothing would be recorded; "
                     f"draft a shallower tree ({' / '.join(o.flag for o in mode.options) or 'its options'}) or drop "
                     "--record")


def _check_record_rounds(args, drafting, T) -> None:
    """--record of a chain keeps its drafted rounds: a T-token image has one only when T >= 2 (3 with an EAGLE
    drafter, whose first round is the target's prefill alone); refused now, not after generating (issue 50)."""
    if T is None or not drafting.mode.chain:
        return
    from real.specs import spec

    draft = args.draft or spec(args.model).default_draft
    need = 3 if draft == "eagle" else 2
    if T < need:
        raise ValueError(f"--record with {drafting.named}: a {T}-token image has no drafted round to record (a chain "
                         f"drafts from the {'second' if need == 3 else 'first'} round, which needs --num-tokens >= "
                         f"{need}{' with the EAGLE drafter' if need == 3 else ''}); give more tokens or drop --record")


def _input_files(args) -> dict:
    """{flag: path} of every model option naming a file ``coolsd generate`` reads."""
    from real.specs import OPTIONS, flag

    return {flag(d): getattr(args, d, None) for d, o in OPTIONS.items() if o.kind is not None}


def _validate_numbers(args, checks) -> None:
    """The shared options (``coolsd.validate.common``: the same checks as sweep, tune, demo, theory and sim)."""
    from coolsd import validate

    validate.common(args, available=False)    # availability: real.registry when building


def _validate_compile(args) -> None:
    """--compile, before any model is built: a model whose decoder blocks it can compile (``ModelSpec.compiles``),
    a mode the device can honour and a working compiler (``real.nn.blocks.compile_problem``: dynamo, inductor,
    a C++ compiler on the CPU, triton on CUDA; cheap, nothing is compiled)."""
    mode = getattr(args, "compile", None)
    if not mode:
        return
    from real.specs import SPECS, spec

    if not spec(args.model).compiles:
        ok = ", ".join(sorted(n for n, s in SPECS.items() if s.compiles))
        raise ValueError(f"--compile compiles the decoder blocks of LlamaGen targets and drafts and of EAGLE-1 drafters "
                         f"(real.nn.blocks); --model {args.model} is not built of them (it can compile: {ok})")
    import torch

    from real.nn.blocks import compile_problem

    dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    why = compile_problem(dev, "inductor", None if mode == "default" else mode)
    if why is not None:
        raise ValueError(f"--compile {mode}: {why}")


def _validate_method(args) -> tuple:
    """The method name, its own parameters (``coolsd.options.method_params``: namespaced per method, the registry's
    types and ranges) and what it needs from the model (a codebook), before any model is built. Returns (the
    method's parameters, {flag: schedule file})."""
    from theory.rules import methods as registry

    from coolsd import validate

    schedules = validate.schedule_files(args)   # regular, small JSON files before the registry opens them
    method = str(args.method).lower()
    names = registry.names()                     # read now: a rule registered after import counts
    if method not in tuple(m.lower() for m in names) + ("ar",) + tuple(registry.ALIASES):
        raise ValueError(f"--method: unknown method {args.method!r}; choose from {', '.join(names + ('ar',))}")
    if method == "ar":
        other = sorted(f for f in registry.flag_owners() if given(args, f))
        if other:
            raise ValueError(f"{', '.join(flag(f) for f in other)} configure(s) a verifier; --method ar has none")
        return {}, schedules
    params = method_params(args, method)
    full = registry.resolve(method, params)      # the registry's combined checks
    if getattr(args, "gsd_table", None) is not None and not registry.get(method).needs_embeddings:
        raise ValueError(f"--gsd-table configures GSD's distance test; --method {method} has none")
    from coolsd import validate

    validate.method_model(method, full, args, f"--method {method}")     # what it needs of the model (shared)
    return params, schedules


def _validate_model_options(args) -> int | None:
    """The model's spec (``real.specs``): the one generic check, then its input files and prompts. Returns the number
    of --captions (None without)."""
    from coolsd import validate

    validate.model_options(args)
    if args.captions is not None:
        from real.nn.checkpoint import load_captions

        return len(load_captions(args.captions))
    return None


def check_bundle(cfg, bundle) -> None:
    """Checks that need the built model but no generation: the mode's image-bound options (--L) within the model's
    image, --num-tokens within its capacity, GSD's memory (--class-id within its classes: the builders check it)."""
    T = int(bundle.num_tokens)
    opts = cfg.drafting.opts
    for o in cfg.drafting.mode.options:
        v = opts.get(o.name)
        if o.image_bound and v is not None and v > T:
            raise ValueError(f"{o.flag} {v} is more than the {T} tokens of one image of --model {cfg.model} (a round "
                             f"never drafts past the image); use {o.flag} <= {T}")
    _check_gsd_memory(cfg, bundle)
    cap = _token_capacity(bundle.target)
    if cfg.num_tokens is not None and cap is not None and cfg.num_tokens > cap:
        raise ValueError(f"--num-tokens {cfg.num_tokens} is more than the {cap} tokens of one image of "
                         f"--model {cfg.model}")


def _token_capacity(target) -> int | None:
    layout = getattr(target, "layout", None)
    if layout is not None and hasattr(layout, "num_tokens"):
        return int(layout.num_tokens)
    cfg = getattr(target, "config", None)
    if cfg is not None and hasattr(cfg, "block_size"):
        return int(cfg.block_size)
    return None


def _check_gsd_memory(cfg, bundle) -> None:
    """GSD's groups hold (rows, V, 2w) tokens per verified position (``theory.rules.gsd.Grouped``; w capped at 2V):
    a window the memory budget cannot hold is refused (naming --gsd-window) before generating."""
    from theory.core import checks
    from theory.rules import methods as registry
    from theory.rules.gsd import GSD_WINDOW

    method = str(cfg.method).lower()
    if method == "ar" or not registry.get(method).needs_embeddings:
        return
    V = int(bundle.target.vocab_size)
    w = min(int(cfg.method_params.get("window", GSD_WINDOW)), 2 * V)
    rows = (cfg.batch_size or cfg.num_images) * 2 * (cfg.drafting.max_depth + 1)    # CFG doubles the rows
    checks.check_memory("--gsd-window", rows * V * 2 * w * 40.0, checks.MAX_BYTES,
                        f"--gsd-window {cfg.method_params.get('window', GSD_WINDOW)} on V = {V}: use a smaller "
                        "window (the release uses 7) or fewer images per batch (--batch-size)")
