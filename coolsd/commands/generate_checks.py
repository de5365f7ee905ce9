"""`coolsd generate`'s validation (issue 26 / 41): every option, file and combination checked before any model is
built; ``validate_args`` is the entry point, ``check_bundle`` the checks that need the built models."""
from __future__ import annotations

from coolsd.io import check_output_file, check_outputs
from coolsd.options import drafting_spec, flag, given, method_params


def validate_args(args) -> None:
    """Check every ``coolsd generate`` input before any work: numbers, option/model compatibility,
    input files and output paths. Raises ValueError naming the option. Resolves ``--save`` /
    ``--record`` to the file that will be written and ``--num-images`` to the number of images."""
    from theory.core import checks

    from coolsd import validate
    from real.specs import spec

    _validate_numbers(args, checks)
    _validate_model_options(args)
    T = args.num_tokens or spec(args.model).tokens      # tokens per image when the spec knows them
    args._drafting = drafting_spec(args, T)               # the shared parser of drafting options (coolsd.options)
    _validate_method(args)
    _validate_compile(args)
    n_conds = _count_conditions(args)
    if args.num_images is None:
        args.num_images = n_conds or 1
    else:
        checks.integer("--num-images", args.num_images, lo=1)
        if n_conds and args.num_images != n_conds:
            src = "--prompts" if given(args, "prompts") else "--captions"
            raise ValueError(f"--num-images {args.num_images} does not match the {n_conds} condition(s) given by "
                             f"{src} (one image per entry); drop --num-images or give {args.num_images} entries")
    from real.decode.checks import MAX_IMAGES

    checks.integer("--num-images", args.num_images, lo=1, hi=MAX_IMAGES)
    if args.batch_size is not None:
        checks.integer("--batch-size", args.batch_size, lo=1, hi=args.num_images)
        validate.batched_model(args)
    kind = args._drafting.kind
    if getattr(args, "fidelity", False) and kind in ("tree", "dynamic"):
        _validate_tree_fidelity(args)
    if getattr(args, "fidelity", False) and kind not in ("chain", "tree", "dynamic"):
        from real.decode.score import JACOBI_REASON

        family = " (SJD-PAC's windows are Jacobi-family drafts)" if kind.startswith("sjd-pac") else ""
        raise ValueError(f"--fidelity with --draft {kind}: {JACOBI_REASON}{family}")
    if args.save is not None:
        args.save = str(check_output_file("--save", args.save, ".npz"))
    if args.record is not None:
        if str(args.method).lower() == "ar":
            raise ValueError("--record saves the P/Q rows of drafted rounds; --method ar drafts none: give a "
                             "speculative --method (e.g. vanilla) or drop --record")
        args.record = str(check_output_file("--record", args.record, ".npz"))
    check_outputs({"--save": args.save, "--record": args.record}, _input_files(args))


def _input_files(args) -> dict:
    """{flag: path} of every file ``coolsd generate`` reads (schedules, model options naming files)."""
    from real.specs import OPTIONS, flag

    ins = {flag(d): getattr(args, d, None) for d, o in OPTIONS.items() if o.kind is not None}
    return ins | args._schedule_files     # (checked by _validate_method)


def _validate_tree_fidelity(args) -> None:
    """--fidelity with --tree: the constructions without an exact likelihood that the options alone show (lossless
    dynamic trees, greedy decoding); the cost guard of sampled static candidates needs V (checked once the models
    are built, before generating)."""
    from real.decode.score_tree import GREEDY_REASON, LOSSLESS_REASON
    from theory.rules import methods as registry

    spec = args._drafting
    if spec.kind == "dynamic" and spec.dynamic[3] != "release":
        raise ValueError(f"--fidelity with --tree dynamic --tree-sampling {spec.dynamic[3]}: {LOSSLESS_REASON}")
    method = str(args.method).lower()
    greedy = method != "ar" and method in {m.lower() for m in registry.names()} and registry.get(method).greedy_rows
    if greedy or args.temperature == 0:
        raise ValueError(f"--fidelity with --tree and greedy decoding: {GREEDY_REASON}")


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


