"""The command line's side of the shared validation layer (issue 26): what only the CLI sees (devices,
model options from a parsed Namespace, input files named by flags, cost estimates printed before a long
run). Numbers, arrays and verifiers are checked by ``theory.core.checks``; model options by the one generic
check of ``real.specs``; output paths by ``coolsd.io``. ``coolsd generate``'s options are validated here once
(``run_config``) into the frozen ``RunConfig`` every later step reads; what needs the built model is checked where it
is built (``real.registry.build``, ``coolsd.options.DraftingSpec.build``, ``coolsd.commands.generate_checks``).

Adding a command option: give it ``type=`` in argparse (``coolsd.cli.Parser`` then refuses a non-finite float, an int
beyond int64 and an empty value for it), then check its range here or with ``theory.core.checks`` in the command's
validation function *before* any model, file or table is built, with a ValueError whose message starts with the flag.
tests/test_fuzz_cli.py finds the option by itself and tries its bad values (a new subcommand needs a base invocation
and its work entry in tests/fuzz_cli.py); tests/test_probes.py holds rows for the combinations.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["RunConfig", "option_values", "common", "method_model", "check_seconds", "DTYPES", "device", "model_options", "input_paths", "schedule_files", "SCHEDULE_FLAGS", "record_file", "announce", "DEVICE_FORMS", "compile_option", "run_options", "batched_model", "default_dtype", "run_config", "model_spec_options", "model_inputs"]

DEVICE_FORMS = "cpu, cuda, cuda:N, mps or auto"


DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


@dataclass(frozen=True)
class RunConfig:
    """A command's options after validation, frozen: every later step reads this, nothing writes onto the argparse
    Namespace. ``options`` (read-only mapping) holds every parsed option with the validated values in place of the
    given ones (resolved paths, the number of images, the dtype); an option reads as an attribute (``cfg.model``).
    ``drafting``: the checked ``coolsd.options.DraftingSpec``; ``method_params``: the method's parameters, converted and
    resolved by its registry entry (``theory.rules.methods.resolve``: defaults included);
    ``inputs``: {flag: path} of every file the run reads; ``method_def``: the method's registry entry
    (``theory.rules.methods.Method``: what it needs of the model), None for plain decoding."""
    options: MappingProxyType
    drafting: object = None
    method_params: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    inputs: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    method_def: object = None

    @classmethod
    def of(cls, args, resolved: dict | None = None, **parts) -> "RunConfig":
        """The config of a parsed Namespace ``args`` (or of a ``RunConfig``: its options) with the ``resolved`` option
        values (the Namespace is read, not changed); ``parts``: drafting, method_params, inputs, method_def."""
        opts = dict(option_values(args)) | dict(resolved or {})
        opts.pop("func", None)
        parts = {k: MappingProxyType(dict(v)) if isinstance(v, dict) else v for k, v in parts.items()}
        return cls(MappingProxyType(opts), **parts)

    def __getattr__(self, name):
        if name.startswith("__") or name == "options":
            raise AttributeError(name)
        try:
            return self.options[name]
        except KeyError:
            raise AttributeError(f"RunConfig has no option {name!r}") from None


def option_values(args):
    """{dest: value} of a parsed Namespace or of a ``RunConfig`` (its options), read-only use."""
    return args.options if isinstance(args, RunConfig) else vars(args)


def default_dtype(device, dtype) -> str:
    """``--dtype`` or its default: bfloat16 on CUDA (``auto``: when CUDA is available), float32 elsewhere."""
    if dtype is not None:
        return dtype
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def common(args, *, available: bool = True) -> None:
    """The options several commands share, checked in this one place whichever command parsed them (issue 41: generate,
    sweep, tune, demo, theory and sim call it first): --seed, --temperature, --top-p, --top-k, --cfg-scale,
    --num-tokens, --threads, --batch-size, --num-images (at most ``real.decode.checks.MAX_IMAGES``), --image-size,
    --max-seconds, --device and --dtype (the device and the dtype first: this module's own checks, then the numbers:
    ``theory.core.checks``); an option the command does not have is skipped. Range and overflow: a float option must
    be finite (and representable in float32, the compute dtype), an integer one within int64. ValueError naming the
    flag."""
    from theory.core import checks
    from theory.rules.methods import FLOAT32_MAX, INT_MAX     # the method registry's bounds, the same for flags

    def has(d):
        return getattr(args, d, None) is not None

    if has("device") and isinstance(args.device, str):
        device("--device", args.device, available=available)
    if has("dtype") and isinstance(args.dtype, str) and args.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if has("seed"):
        checks.seed(args.seed, "--seed")
    if has("temperature"):
        t = checks.real("--temperature", args.temperature, 0, FLOAT32_MAX)
        if 0 < t < 1e-6:
            raise ValueError(f"--temperature must be 0 (greedy) or >= 1e-6 (below, logits / temperature overflow), "
                             f"got {args.temperature}")
    if has("top_p"):
        checks.real("--top-p", args.top_p, 0, 1, lo_open=True)
    if has("cfg_scale"):
        checks.real("--cfg-scale", args.cfg_scale, 0, FLOAT32_MAX)
        if args.cfg_scale != 1 and isinstance(getattr(args, "model", None), str):
            from real.specs import SPECS

            why = getattr(SPECS.get(args.model), "no_cfg", None)    # GLM-Image's AR stage has no CFG
            if why:
                raise ValueError(f"--cfg-scale {args.cfg_scale:g} with --model {args.model}: {why}; use --cfg-scale 1")
    for d, lo in (("top_k", 0), ("num_tokens", 1), ("threads", 1), ("batch_size", 1)):
        if has(d):
            checks.integer("--" + d.replace("_", "-"), getattr(args, d), lo=lo, hi=INT_MAX)
    if has("num_images"):
        from real.decode.checks import MAX_IMAGES     # images in one engine call

        checks.integer("--num-images", args.num_images, lo=1, hi=MAX_IMAGES)
    if has("image_size"):
        checks.integer("--image-size", args.image_size, lo=16, hi=1 << 16)
        if args.image_size % 16:
            raise ValueError(f"--image-size must be a multiple of 16 (the VQ downsampling), got {args.image_size}")
    if has("max_seconds"):
        checks.real("--max-seconds", args.max_seconds, 0)             # 0: no limit
    from real.nn.devpath import ENV as DEVICE_PATH_ENV

    if os.environ.get(DEVICE_PATH_ENV) is not None:          # the environment's boolean: its documented spellings
        checks.boolean(DEVICE_PATH_ENV, os.environ[DEVICE_PATH_ENV])


def method_model(method: str, params: dict, args, what: str, model_spec) -> None:
    """What a method needs of the model, checked from the model's spec before it is built (``generate --method`` and
    every ``sweep --grid`` setting alike): LANTERN's neighbour table and GSD's codebook table need a VQ codebook
    (``real.specs.ModelSpec.codebook``: "own", "vq" with --vq-ckpt, or "none"). ``params``: the method's resolved
    parameters; ``what``: how the setting is named in the error; ``model_spec``: the model's ``real.specs.ModelSpec``
    (``real.specs.spec``, looked up once by the caller)."""
    from theory.core import checks

    if str(method).lower() != "ar":
        checks.instance("params", params, dict, "a dict of the method's parameters")
    _method_model(method, params, args, what, model_spec)


def _method_model(method: str, params: dict, args, what: str, model_spec) -> None:
    """``method_model`` of parameters ``params`` the method registry resolved (``theory.rules.methods.resolve``: a
    dict), as ``run_config`` holds them: nothing re-checked."""
    import math

    from theory.rules import methods as registry

    m = str(method).lower()
    if m == "ar":
        return
    codebook = model_spec.codebook
    missing = codebook == "none" or (codebook == "vq" and getattr(args, "vq_ckpt", None) is None)
    d_thr = params.get("d_threshold")                     # GSD: None or inf turns the distance test off
    gsd_needs = registry.get(m).needs_embeddings and not (d_thr is None or math.isinf(d_thr))
    if gsd_needs and getattr(args, "gsd_table", None) == "codebook" and missing:
        raise ValueError(f"{what} --gsd-table codebook needs the VQ codebook; --model {args.model} has none"
                         f"{' without --vq-ckpt' if codebook == 'vq' else ''} (use --gsd-table embedding)")
    if registry.get(m).needs_neighbors and missing:
        raise ValueError(f"{what} needs a codebook neighbour table; --model {args.model} has no VQ codebook"
                         + (": give --vq-ckpt" if codebook == "vq" else ""))


def compile_option(args, model_spec) -> None:
    """--compile, before any model is built: a model whose decoder blocks it can compile (``ModelSpec.compiles`` of
    ``model_spec``), a mode the device can honour and a working compiler (``real.nn.blocks.compile_problem``: dynamo,
    inductor, a C++ compiler on the CPU, triton on CUDA; cheap, nothing is compiled). ValueError naming --compile."""
    mode = getattr(args, "compile", None)
    if not mode:
        return
    from real.specs import SPECS

    if not model_spec.compiles:
        ok = ", ".join(sorted(n for n, sp in SPECS.items() if sp.compiles))
        raise ValueError(f"--compile compiles the decoder blocks of LlamaGen targets and drafts and of EAGLE-1 drafters "
                         f"(real.nn.blocks); --model {args.model} is not built of them (it can compile: {ok})")
    import torch

    from real.nn.blocks import compile_problem

    dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    why = compile_problem(dev, "inductor", None if mode == "default" else mode)
    if why is not None:
        raise ValueError(f"--compile {mode}: {why}")


def device(option: str, dev, *, available: bool = True) -> str:
    """A device string (``DEVICE_FORMS``); with ``available`` a CUDA device must exist (checked by torch)."""
    d = str(dev)
    if not (d in ("cpu", "auto", "mps", "cuda") or (d.startswith("cuda:") and d[5:].isdigit())):
        raise ValueError(f"{option} must be {DEVICE_FORMS}, got {d!r}")
    if available and d.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{option} {d} requested but torch.cuda.is_available() is False (use --device cpu)")
        if ":" in d and int(d[5:]) >= torch.cuda.device_count():
            raise ValueError(f"{option} {d}: only {torch.cuda.device_count()} CUDA device(s)")
    return d


def model_options(args, model: str | None = None):
    """The model options in ``args`` checked by ``real.specs.check_options`` (every command that takes model
    options calls this), then their input paths (``input_paths``). Returns the model's spec."""
    from real import specs

    s = specs.check_options(model or args.model, _spec_values(args))
    input_paths(args)
    return s


