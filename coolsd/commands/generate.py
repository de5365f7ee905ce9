"""`coolsd generate`: speculative decoding of real AR image models with any verifier.

  coolsd generate --model llamagen-tiny --method cool-sd --delta 2 --json
  coolsd generate --model llamagen-tiny --method vanilla --tree eagle25

Models come from ``real.registry`` (``--list-models``); methods from ``real.methods``.
"""
from __future__ import annotations

import json
import math


def register(sub):
    g = sub.add_parser("generate", help="speculative decoding of an AR image model (real engine)")
    g.add_argument("--model", default="llamagen-tiny", help="model pair from real.registry (default llamagen-tiny)")
    g.add_argument("--list-models", action="store_true", help="list the registered models and exit")
    g.add_argument("--method", default="vanilla",
                   help="a method of theory.methods (vanilla, cool-sd, uniform-rsd, linear-rsd, lantern, lantern++, "
                        "lantern+G*, typical, greedy) or ar (plain autoregressive baseline)")
    g.add_argument("--L", type=int, default=4, help="draft length per round (default 4)")
    g.add_argument("--tree", default=None,
                   help="static draft tree (EAGLE-1 / LANTERN++ setting): eagle25, eagle57, chain (the chain of --L "
                        "drafts run by the tree engine) or a JSON list of paths of child ranks, e.g. '[[0],[1],[0,0]]'")
    from theory import methods as registry

    m = g.add_argument_group("verifier parameters (theory.methods; unset: the method's default)")
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
    s.add_argument("--num-images", type=int, default=1)
    s.add_argument("--batch-size", type=int, default=None,
                   help="images generated together in one engine batch (default: all --num-images, at most "
                        "real.engine.MAX_BATCH and what half the free memory holds); transformers adapters: 1")
    s.add_argument("--num-tokens", type=int, default=None, help="tokens per image (default: the whole image)")
    s.add_argument("--class-id", type=int, default=None, help="c2i class (default: seeded random per image)")
    r = g.add_argument_group("run")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 for *-tiny models, whose ops are too small to share)")
    r.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default float32 on CPU, bfloat16 on CUDA)")
    r.add_argument("--draft", default=None, help="draft kind: layerskip, small, eagle (model-dependent default)")
    r.add_argument("--baseline", action="store_true", help="also run plain AR decoding and report the speed-up")
    r.add_argument("--record", default=None, help="save the per-round P/Q rows to this .npz (for theory.recorded)")
    r.add_argument("--save", default=None, help="save tokens (and decoded images when a VQ is loaded) to this .npz")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    add_checkpoint_args(g)
    g.set_defaults(func=run)


def add_checkpoint_args(p):
    """The model-file and prompt options (fields of ``real.registry.BuildOptions``); shared with ``coolsd sweep``."""
    c = p.add_argument_group("model files and prompts (--model llamagen, lumina-mgpt, janus-pro, emu3)")
    c.add_argument("--model-type", choices=["c2i", "t2i"], default=None)
    c.add_argument("--image-size", type=int, default=None)
    c.add_argument("--target-ckpt", default=None)
    c.add_argument("--target-size", default=None, help="B, L, XL, XXL (default XL)")
    c.add_argument("--target-pretrained", default=None, help="download a published checkpoint (real.llamagen.PRETRAINED)")
    c.add_argument("--draft-ckpt", default=None)
    c.add_argument("--draft-size", default=None, help="B, L, XL, XXL (default B)")
    c.add_argument("--draft-pretrained", default=None)
    c.add_argument("--drafter-dir", default=None, help="LANTERN EAGLE drafter directory (with --draft eagle)")
    c.add_argument("--vq-ckpt", default=None)
    c.add_argument("--vq-size", default=None, help="VQ config: VQ-16 (default), VQ-8, tiny")
    c.add_argument("--captions", default=None, help="t2i: .pt list of {'embedding': (120, 2048), 'mask': (120,)}")
    c.add_argument("--prompts", nargs="*", default=None, help="t2i: prompts encoded with flan-t5-xl")


