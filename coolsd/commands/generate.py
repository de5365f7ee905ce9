"""`coolsd generate`: speculative decoding of real AR image models with any verifier.

  coolsd generate --model llamagen-tiny --method cool-sd --delta 2 --json
  coolsd generate --model llamagen-tiny --method vanilla --tree eagle25
  coolsd generate --model mnist --draft jacobi --window 16 --method vanilla     (Speculative Jacobi Decoding)

Models come from ``real.registry`` (``--list-models``); methods from ``real.decode.methods``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

from coolsd.io import atomic_file, check_output_file

from .jacobi_args import _flag, _given, add_jacobi_args, jacobi_for, jacobi_spec, validate_jacobi


def register(sub):
    g = sub.add_parser("generate", help="speculative decoding of an AR image model (real engine)")
    g.add_argument("--model", default="llamagen-tiny", help="model pair from real.registry (default llamagen-tiny)")
    g.add_argument("--list-models", action="store_true", help="list the registered models and exit")
    g.add_argument("--method", default="vanilla",
                   help="a method of theory.rules.methods (vanilla, cool-sd, uniform-rsd, linear-rsd, lantern, lantern++, "
                        "lantern+G*, typical, greedy, scaled --weights) or ar (plain autoregressive baseline)")
    g.add_argument("--L", type=int, default=None, help="draft length per round (default 4; --draft jacobi: --window)")
    g.add_argument("--tree", default=None,
                   help="static draft tree (EAGLE-1 / LANTERN++ setting): eagle25, eagle57, chain (the chain of --L "
                        "drafts run by the tree engine) or a JSON list of paths of child ranks, e.g. '[[0],[1],[0,0]]'; "
                        "or dynamic (EAGLE-2 dynamic trees, the LANTERN release's default: --tree-total/-depth/-topk)")
    t = g.add_argument_group("dynamic trees (--tree dynamic; real.decode.dynamic_tree, docs/theory.md section 9b)")
    t.add_argument("--tree-total", type=int, default=59,
                   help="nodes the target scores per round, root included (the release's total_token; default 59)")
    t.add_argument("--tree-depth", type=int, default=4,
                   help="expansion levels after the root's children: nodes reach depth + 1 (default 4, as released)")
    t.add_argument("--tree-topk", type=int, default=10, help="children per expanded node and beam width (default 10)")
    t.add_argument("--tree-sampling", choices=["lossless", "release"], default="lossless",
                   help="lossless (default: stochastic-beam-search keys, candidates verified with their draft law) "
                        "or release (top-k candidates verified with qx = 1, as the EAGLE-2 / LANTERN release)")
    from theory.rules import methods as registry

    m = g.add_argument_group("verifier parameters (theory.rules.methods; unset: the method's default)")
    for flag, p in registry.flags().items():
        m.add_argument("--" + flag.replace("_", "-"), dest=flag, type=p.type, default=None,
                       choices=list(p.choices) if p.choices else None,
                       help=f"{p.help} (default {p.default if p.default is not None else 'derived'})")
    m.add_argument("--lantern-neighbors", choices=["raw", "l2"], default=None,
                   help="LANTERN neighbour table: Euclidean distance between the raw codebook vectors (default, as "
                        "released) or between l2-normalised ones (our earlier table)")
    s = g.add_argument_group("sampling")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=None, help="0 = off (default: the model's, 0 for most)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (default: the model's)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--num-images", type=int, default=None,
                   help="images to generate (default 1, or one per --prompts / --captions entry)")
    s.add_argument("--batch-size", type=int, default=None,
                   help="images generated together in one engine batch (default: all --num-images, at most "
                        "real.decode.engine.MAX_BATCH and what half the free memory holds); transformers adapters: 1")
    s.add_argument("--num-tokens", type=int, default=None, help="tokens per image (default: the whole image)")
    r = g.add_argument_group("run")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 for *-tiny models, whose ops are too small to share)")
    r.add_argument("--dtype", default=None, choices=["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
                   help="float32, bfloat16, float16 (default float32 on CPU, bfloat16 on CUDA)")
    add_jacobi_args(g)
    r.add_argument("--compile", nargs="?", const="default", default=None,
                   choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                   help="torch.compile the decoder blocks of LlamaGen targets and drafts (real.nn.blocks; falls back "
                        "to eager with a warning when compilation fails); mode default, or reduce-overhead for "
                        "CUDA graphs. On CPU it does not pay at batch 1 (benchmarks/bench_engine.py --compile)")
    r.add_argument("--baseline", action="store_true", help="also run plain AR decoding and report the speed-up")
    r.add_argument("--record", default=None,
                   help="save the per-round P/Q rows (and image index) to this .npz (theory.likelihood.recorded, coolsd tune); "
                        "with --tree the rounds that drafted the whole tree")
    r.add_argument("--save", default=None, help="save tokens (and decoded images when a VQ is loaded) to this .npz")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--fidelity", action="store_true",
                   help="score the generated images exactly (real.decode.score): per-image log_p_hat (the sampler's law) "
                        "and log_p (the processed target) into --save, TV / KL to the target summaries into --json "
                        "(chain drafting only)")
    add_checkpoint_args(g)
    g.set_defaults(func=run)


def add_checkpoint_args(p, skip: tuple[str, ...] = ()):
    """The model options of ``real.specs.OPTIONS`` (fields of ``real.registry.BuildOptions``) as flags; shared
    with ``coolsd sweep``. Which model reads which is its spec's business (``real.specs.check_options``)."""
    from real.specs import OPTIONS, flag

    c = p.add_argument_group("model options (real.specs: which model reads which, coolsd generate --list-models)")
    for d, o in OPTIONS.items():
        if d in skip:
            continue
        kw = dict(nargs="*") if o.type is list else dict(type=o.type)
        c.add_argument(flag(d), dest=d, default=None, help=o.help, **kw)