def _spec_values(args) -> dict:
    """The option values ``real.specs.check_options`` reads: ``--mode jacobi`` (no draft model) checked as the
    universal draft kind it is, so no draft kind's rules apply."""
    from real import specs

    values = option_values(args)
    if values.get("draft") is None and values.get("mode") in specs.universal_drafts():
        values = {**values, "draft": values["mode"]}
    return values


def run_options(args, *, available: bool = True) -> tuple:
    """The options of a model run, read in one pass before any model is built (``coolsd sweep``; ``coolsd generate``
    reads the same two steps with its mode and method between them, ``run_config``): the options every command shares
    and the model's options against its spec (``model_spec_options``), then the files and batching that read the spec
    (``model_inputs``). Returns (the model's ``real.specs.ModelSpec``, the schedule files {flag: path}, the run's
    dtype). ValueError naming the flag."""
    s = model_spec_options(args, available=available)
    return (s, *model_inputs(args, s))


def model_spec_options(args, *, available: bool = True):
    """The first step of a model run's options: the options every command shares (``common``: the device and dtype,
    then the numbers), then the model's options against its spec (the one generic check, ``real.specs.check_options``:
    an option the model does not read is refused before its file is looked at). Returns the model's
    ``real.specs.ModelSpec``."""
    from real import specs

    values = _spec_values(args)
    common(args, available=available)
    return specs.check_options(args.model, values)