def _validate_method(args) -> None:
    """The method name, its own parameters (``coolsd.options.method_params``: namespaced per method, the registry's
    types and ranges) and what it needs from the model (a codebook), before any model is built."""
    from real.decode.methods import METHODS
    from theory.rules import methods as registry

    from coolsd import validate

    args._schedule_files = validate.schedule_files(args)   # regular, small JSON files before the registry opens them
    method = str(args.method).lower()
    if method not in tuple(m.lower() for m in METHODS) + ("ar",) + tuple(registry.ALIASES):
        raise ValueError(f"--method: unknown method {args.method!r}; choose from {', '.join(METHODS + ('ar',))}")
    if method == "ar":
        other = sorted(f for f in registry.flag_owners() if given(args, f))
        if other:
            raise ValueError(f"{', '.join(flag(f) for f in other)} configure(s) a verifier; --method ar has none")
        args._method_params = {}
        return
    args._method_params = method_params(args, method)
    full = registry.resolve(method, args._method_params)      # the registry's combined checks
    if getattr(args, "gsd_table", None) is not None and not registry.get(method).needs_embeddings:
        raise ValueError(f"--gsd-table configures GSD's distance test; --method {method} has none")
    from coolsd import validate

    validate.method_model(method, full, args, f"--method {method}")     # what it needs of the model (shared)


def _validate_model_options(args) -> None:
    """The model's spec (``real.specs``): the one generic check, then its input files and prompts."""
    from coolsd import validate

    validate.model_options(args)
    if args.captions is not None:
        from real.nn.checkpoint import load_captions

        args._caption_count = len(load_captions(args.captions))


def _count_conditions(args) -> int | None:
    if given(args, "prompts"):
        return len(args.prompts)
    return getattr(args, "_caption_count", None)


def check_bundle(args, bundle) -> None:
    """Checks that need the built model but no generation: --num-tokens within the model's image,
    --class-id within its classes (the builders check it too)."""
    L = args._drafting.L if args._drafting.kind == "chain" else None
    if L is not None and L > bundle.num_tokens:
        raise ValueError(f"--L {L} is more than the {bundle.num_tokens} tokens of one image of --model {args.model} "
                         "(a round never drafts past the image); use --L <= " + str(bundle.num_tokens))
    _check_gsd_memory(args, bundle)
    cap = _token_capacity(bundle.target)
    if args.num_tokens is not None and cap is not None and args.num_tokens > cap:
        raise ValueError(f"--num-tokens {args.num_tokens} is more than the {cap} tokens of one image of "
                         f"--model {args.model}")


def _token_capacity(target) -> int | None:
    layout = getattr(target, "layout", None)
    if layout is not None and hasattr(layout, "num_tokens"):
        return int(layout.num_tokens)
    cfg = getattr(target, "config", None)
    if cfg is not None and hasattr(cfg, "block_size"):
        return int(cfg.block_size)
    return None


def _check_gsd_memory(args, bundle) -> None:
    """GSD's groups hold (rows, V, 2w) tokens per verified position (``theory.rules.gsd.Grouped``; w capped at 2V):
    a window the memory budget cannot hold is refused (naming --gsd-window) before generating."""
    from theory.core import checks
    from theory.rules import methods as registry
    from theory.rules.gsd import GSD_WINDOW

    method = str(args.method).lower()
    if method == "ar" or not registry.get(method).needs_embeddings:
        return
    V = int(bundle.target.vocab_size)
    w = min(int(args._method_params.get("window", GSD_WINDOW)), 2 * V)
    rows = (args.batch_size or args.num_images) * 2 * (args._drafting.max_depth + 1)    # CFG doubles the rows
    checks.check_memory("--gsd-window", rows * V * 2 * w * 40.0, checks.MAX_BYTES,
                        f"--gsd-window {args._method_params.get('window', GSD_WINDOW)} on V = {V}: use a smaller "
                        "window (the release uses 7) or fewer images per batch (--batch-size)")