def run(args):
    if args.list_models:
        from real.registry import MODELS

        from real.specs import SPECS

        for name, (_, help) in sorted(MODELS.items()):
            sp = SPECS[name]
            print(f"{name:22s} {help}  [draft {sp.default_draft} of {'/'.join(sp.drafts)}; codebook {sp.codebook}; "
                  f"{'batched' if sp.batched else 'batch 1'}]")
        return 0
    result = generate(args)
    if args.json:  # strict JSON: undefined statistics (e.g. acceptance rate of plain decoding) are null
        print(json.dumps(_finite(result), allow_nan=False))
    else:
        print(format_result(result))
    return 0


def _finite(x):
    """NaN / inf floats -> None, recursively (JSON has no NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def generate(args) -> dict:
    validate_args(args)       # every input, option and output path, before any model is built
    import numpy as np
    import torch

    from real.decode import engine
    from real.decode.methods import MethodParams, make_verifier, method_processing
    from real.registry import NO_DRAFT, BuildOptions, build
    from real.decode.sampling import Processing
    from theory.rules import methods as registry
    from theory.tree import parse_tree

    if args.dtype is None:
        dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        args.dtype = "bfloat16" if str(dev).startswith("cuda") else "float32"
    jac = jacobi_spec(args)
    if args.L is None:
        args.L = jac.slots if jac is not None else 4
    if args.method.lower() != "ar":
        spec = registry.get(args.method)                    # unknown method: error before loading models
        own = {p.option for p in spec.free}
        other = sorted(f for f in registry.flags() if getattr(args, f) is not None and f not in own)
        if other:
            raise ValueError(f"{', '.join('--' + f.replace('_', '-') for f in other)} do(es) not apply to method "
                             f"{spec.name} (its options: {sorted('--' + f.replace('_', '-') for f in own) or 'none'})")
    dynamic = args.tree is not None and args.tree.strip().lower() == "dynamic"
    if dynamic:
        from real.decode.dynamic_tree import DynamicTree

        for flag in ("tree_total", "tree_depth", "tree_topk"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
        tree = DynamicTree(args.tree_total, args.tree_depth, args.tree_topk, args.tree_sampling)
    else:
        tree = parse_tree(args.tree, args.L) if args.tree is not None else None
    if tree is not None and args.method.lower() == "ar":
        raise ValueError("--tree needs a speculative method (not ar)")
    L = (tree.max_depth if dynamic else tree.depth) if tree is not None else args.L
    threads = args.threads if args.threads is not None else (1 if "tiny" in args.model else None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    opts = BuildOptions.from_namespace(args)
    bundle = build(args.model, opts if jac is None else dataclasses.replace(opts, draft=NO_DRAFT))   # Jacobi: no drafter
    check_bundle(args, bundle)
    if jac is not None:
        jac = jacobi_for(jac, bundle)
    if getattr(args, "compile", None):
        _compile(bundle, args.compile)
    cfg_scale = bundle.cfg_scale if args.cfg_scale is None else args.cfg_scale
    top_k = getattr(bundle, "top_k", 0) if args.top_k is None else args.top_k
    method = args.method.lower()
    proc = Processing(args.temperature, top_k, args.top_p, cfg_scale)
    proc = proc if method == "ar" else method_processing(method, proc)
    params = MethodParams(**{f: getattr(args, f) for f in registry.flags()})
    verifier = None if method == "ar" else make_verifier(method, L, params, bundle.neighbors,
                                                         device=getattr(bundle.target, "device", None),
                                                         embeddings=getattr(bundle, "codebook", None))
    progress = None if not args.json else False
    run = dict(num_tokens=bundle.num_tokens, processing=proc, seed=args.seed, batch_size=args.batch_size,
               progress=progress)
    gens = engine.generate(bundle.target, None if verifier is None or jac is not None else bundle.draft, bundle.conds,
                           verifier=verifier, L=None if tree is not None or jac is not None else args.L, tree=tree,
                           jacobi=jac, record_rows=args.record is not None, **run)
    base = engine.generate(bundle.target, None, bundle.conds, **run) if args.baseline else []
    stats = engine.summarize(gens)
    out = {"model": args.model, "method": method, "L": L,
           "params": {k: _plain(v) for k, v in (verifier.params.items() if verifier else [])},
           "verifier": verifier.name if verifier else "ar", "processing": proc.params(),
           "image_tokens": bundle.num_tokens, "num_images": len(gens), "seed": args.seed,
           "batch_size": gens[0].info["batch_size"],
           "device": str(args.device), "dtype": args.dtype, "info": bundle.info, **stats}
    if dynamic:
        out["tree"] = {"name": "dynamic", "nodes": tree.n_nodes, "depth": tree.max_depth, **tree.params()}
    elif tree is not None:
        out["tree"] = {"name": args.tree, "nodes": tree.n_nodes, "depth": tree.depth}
    if jac is not None:
        out["draft"] = "jacobi"
        out["jacobi"] = {"window": jac.window, "init": jac.init, "coupling": jac.coupling, "width": jac.width}
    if base:
        b = engine.summarize(base)
        out["baseline"] = {"seconds": b["seconds"], "tokens_per_second": b["tokens_per_second"]}
        out["speedup"] = b["seconds"] / stats["seconds"]
    if args.record and dynamic:   # per-round trees (theory.likelihood.recorded.DynamicRows)
        from coolsd.commands.dynamic_record import write_dynamic_record

        write_dynamic_record(args.record, gens, tree)
        out["record"] = str(args.record)
    elif args.record and tree is not None:   # static trees: the rounds that drafted the whole tree (theory.likelihood.tune.TreeRows)
        full = [(i, r) for i, g in enumerate(gens) for r in g.rounds if r.depth == tree.depth]
        if not full:
            raise ValueError("--record with --tree: no round drafted the whole tree (images too short?)")
        arrs = {"p": np.stack([r.p for _, r in full]), "q": np.stack([r.q for _, r in full]),
                "tokens": np.stack([r.drafts for _, r in full]), "image": np.array([i for i, _ in full], dtype=np.int64),
                "accepted": np.array([r.accepted for _, r in full]),
                "tree_paths": np.array(json.dumps([list(p) for p in tree.paths]))}
        with atomic_file(args.record) as fh:
            np.savez_compressed(fh, **arrs)
        out["record"] = str(args.record)
    elif args.record:        # chain rounds with their starts and the run's stamp (coolsd tune's speed model)
        from coolsd.rowfiles import record_arrays, run_stamp

        stamp = run_stamp(args.model, bundle, proc, args.L, method=method, images=len(gens), seed=args.seed)
        if jac is not None:
            stamp["draft"] = "jacobi"
        with atomic_file(args.record) as fh:
            np.savez_compressed(fh, **record_arrays(gens, args.L, stamp))
        out["record"] = str(args.record)
    fid = None
    if getattr(args, "fidelity", False):     # exact per-image likelihoods of the images just made
        from real.decode.score import summary

        rule = None if verifier is None else make_verifier(method, L, params, bundle.neighbors)   # numpy tables
        fid = summary(bundle.target, None if rule is None else bundle.draft, bundle.conds,
                      torch.stack([g.tokens for g in gens]), verifier=rule, L=None if rule is None else L,
                      processing=proc, batch_size=args.batch_size or 64)
        out["fidelity"] = fid["report"]
    if args.save:
        toks = np.stack([g.tokens.numpy() for g in gens])
        extra = {} if fid is None else {"log_p_hat": fid["log_p_hat"], "log_p": fid["log_p"]}
        side = int(round(bundle.num_tokens ** 0.5))
        if bundle.vq is not None and side * side == bundle.num_tokens:
            extra["images"] = bundle.vq.decode_code(torch.as_tensor(toks)).float().cpu().numpy()
        with atomic_file(args.save) as fh:
            np.savez_compressed(fh, tokens=toks, **extra)
        out["saved"] = str(args.save)
    return out


def _compile(bundle, mode: str) -> None:
    """--compile: route the target's and the draft's decoder blocks through ``real.nn.blocks.compile_blocks``."""
    from real.nn.blocks import compile_blocks

    for name, m in (("target", bundle.target), ("draft", bundle.draft)):
        if m is None:
            continue
        try:
            compile_blocks(m, mode=mode)
        except ValueError as e:
            raise ValueError(f"--compile: the {name}: {e} (supported: LlamaGen targets and drafts, EAGLE-1 "
                             "drafters)") from None


def _plain(x):
    return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)


def format_result(r: dict) -> str:
    shape = (f"tree {r['tree']['name']}: {r['tree']['nodes']} nodes, depth {r['tree']['depth']}" if "tree" in r
             else f"L={r['L']}")
    lines = [f"{r['model']} / {r['verifier']} ({shape}, {r['num_images']} image(s) x {r['image_tokens']} tokens)",
             f"  tokens per target call  {r['tokens_per_target_call']:.3f} +- {r['tokens_per_target_call_se']:.3f}",
             f"  acceptance rate         {r['acceptance_rate']:.3f}  (accepted / drafted depth; "
             f"{r['drafted_mean']:.1f} tokens drafted per round)",
             f"  seconds                 {r['seconds']:.3f}  ({r['tokens_per_second']:.1f} tokens/s)",
             f"  time split              draft {r['time_draft_s']:.3f}s, target {r['time_target_s']:.3f}s, "
             f"verify {r['time_verify_s']:.3f}s ({100 * r['verify_share']:.1f}%)"]
    if "speedup" in r:
        lines.append(f"  speed-up vs plain AR    {r['speedup']:.2f}x")
    f = r.get("fidelity")
    if f:
        lines.append(f"  NLL/token (sampled law) {f['nll_per_token']:.4f}")
        for k, name in (("tv_to_target", "TV to target"), ("kl_to_target", "KL to target")):
            d = f.get(k)
            if d and d.get("measured") is not None:
                lines.append(f"  {name:<23} {d['measured']:.4f} [{d['ci'][0]:.4f}, {d['ci'][1]:.4f}]")
            elif d:
                lines.append(f"  {name:<23} {d.get('reason', '-')}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- input validation (before any work)
# Kept apart from ``generate`` so new options (e.g. --batch-size) add their checks here.

def validate_args(args) -> None:
    """Check every ``coolsd generate`` input before any work: numbers, option/model compatibility,
    input files and output paths. Raises ValueError naming the option. Resolves ``--save`` /
    ``--record`` to the file that will be written and ``--num-images`` to the number of images."""
    from theory.core import checks

    _validate_numbers(args, checks)
    validate_jacobi(args, checks)
    _validate_model_options(args)
    _validate_method(args)
    n_conds = _count_conditions(args)
    if args.num_images is None:
        args.num_images = n_conds or 1
    else:
        checks.integer("--num-images", args.num_images, lo=1)
        if n_conds and args.num_images != n_conds:
            src = "--prompts" if _given(args, "prompts") else "--captions"
            raise ValueError(f"--num-images {args.num_images} does not match the {n_conds} condition(s) given by "
                             f"{src} (one image per entry); drop --num-images or give {args.num_images} entries")
    from real.decode.checks import MAX_IMAGES
    from real.specs import spec

    T = args.num_tokens or spec(args.model).tokens      # tokens per image when the spec knows them
    if T and args.tree is None and args.L is not None and args.L > T:
        raise ValueError(f"--L {args.L} is more than the {T} tokens of one image of --model {args.model} "
                         f"(a round never drafts past the image); use --L <= {T}")

    checks.integer("--num-images", args.num_images, lo=1, hi=MAX_IMAGES)
    if args.batch_size is not None:
        checks.integer("--batch-size", args.batch_size, lo=1, hi=args.num_images)
        if args.batch_size > 1 and not spec(args.model).batched:
            raise ValueError(f"--batch-size {args.batch_size}: --model {args.model} generates one image at a time "
                             "(its cache has no per-row lengths); use --batch-size 1")
    if getattr(args, "fidelity", False) and args.tree is not None:
        from real.decode.score import TREE_REASON

        raise ValueError(f"--fidelity with --tree: {TREE_REASON}")
    if getattr(args, "fidelity", False) and getattr(args, "draft", None) == "jacobi":
        from real.decode.score import JACOBI_REASON

        raise ValueError(f"--fidelity with --draft jacobi: {JACOBI_REASON}")
    if args.save is not None:
        args.save = str(check_output_file("--save", args.save, ".npz"))
    if args.record is not None:
        if str(args.method).lower() == "ar":
            raise ValueError("--record saves the P/Q rows of drafted rounds; --method ar drafts none: give a "
                             "speculative --method (e.g. vanilla) or drop --record")
        args.record = str(check_output_file("--record", args.record, ".npz"))
        if args.save is not None and os.path.abspath(args.record) == os.path.abspath(args.save):
            raise ValueError(f"--record and --save name the same file {args.save!r}")


def _validate_numbers(args, checks) -> None:
    if args.L is not None:
        checks.integer("--L", args.L, lo=1)
    checks.seed(args.seed, "--seed")
    t = checks.real("--temperature", args.temperature, 0)
    if 0 < t < 1e-6:
        raise ValueError(f"--temperature must be 0 (greedy) or >= 1e-6 (below, logits / temperature overflow), "
                         f"got {args.temperature}")
    checks.real("--top-p", args.top_p, 0, 1, lo_open=True)
    if args.top_k is not None:
        checks.integer("--top-k", args.top_k, lo=0)
    if args.cfg_scale is not None:
        checks.real("--cfg-scale", args.cfg_scale, 0)
    if args.num_tokens is not None:
        checks.integer("--num-tokens", args.num_tokens, lo=1)
    if args.threads is not None:
        checks.integer("--threads", args.threads, lo=1)
    if args.image_size is not None:
        checks.integer("--image-size", args.image_size, lo=16)
        if args.image_size % 16:
            raise ValueError(f"--image-size must be a multiple of 16 (the VQ downsampling), got {args.image_size}")
    from theory.rules import methods as registry

    for dest, p in registry.flags().items():      # verifier flags: the registry's types and ranges
        v = getattr(args, dest, None)
        if v is not None and p.type in (int, float):
            checks.integer(_flag(dest), v) if p.type is int else checks.real(_flag(dest), v)
    from coolsd import validate

    validate.device("--device", args.device, available=False)    # availability: real.registry when building


def _validate_method(args) -> None:
    from real.decode.methods import METHODS

    from real.decode.methods import MethodParams, method_params
    from theory.rules import methods as registry

    method = str(args.method).lower()
    if method not in tuple(m.lower() for m in METHODS) + ("ar",) + tuple(registry.ALIASES):
        raise ValueError(f"--method: unknown method {args.method!r}; choose from {', '.join(METHODS + ('ar',))}")
    if method != "ar":   # the registry's ranges (e.g. --delta > 0) checked before any model is built
        params = MethodParams(**{f: getattr(args, f, None) for f in registry.flags()})
        registry.resolve(method, method_params(method, params))
    d_thr = getattr(args, "gsd_d_threshold", None)         # None: the default threshold; inf: "off"
    gsd_needs = method != "ar" and registry.get(method).needs_embeddings and not (d_thr is not None
                                                                                  and math.isinf(d_thr))
    from real.specs import spec

    codebook = spec(args.model).codebook                  # "own", "vq" (only with --vq-ckpt) or "none"
    if gsd_needs and (codebook == "none" or (codebook == "vq" and not _given(args, "vq_ckpt"))):
        raise ValueError(f"--method {method} needs the VQ codebook for its embedding-distance test; --model {args.model} "
                         f"has none{' without --vq-ckpt' if codebook == 'vq' else ''} (or --gsd-d-threshold off)")
    if method.startswith("lantern"):
        if codebook == "none":
            raise ValueError(f"--method {method} needs a codebook neighbour table; --model {args.model} has no "
                             "VQ codebook")
        if codebook == "vq" and not _given(args, "vq_ckpt"):
            raise ValueError(f"--method {method} needs a codebook neighbour table: give --vq-ckpt "
                             f"with --model {args.model}")


def _validate_model_options(args) -> None:
    """The model's spec (``real.specs``): the one generic check, then its input files and prompts."""
    from coolsd import validate

    validate.model_options(args)
    if args.captions is not None:
        from real.nn.checkpoint import load_captions

        args._caption_count = len(load_captions(args.captions))


def _count_conditions(args) -> int | None:
    if _given(args, "prompts"):
        return len(args.prompts)
    return getattr(args, "_caption_count", None)


def check_bundle(args, bundle) -> None:
    """Checks that need the built model but no generation: --num-tokens within the model's image,
    --class-id within its classes (the builders check it too)."""
    L = args.L if args.tree is None else None
    if L is not None and L > bundle.num_tokens:
        raise ValueError(f"--L {L} is more than the {bundle.num_tokens} tokens of one image of --model {args.model} "
                         "(a round never drafts past the image); use --L <= " + str(bundle.num_tokens))
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