def run(args):
    if args.list_models:
        from real.registry import MODELS

        for name, (_, help) in sorted(MODELS.items()):
            print(f"{name:22s} {help}")
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
    import numpy as np
    import torch

    from real import engine
    from real.methods import MethodParams, make_verifier, method_processing
    from real.registry import BuildOptions, build
    from real.sampling import Processing
    from theory import methods as registry

    if args.dtype is None:
        dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        args.dtype = "bfloat16" if str(dev).startswith("cuda") else "float32"
    if args.L < 1:
        raise ValueError(f"--L must be >= 1, got {args.L}")
    if args.method.lower() != "ar":
        spec = registry.get(args.method)                    # unknown method: error before loading models
        own = {p.option for p in spec.free}
        other = sorted(f for f in registry.flags() if getattr(args, f) is not None and f not in own)
        if other:
            raise ValueError(f"{', '.join('--' + f.replace('_', '-') for f in other)} do(es) not apply to method "
                             f"{spec.name} (its options: {sorted('--' + f.replace('_', '-') for f in own) or 'none'})")
    tree = parse_tree(args.tree, args.L) if args.tree is not None else None
    if tree is not None and args.record:
        raise ValueError("--record stacks chain rounds for theory.recorded; it is not available with --tree")
    if tree is not None and args.method.lower() == "ar":
        raise ValueError("--tree needs a speculative method (not ar)")
    L = tree.depth if tree is not None else args.L
    if args.num_images < 1:
        raise ValueError(f"--num-images must be >= 1, got {args.num_images}")
    if args.batch_size is not None and not 1 <= args.batch_size <= args.num_images:
        raise ValueError(f"--batch-size must be in [1, --num-images = {args.num_images}], got {args.batch_size}")
    threads = args.threads if args.threads is not None else (1 if "tiny" in args.model else None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    bundle = build(args.model, BuildOptions.from_namespace(args))
    cfg_scale = bundle.cfg_scale if args.cfg_scale is None else args.cfg_scale
    top_k = getattr(bundle, "top_k", 0) if args.top_k is None else args.top_k
    method = args.method.lower()
    proc = Processing(args.temperature, top_k, args.top_p, cfg_scale)
    proc = proc if method == "ar" else method_processing(method, proc)
    params = MethodParams(**{f: getattr(args, f) for f in registry.flags()})
    verifier = None if method == "ar" else make_verifier(method, L, params, bundle.neighbors,
                                                         device=getattr(bundle.target, "device", None))
    progress = None if not args.json else False
    run = dict(num_tokens=bundle.num_tokens, processing=proc, seed=args.seed, batch_size=args.batch_size,
               progress=progress)
    gens = engine.generate(bundle.target, None if verifier is None else bundle.draft, bundle.conds, verifier=verifier,
                           L=None if tree is not None else args.L, tree=tree, record_rows=args.record is not None, **run)
    base = engine.generate(bundle.target, None, bundle.conds, **run) if args.baseline else []
    stats = engine.summarize(gens)
    out = {"model": args.model, "method": method, "L": L,
           "params": {k: _plain(v) for k, v in (verifier.params.items() if verifier else [])},
           "verifier": verifier.name if verifier else "ar", "processing": proc.params(),
           "image_tokens": bundle.num_tokens, "num_images": len(gens), "seed": args.seed,
           "batch_size": gens[0].info["batch_size"],
           "device": str(args.device), "dtype": args.dtype, "info": bundle.info, **stats}
    if tree is not None:
        out["tree"] = {"name": args.tree, "nodes": tree.n_nodes, "depth": tree.depth}
    if base:
        b = engine.summarize(base)
        out["baseline"] = {"seconds": b["seconds"], "tokens_per_second": b["tokens_per_second"]}
        out["speedup"] = b["seconds"] / stats["seconds"]
    if args.record:
        recs = [r for g in gens for r in g.rounds]
        p, q, d, nd = engine.records_to_arrays(recs, args.L)
        np.savez_compressed(args.record, p=p, q=q, drafts=d, n_drafted=nd,
                            accepted=np.array([r.accepted for r in recs if r.drafted > 0]))
        out["record"] = args.record
    if args.save:
        toks = np.stack([g.tokens.numpy() for g in gens])
        extra = {}
        side = int(round(bundle.num_tokens ** 0.5))
        if bundle.vq is not None and side * side == bundle.num_tokens:
            extra["images"] = bundle.vq.decode_code(torch.as_tensor(toks)).float().cpu().numpy()
        np.savez_compressed(args.save, tokens=toks, **extra)
        out["saved"] = args.save
    return out


def parse_tree(spec: str, L: int):
    """--tree value -> theory.tree.Tree: eagle25, eagle57, chain (chain_tree(L)) or a JSON list of paths."""
    from theory.tree import EAGLE_25, EAGLE_57, Tree, chain_tree

    named = {"eagle25": EAGLE_25, "eagle57": EAGLE_57}
    key = spec.strip().lower()
    if key in named:
        return Tree(named[key])
    if key == "chain":
        return chain_tree(L)
    try:
        paths = json.loads(spec)
        if not isinstance(paths, list) or not all(isinstance(p, list) and all(isinstance(r, int) for r in p) for p in paths):
            raise TypeError
    except (ValueError, TypeError):
        raise ValueError(f"--tree must be eagle25, eagle57, chain or a JSON list of paths like '[[0],[1],[0,0]]', "
                         f"got {spec!r}") from None
    return Tree(tuple(tuple(p) for p in paths))


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
    return "\n".join(lines)