def model_inputs(args, model_spec) -> tuple:
    """The second step of a model run's options, the checks of this module that read the model's spec
    ``model_spec``: the input files (``input_paths``), the schedule files (``schedule_files``), the dtype, batching
    (``batched_model``). Returns (the schedule files {flag: path}, the run's dtype)."""
    input_paths(args)
    schedules = schedule_files(args)
    dtype = default_dtype(args.device, args.dtype)
    batched_model(args, model_spec)
    return schedules, dtype


def input_paths(args) -> None:
    """Each given model option naming an input file or directory (``real.specs.Option.kind``) exists; a file is a
    regular file under the size limit (``coolsd.io.check_input_file``: a FIFO or device is refused unopened)."""
    from theory.core.files import input_file as check_input_file
    from real.specs import OPTIONS, flag

    for d, o in OPTIONS.items():
        p = getattr(args, d, None)
        if p is None or o.kind is None:
            continue
        ok = {"file": os.path.lexists, "dir": os.path.isdir, "path": os.path.exists}[o.kind](p)
        if not ok:
            what = {"file": "an existing file", "dir": "an existing directory", "path": "an existing path"}[o.kind]
            raise ValueError(f"{flag(d)}: {p!r} is not {what}")
        if o.kind == "file" or (o.kind == "path" and not os.path.isdir(p)):
            check_input_file(flag(d), p, "checkpoint")


