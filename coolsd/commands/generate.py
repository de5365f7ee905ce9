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
                   help="vanilla, cool-sd, uniform-rsd, linear-rsd, lantern, lantern++, typical, greedy, scaled "
                        "(--weights), or ar (plain autoregressive baseline)")
    g.add_argument("--L", type=int, default=4, help="draft length per round (default 4)")
    g.add_argument("--tree", default=None,
                   help="static draft tree (EAGLE-1 / LANTERN++ setting): eagle25, eagle57, chain (the chain of --L "
                        "drafts run by the tree engine) or a JSON list of paths of child ranks, e.g. '[[0],[1],[0,0]]'")
    m = g.add_argument_group("verifier parameters")
    m.add_argument("--delta", type=float, default=2.0, help="Cool-SD relaxation budget delta (w_1 = delta; default 2.0)")
    m.add_argument("--nu", type=float, default=0.7, help="Cool-SD decay nu (default 0.7)")
    m.add_argument("--mu", type=float, default=None,
                   help="Cool-SD explicit offset mu: w_i = delta exp(-nu i - mu) (default: --cool-sd-norm)")
    m.add_argument("--cool-sd-norm", choices=["offset", "first", "floor1", "mean"], default=None,
                   help="Cool-SD normalisation (default offset: w_i = 1 + (delta - 1) exp(-nu (i-1)); docs/theory.md)")
    m.add_argument("--weights", default=None,
                   help="scaled: a schedule.json from coolsd tune, or comma-separated weights w_1,...,w_L")
    m.add_argument("--c", type=float, default=1.5, help="UniformRSD weight c (default 1.5)")
    m.add_argument("--linear-first", type=float, default=3.0)
    m.add_argument("--linear-last", type=float, default=1.0)
    m.add_argument("--lantern-k", type=int, default=None, help="LANTERN neighbourhood size k (default ~V/16, <= 1000)")
    m.add_argument("--lantern-delta", type=float, default=0.2, help="LANTERN absolute mass threshold (default 0.2)")
    m.add_argument("--lam", type=float, default=2.0, help="LANTERN++ lambda (default 2.0)")
    m.add_argument("--resampler", choices=["lantern", "optimal"], default="lantern",
                   help="LANTERN/LANTERN++ resampling: their own or G* (default lantern)")
    m.add_argument("--eps", type=float, default=0.09, help="typical acceptance epsilon")
    m.add_argument("--alpha", type=float, default=0.3, help="typical acceptance alpha")
    s = g.add_argument_group("sampling")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=None, help="0 = off (default: the model's, 0 for most)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (default: the model's)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--num-images", type=int, default=1)
    s.add_argument("--num-tokens", type=int, default=None, help="tokens per image (default: the whole image)")
    s.add_argument("--class-id", type=int, default=None, help="c2i class (default: seeded random per image)")
    r = g.add_argument_group("run")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 for *-tiny models, whose ops are too small to share)")
    r.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default float32 on CPU, bfloat16 on CUDA)")
    r.add_argument("--draft", default=None, help="draft kind: layerskip, small, eagle (model-dependent default)")
    r.add_argument("--baseline", action="store_true", help="also run plain AR decoding and report the speed-up")
    r.add_argument("--record", default=None,
                   help="save the per-round P/Q rows (and image index) to this .npz (theory.recorded, coolsd tune); "
                        "with --tree the rounds that drafted the whole tree")
    r.add_argument("--save", default=None, help="save tokens (and decoded images when a VQ is loaded) to this .npz")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    c = g.add_argument_group("checkpoints (--model llamagen)")
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
    g.set_defaults(func=run)


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

    from coolsd.atomic import atomic_write

    from real import engine
    from real.methods import MethodParams, make_verifier, method_processing
    from real.registry import build
    from real.sampling import Processing

    if args.dtype is None:
        dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        args.dtype = "bfloat16" if str(dev).startswith("cuda") else "float32"
    if args.L < 1:
        raise ValueError(f"--L must be >= 1, got {args.L}")
    tree = parse_tree(args.tree, args.L) if args.tree is not None else None
    if tree is not None and args.method.lower() == "ar":
        raise ValueError("--tree needs a speculative method (not ar)")
    L = tree.depth if tree is not None else args.L
    if args.num_images < 1:
        raise ValueError(f"--num-images must be >= 1, got {args.num_images}")
    threads = args.threads if args.threads is not None else (1 if "tiny" in args.model else None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    bundle = build(args.model, args)
    cfg_scale = bundle.cfg_scale if args.cfg_scale is None else args.cfg_scale
    top_k = getattr(bundle, "top_k", 0) if args.top_k is None else args.top_k
    proc = method_processing(args.method, Processing(args.temperature, top_k, args.top_p, cfg_scale))
    method = args.method.lower()
    params = MethodParams(delta=args.delta, nu=args.nu, mu=args.mu, c=args.c, linear_first=args.linear_first,
                          linear_last=args.linear_last, lantern_k=args.lantern_k, lantern_delta=args.lantern_delta,
                          lam=args.lam, resampler=args.resampler, eps=args.eps, alpha=args.alpha,
                          norm=args.cool_sd_norm, weights=parse_weights(args.weights) if args.weights else None)
    verifier = None if method == "ar" else make_verifier(method, L, params, bundle.neighbors,
                                                         device=getattr(bundle.target, "device", None))
    progress = None if not args.json else False
    gens, base = [], []
    for i, cond in enumerate(bundle.conds):
        seed = args.seed + i
        if verifier is None:
            gens.append(engine.ar_generate(bundle.target, cond, num_tokens=bundle.num_tokens, processing=proc,
                                           seed=seed, progress=progress))
        elif tree is not None:
            gens.append(engine.tree_generate(bundle.target, bundle.draft, cond, num_tokens=bundle.num_tokens,
                                             verifier=verifier, tree=tree, processing=proc, seed=seed, progress=progress,
                                             record_rows=args.record is not None))
        else:
            gens.append(engine.speculative_generate(bundle.target, bundle.draft, cond, num_tokens=bundle.num_tokens,
                                                    verifier=verifier, L=args.L, processing=proc, seed=seed,
                                                    record_rows=args.record is not None, progress=progress))
        if args.baseline:
            base.append(engine.ar_generate(bundle.target, cond, num_tokens=bundle.num_tokens, processing=proc,
                                           seed=seed, progress=progress))
    stats = engine.summarize(gens)
    out = {"model": args.model, "method": method, "L": L,
           "params": {k: _plain(v) for k, v in (verifier.params.items() if verifier else [])},
           "verifier": verifier.name if verifier else "ar", "processing": proc.params(),
           "image_tokens": bundle.num_tokens, "num_images": len(gens), "seed": args.seed,
           "device": str(args.device), "dtype": args.dtype, "info": bundle.info, **stats}
    if tree is not None:
        out["tree"] = {"name": args.tree, "nodes": tree.n_nodes, "depth": tree.depth}
    if base:
        b = engine.summarize(base)
        out["baseline"] = {"seconds": b["seconds"], "tokens_per_second": b["tokens_per_second"]}
        out["speedup"] = b["seconds"] / stats["seconds"]
    if args.record and tree is not None:   # static trees: the rounds that drafted the whole tree (theory.tune.TreeRows)
        full = [(i, r) for i, g in enumerate(gens) for r in g.rounds if r.depth == tree.depth]
        if not full:
            raise ValueError("--record with --tree: no round drafted the whole tree (images too short?)")
        arrs = {"p": np.stack([r.p for _, r in full]), "q": np.stack([r.q for _, r in full]),
                "tokens": np.stack([r.drafts for _, r in full]), "image": np.array([i for i, _ in full], dtype=np.int64),
                "accepted": np.array([r.accepted for _, r in full]),
                "tree_paths": np.array(json.dumps([list(p) for p in tree.paths]))}
        atomic_write(args.record, lambda f: np.savez_compressed(f, **arrs))
        out["record"] = args.record
    elif args.record:
        recs = [r for g in gens for r in g.rounds]
        p, q, d, nd = engine.records_to_arrays(recs, args.L)
        image = np.array([i for i, g in enumerate(gens) for r in g.rounds if r.drafted > 0], dtype=np.int64)
        acc = np.array([r.accepted for r in recs if r.drafted > 0])
        atomic_write(args.record, lambda f: np.savez_compressed(f, p=p, q=q, drafts=d, n_drafted=nd, image=image,
                                                                accepted=acc))
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


def parse_weights(spec: str) -> tuple[float, ...]:
    """--weights value -> (w_1, ..., w_L): a JSON file from ``coolsd tune`` (key "weights") or "3,1.2,1,1"."""
    import os

    if os.path.exists(spec):
        with open(spec) as f:
            try:
                d = json.load(f)
            except ValueError:
                raise ValueError(f"--weights: {spec} is not JSON (write it with coolsd tune)") from None
        if isinstance(d, dict) and "weights" not in d and "levels" in d:
            raise NotImplementedError(f"--weights: {spec} holds a 'level' schedule; running level rules from the "
                                      "CLI is not implemented (tune with --family free/exponential/linear/uniform)")
        w = d.get("weights") if isinstance(d, dict) else d
    else:
        try:
            w = [float(x) for x in spec.split(",")]
        except ValueError:
            raise ValueError(f"--weights must be a schedule.json path or comma-separated numbers, got {spec!r}") from None
    if not isinstance(w, list) or not w or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in w):
        raise ValueError(f"--weights: need a non-empty list of finite weights > 0, got {w!r}")
    return tuple(float(x) for x in w)


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