SCHEDULE_FLAGS = ("weights", "schedule")      # method parameters that may name a schedule JSON (coolsd tune --out)


def batched_model(args, model_spec) -> None:
    """--batch-size above 1 needs a model that generates images side by side (``real.specs`` ``batched``): ValueError
    naming both flags otherwise (generate and sweep). ``model_spec``: the model's ``real.specs.ModelSpec``
    (``real.specs.spec``, looked up once by the caller)."""
    if args.batch_size is not None and args.batch_size > 1 and not model_spec.batched:
        raise ValueError(f"--batch-size {args.batch_size}: --model {args.model} generates one image at a time (its "
                         "cache has no per-row lengths); use --batch-size 1")


def schedule_files(args) -> dict:
    """{flag: path} of the method parameters naming a schedule file (``--weights s.json``, ``--schedule e.json``),
    each checked now as a JSON input (``coolsd.io.check_input_file``: regular, small, parses), before the registry's
    parser opens it; a value that names no file and does not end in .json is numbers, left to the parser."""
    from theory.core.files import input_file as check_input_file

    out = {}
    for d in SCHEDULE_FLAGS:
        v = getattr(args, d, None)
        if isinstance(v, str) and (os.path.lexists(v) or v.lower().endswith(".json")):
            check_input_file(f"--{d}", v, "json", hint="write one with coolsd tune --out")
            out[f"--{d}"] = v
    return out


def record_file(option: str, path):
    """A recorded-rounds file (``coolsd generate --record``) opened and checked now: one line naming the file
    and what to do when it is missing, empty, not an .npz, damaged or lacks the rows. Returns the rows
    (``theory.likelihood.recorded.Rows`` / ``TreeRows``)."""
    from theory.likelihood import recorded

    return recorded.load_rows(path, name=option)


def check_seconds(what: str, seconds: float, max_seconds, hint: str) -> str:
    """The run-time guard of the commands' --max-seconds (0 or None: no limit): CostError before any work when the
    estimate ``seconds`` exceeds it; returns the estimate ("about 3 min") to print (``announce``)."""
    from theory.core import checks

    checks.real(f"{what}: the estimated seconds", seconds, 0)
    if max_seconds is not None:
        checks.real("--max-seconds", max_seconds, 0)            # NaN would switch the guard off
    est = f"about {checks.fmt_seconds(seconds)}"
    if max_seconds and seconds > max_seconds:
        raise checks.CostError(f"{what} would take {est}, above --max-seconds {checks.fmt_seconds(max_seconds)}; "
                               f"{hint}")
    return est


def announce(estimate: str, what: str, quiet: bool = False, threshold_s: float = 10.0, seconds: float = 0.0) -> None:
    """Print the cost estimate of a large but feasible run (above ``threshold_s``) to stderr before it starts."""
    if not quiet and seconds > threshold_s:
        print(f"coolsd: {what}: {estimate} estimated", file=sys.stderr)


def run_config(args) -> RunConfig:
    """``coolsd generate``'s options validated once, in this one place, into the frozen ``RunConfig`` that every later
    step reads: numbers, option/model compatibility, input files and output paths, before any model is built.
    Raises ValueError naming the option. ``args``: the parsed Namespace (read, never written). Returns the
    ``RunConfig``:
    ``--save`` / ``--record`` resolved to the file that will be written,
    ``--num-images`` to the number of images, ``--dtype`` to the run's, the drafting spec and the method's
    parameters (resolved by the registry: its defaults included). One pass, one direction, each step once: the
    shared options and the model's spec (``model_spec_options``), the method and the mode (``coolsd.options``) and the
    method's parameters resolved (``theory.rules.methods.resolve``), then this module's checks that read them (the
    files and batching, ``model_inputs``; what the mode and method need of the model, ``compile_option``,
    ``method_model``; what --fidelity and --record need of the mode), the conditions and the image count, then the
    outputs (``coolsd.io``); the model's spec and the method's registry entry are looked
    up once and read from then on."""
    from theory.rules import methods as rule_registry

    from coolsd.io import check_output_file, check_outputs
    from coolsd.options import drafting_spec, flag, method_spec, run_processing
    from real.decode.checks import MAX_IMAGES
    from real.specs import OPTIONS

    s = model_spec_options(args, available=False)        # availability: at build
    T = args.num_tokens or s.tokens                      # tokens per image when the spec knows them
    proc = run_processing(args)                          # what the drafting checks and --fidelity's check read
    method, params = method_spec(args)                   # the method's own options (coolsd.options)
    drafting = drafting_spec(args, T, proc)              # the modes' own options (coolsd.options)
    full = {} if method == "ar" else rule_registry.resolve(method, params)    # with the registry's combined checks
    method_def = None if method == "ar" else rule_registry.get(method)        # what it needs, read once
    schedules, dtype = model_inputs(args, s)             # the files and batching the spec reads (shared with sweep)
    compile_option(args, s)                              # what they need of the model (shared with sweep)
    bare = drafting.build()                              # the mode without a model: its capabilities
    if args.fidelity and method != "ar":
        try:                                               # what the options alone show has no exact likelihood
            drafting.mode.likelihood(bare, None, None, proc)
        except NotImplementedError as e:
            raise ValueError(f"--fidelity with {drafting.named}: {e}") from None
    if args.record is not None:
        if method == "ar":
            raise ValueError("--record saves the P/Q rows of drafted rounds; --method ar drafts none: give a "
                             "speculative --method (e.g. vanilla) or drop --record")
        _check_record(args, s, drafting, T, bare)
    _method_model(method, full, args, f"--method {method}", s)     # ``full``: the registry's dict, as resolved
    n_conds = len(args.prompts) if args.prompts is not None else None
    if args.captions is not None:                        # the file loads (and is counted) whether or not it is used
        from real.nn.checkpoint import load_captions

        n_captions = len(load_captions(args.captions))
        n_conds = n_captions if n_conds is None else n_conds
    src = "--prompts" if args.prompts is not None else "--captions"
    num_images = args.num_images                         # in [1, MAX_IMAGES] when given (``common``)
    if num_images is None:
        num_images = n_conds or 1
        if num_images > MAX_IMAGES:
            raise ValueError(f"{src}: {num_images} entries, one image each, is more than the {MAX_IMAGES} images of "
                             "one run; split the run")
    elif n_conds and num_images != n_conds:
        raise ValueError(f"--num-images {num_images} does not match the {n_conds} condition(s) given by "
                         f"{src} (one image per entry); drop --num-images or give {num_images} entries")
    if args.batch_size is not None and args.batch_size > num_images:     # >= 1 (``common``)
        raise ValueError(f"--batch-size {args.batch_size} is more than the {num_images} image(s) of the run; use "
                         f"--batch-size <= {num_images}")
    save = None if args.save is None else str(check_output_file("--save", args.save, ".npz"))
    record = None if args.record is None else str(check_output_file("--record", args.record, ".npz"))
    inputs = {flag(d): getattr(args, d, None) for d, o in OPTIONS.items() if o.kind is not None} | schedules
    check_outputs({"--save": save, "--record": record}, inputs)
    resolved = {"num_images": num_images, "save": save, "record": record, "dtype": dtype,
                "draft": args.draft if drafting.mode.needs_draft else None}
    return RunConfig.of(args, resolved, drafting=drafting, method_params=full, inputs=inputs, method_def=method_def)


def _check_record(args, s, drafting, T, bare) -> None:
    """--record needs a round it can record in a T-token image; refused now, not after generating (issue 50). A tree
    mode keeps the rounds that drafted the whole tree (static, grown or SJD-PAC's window): its depth must leave one
    (the first drafted round starts after one token, so depth <= T - 2). A chain keeps its drafted rounds: a T-token
    image has one only when T >= 2 (3 with an EAGLE drafter, whose first round is the target's prefill alone).
    ``s``: the model's ``real.specs.ModelSpec``; ``bare``: the mode built without a model (``DraftingSpec.build``)."""
    mode = drafting.mode
    if T is None:
        return
    if mode.chain:
        draft = args.draft or s.default_draft
        need = 3 if draft == "eagle" else 2
        if T < need:
            raise ValueError(f"--record with {drafting.named}: a {T}-token image has no drafted round to record (a "
                             f"chain drafts from the {'second' if need == 3 else 'first'} round, which needs "
                             f"--num-tokens >= {need}{' with the EAGLE drafter' if need == 3 else ''}); give more "
                             "tokens or drop --record")
        return
    trees = mode.static_tree or mode.grown_tree or getattr(bare, "trees", False)
    if not trees or drafting.max_depth <= T - 2:
        return
    raise ValueError(f"--record with {drafting.named}: its rounds draft {drafting.max_depth} levels, but in a {T}-token "
                     f"image no round can draft the whole tree (at most {T - 2} levels), so nothing would be recorded; "
                     f"draft a shallower tree ({' / '.join(o.flag for o in mode.options) or 'its options'}) or drop "
                     "--record")

