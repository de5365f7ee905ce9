"""`coolsd train-drafter`: train an EAGLE-1 head for any registered model, resumably, in one process or under torchrun.

  coolsd train-drafter --model llamagen-tiny --data generate --num-sequences 512 --steps 400 --out DIR
  coolsd train-drafter --model mnist --data tokens codes.npz --steps 4000 --out DIR
  torchrun --nproc-per-node 2 -m coolsd train-drafter --model llamagen-tiny ... --out DIR
  coolsd generate --model llamagen-tiny --draft eagle --drafter-dir DIR

Stages, each resumable (``--resume`` continues a run stopped by Ctrl-C or a kill, with the same options):
1. data: the target's own samples (``--data generate``) or a tokens file (``--data tokens FILE``);
2. features: the target's hidden states along them, into shards under ``--work`` (``real.drafter.features``);
3. training (``real.drafter.train``), with a validation line at each evaluation;
4. the drafter written atomically into ``--out`` in the layout ``--drafter-dir`` loads, with its manifest.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time

WORK_SUFFIX = ".work"


def register(sub):
    p = sub.add_parser("train-drafter", help="train an EAGLE-1 drafter for a registered model (resumable, torchrun)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a registered model (coolsd generate --list-models)")
    p.add_argument("--data", nargs="+", required=True, metavar="SOURCE",
                   help="'generate' (the target's own samples under the inference processing) or 'tokens FILE' (an .npz "
                        "of tokens (N, T) with class_ids (N,) or prompts (N,), teacher-forced)")
    p.add_argument("--num-sequences", type=int, default=None, help="--data generate: sequences to sample (required)")
    p.add_argument("--out", required=True, help="the drafter directory to write (config.json, model.safetensors, "
                                                "coolsd_drafter.json)")
    p.add_argument("--work", default=None, help=f"feature cache and training state (default: OUT{WORK_SUFFIX})")
    p.add_argument("--resume", action="store_true", help="continue the run in --work (same options)")
    p.add_argument("--seed", type=int, default=0, help="the target's seed (random tiny models, class draws) and the "
                                                        "training seed")
    t = p.add_argument_group("training (EAGLE-1 objective; real.drafter.train)")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--batch-size", type=int, default=32, help="global sequences per step (split over ranks)")
    t.add_argument("--accum", type=int, default=1, help="micro-batches per rank and step (gradient accumulation)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
    t.add_argument("--p-w", type=float, default=0.1, help="token cross-entropy weight (EAGLE's p_w)")
    t.add_argument("--v-w", type=float, default=1.0, help="feature regression weight (EAGLE's v_w)")
    t.add_argument("--noise", type=float, default=0.2, help="uniform feature-noise width")
    t.add_argument("--grad-clip", type=float, default=0.5)
    t.add_argument("--layers", type=int, default=1, help="decoder layers of the head (EAGLE-1: 1)")
    t.add_argument("--null-frac", type=float, default=0.1,
                   help="share of sequences trained on the CFG null row (the paper's recipe: 0.1)")
    t.add_argument("--heldout", type=int, default=None, help="held-out sequences for validation (default 10%%, at "
                                                             "most 256)")
    t.add_argument("--eval-every", type=int, default=250)
    t.add_argument("--save-every", type=int, default=100, help="training-state checkpoints every N steps")
    s = p.add_argument_group("sampling (--data generate: the inference processing)")
    s.add_argument("--cfg-scale", type=float, default=None, help="default: the model's")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=None, help="default: the model's")
    s.add_argument("--top-p", type=float, default=1.0)
    r = p.add_argument_group("run")
    r.add_argument("--shard-size", type=int, default=64, help="sequences per feature shard (one prefill batch)")
    r.add_argument("--cache-dtype", choices=["float16", "float32"], default="float16")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (torchrun: cuda:LOCAL_RANK)")
    r.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="model dtype (default float32; "
                                                                                  "CUDA trains under bf16 autocast)")
    r.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    from .generate import add_checkpoint_args

    add_checkpoint_args(p, skip=("draft", "drafter_dir", "class_id"))
    p.set_defaults(func=run)


# ------------------------------------------------------------------------------------------------ checks (no work)

def _validate(args) -> dict:
    """Every input-only check, before any model is built: one-line ValueError naming the option. Returns the run's
    identity (what --resume must match) and the parsed pieces."""
    from coolsd import validate
    from real.drafter.features import read_tokens_file
    from real.drafter.train import TrainConfig
    from real.nn.checkpoint import sha256_file
    from real.specs import spec

    s = spec(args.model)
    args.draft, args.drafter_dir, args.class_id = None, None, None
    validate.model_options(args)
    validate.common(args, available=False)     # the options commands share (issue 50): the same checks as generate
    from theory.core import checks
    from theory.rules.methods import FLOAT32_MAX

    for k in ("lr", "p_w", "v_w", "noise", "grad_clip"):    # training floats: finite, >= 0, within float32
        checks.real("--" + k.replace("_", "-"), getattr(args, k), 0, FLOAT32_MAX, lo_open=k == "lr")
    src = args.data[0]
    if src not in ("generate", "tokens") or (src == "generate" and len(args.data) != 1) or \
            (src == "tokens" and len(args.data) != 2):
        raise ValueError(f"--data {' '.join(args.data)}: give 'generate' or 'tokens FILE'")
    if "eagle" not in s.drafts:
        raise ValueError(f"--model {args.model} takes no EAGLE drafter (its drafts: {', '.join(s.drafts)})")
    tokens = None
    if src == "generate":
        if args.num_sequences is None:
            raise ValueError("--data generate needs --num-sequences N")
        if isinstance(args.num_sequences, bool) or args.num_sequences < 2:
            raise ValueError(f"--num-sequences must be >= 2 (one to train on, one to hold out), got {args.num_sequences}")
    else:
        if args.num_sequences is not None:
            raise ValueError("--num-sequences belongs to --data generate (a tokens file has its own count)")
        tokens = read_tokens_file(args.data[1])
        if tokens.class_ids is not None and "class_id" not in s.options:
            raise ValueError(f"--data tokens {args.data[1]}: class_ids given, but --model {args.model} is not "
                             "class-conditional")
        if tokens.prompts is not None and "prompts" not in s.options:
            raise ValueError(f"--data tokens {args.data[1]}: prompts given, but --model {args.model} takes no text "
                             "prompts (its conditions come from --seed: use --data generate)")
        if tokens.class_ids is not None and int(tokens.class_ids.min()) < 0:
            raise ValueError(f"--data tokens {args.data[1]}: a negative class id")
        if len(tokens.tokens) < 2:
            raise ValueError(f"--data tokens {args.data[1]}: needs >= 2 sequences (one to train on, one to hold out)")
    n = args.num_sequences if tokens is None else len(tokens.tokens)
    heldout = args.heldout if args.heldout is not None else max(1, min(256, n // 10))
    if heldout < 1 or heldout >= n:
        raise ValueError(f"--heldout {heldout}: must be in [1, {n - 1}] for {n} sequences")
    for k in ("shard_size", "layers"):
        if getattr(args, k) < 1:
            raise ValueError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if not (0.0 <= args.null_frac <= 1.0):
        raise ValueError(f"--null-frac must be in [0, 1], got {args.null_frac}")
    for k in ("temperature", "top_p"):
        if not math.isfinite(getattr(args, k)) or getattr(args, k) < 0:
            raise ValueError(f"--{k.replace('_', '-')} must be a finite number >= 0, got {getattr(args, k)}")
    if args.cfg_scale is not None and not math.isfinite(args.cfg_scale):
        raise ValueError(f"--cfg-scale must be finite, got {args.cfg_scale}")
    tc = TrainConfig(steps=args.steps, batch_size=args.batch_size, accum=args.accum, lr=args.lr, warmup=args.warmup,
                     p_w=args.p_w, v_w=args.v_w, noise=args.noise, grad_clip=args.grad_clip, seed=args.seed,
                     eval_every=args.eval_every, save_every=args.save_every)
    dev = validate.device("--device", _local_device(args.device))
    out, work = _paths(args)
    data_id = ({"source": "generate", "num_sequences": n, "cfg_scale": args.cfg_scale, "temperature": args.temperature,
                "top_k": args.top_k, "top_p": args.top_p} if tokens is None else
               {"source": "tokens", "file_sha256": sha256_file(args.data[1]), "num_sequences": n})
    from real.registry import BuildOptions

    model_opts = {k: v for k, v in dataclasses.asdict(BuildOptions.from_namespace(args)).items()
                  if v is not None and k not in ("device", "num_images")}
    identity = {"model": args.model, "model_options": model_opts, "data": data_id, "train": dataclasses.asdict(tc),
                "layers": args.layers, "null_frac": args.null_frac, "heldout": heldout, "shard_size": args.shard_size,
                "cache_dtype": args.cache_dtype, "dtype": args.dtype or "float32"}
    identity = json.loads(json.dumps(identity))
    if args.resume:
        saved = json.loads((work / "run.json").read_text())
        if saved != identity:
            diff = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
            raise ValueError(f"--resume: {work} holds a run with other {', '.join(diff)}; resume with the same "
                             "options, or start afresh in another --out")
    return {"spec": s, "tokens": tokens, "n": n, "heldout": heldout, "train": tc, "device": dev, "out": out,
            "work": work, "identity": identity}


def _local_device(device: str) -> str:
    if device in ("cuda", "auto") and "LOCAL_RANK" in os.environ:
        import torch

        if torch.cuda.is_available():
            return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def _paths(args) -> tuple[pathlib.Path, pathlib.Path]:
    """--out and --work checked: neither is nor holds an input; --out is absent, empty or a drafter directory (it is
    replaced as a whole); --work without --resume holds no earlier run."""
    from coolsd.io import check_outputs
    from real.drafter.files import MANIFEST

    out = pathlib.Path(args.out).expanduser()
    work = pathlib.Path(args.work).expanduser() if args.work else out.with_name(out.name + WORK_SUFFIX)
    inputs = {"--data tokens": args.data[1] if args.data[0] == "tokens" and len(args.data) > 1 else None}
    inputs.update({f"--{k.replace('_', '-')}": getattr(args, k, None)
                   for k in ("target_ckpt", "draft_ckpt", "vq_ckpt", "captions", "target_pretrained")})
    check_outputs({"--out": out, "--work": work}, inputs)
    for flag, path in inputs.items():
        if path is None or not os.path.exists(path):
            continue
        q = pathlib.Path(path).resolve()
        for name, d in (("--out", out), ("--work", work)):
            if d.resolve() == q or d.resolve() in q.parents:
                raise ValueError(f"{name} {str(d)!r} holds the input {flag} {path!r}: the output would replace it; "
                                 "give another directory")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ValueError(f"--out {str(out)!r} holds other files (not a drafter this command wrote); give a new or "
                         "empty directory")
    if not out.parent.exists():
        raise ValueError(f"--out: directory {str(out.parent)!r} does not exist")
    if work.exists() and not work.is_dir():
        raise ValueError(f"--work {str(work)!r} exists and is not a directory")
    if args.resume and not (work / "run.json").is_file():
        raise ValueError(f"--resume: no run to resume in {str(work)!r} (start without --resume)")
    if not args.resume and work.is_dir() and any(work.iterdir()):
        raise ValueError(f"--work {str(work)!r} holds an earlier run: continue it with --resume, or remove it")
    return out, work


# ------------------------------------------------------------------------------------------------ the run

def run(args) -> int:
    import numpy as np
    import torch

    checked = _validate(args)
    rank, world = _init_distributed(checked["device"])
    try:
        return _run(args, checked, rank, world, np, torch)
    finally:
        if world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


def _init_distributed(device: str) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if str(device).startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _say(rank: int, quiet: bool, msg: str) -> None:
    if rank == 0 and not quiet:
        print(msg, file=sys.stderr, flush=True)


def _run(args, checked, rank, world, np, torch) -> int:
    from coolsd.studies.sweep.store import code_version
    from real.decode.sampling import Processing
    from real.drafter import features as fx
    from real.drafter.files import fresh_drafter, save_drafter, target_fingerprint
    from real.drafter.train import Data, evaluate, train
    from real.protocol import NO_DRAFT
    from real.registry import BuildOptions, build

    t_start = time.perf_counter()
    ident, work, n = checked["identity"], checked["work"], checked["n"]
    if args.threads:
        torch.set_num_threads(args.threads)
    elif "tiny" in args.model:
        torch.set_num_threads(1)
    tokens = checked["tokens"]
    opts = BuildOptions.from_namespace(argparse.Namespace(**{**vars(args), "draft": NO_DRAFT, "device": checked["device"],
                                                            "num_images": n if tokens is None else 1}))
    if tokens is not None and tokens.prompts is not None:
        opts = dataclasses.replace(opts, prompts=list(tokens.prompts))
    bundle = build(args.model, opts)
    target = bundle.target
    V, T = int(target.vocab_size), int(bundle.num_tokens)
    if tokens is not None:
        if tokens.tokens.shape[1] != T:
            raise ValueError(f"--data tokens {args.data[1]}: sequences of {tokens.tokens.shape[1]} tokens, but --model "
                             f"{args.model} makes {T} per image")
        if int(tokens.tokens.max()) >= V:
            raise ValueError(f"--data tokens {args.data[1]}: code {int(tokens.tokens.max())} >= V = {V} of --model "
                             f"{args.model}")
        if tokens.class_ids is not None:
            k = int(target.config.num_classes)
            if int(tokens.class_ids.max()) >= k:
                raise ValueError(f"--data tokens {args.data[1]}: class id {int(tokens.class_ids.max())} >= the "
                                 f"{k} classes of --model {args.model}")
        conds = tokens.conditions if tokens.class_ids is not None else list(bundle.conds)
    else:
        conds = [bundle.conds[i % len(bundle.conds)] for i in range(n)]     # --prompts / --captions: cycled
    if rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        if not args.resume:
            (work / "run.json").write_text(json.dumps(ident, indent=2, sort_keys=True))
    _barrier(world)
    cfg_scale = bundle.cfg_scale if args.cfg_scale is None else args.cfg_scale
    top_k = bundle.top_k if args.top_k is None else args.top_k
    proc = Processing(args.temperature, top_k, args.top_p, cfg_scale)
    use_cfg = cfg_scale != 1.0
    cache = fx.FeatureCache(work / "features")
    shards = -(-n // args.shard_size)
    todo = [k for k in range(shards) if k % world == rank and not cache.done(k)]
    _say(rank, args.quiet, f"coolsd train-drafter: {args.model}, {n} sequences of {T} tokens in {shards} shards "
                           f"({shards - len(todo) * world if world == 1 else 'some'} cached); V = {V}")
    t0 = time.perf_counter()
    from tqdm import tqdm

    for k in tqdm(todo, disable=args.quiet or rank != 0, desc="features", unit="shard"):   # shards, resumable
        lo, hi = k * args.shard_size, min(n, (k + 1) * args.shard_size)
        kw = dict(null_frac=args.null_frac, seed=args.seed, shard=k, dtype=fx.CACHE_DTYPES[args.cache_dtype])
        if tokens is None:       # samples and their features from the same target forwards
            shard = fx.generate_shard(target, conds[lo:hi], T, proc, args.seed * 100003 + k, **kw)
        else:
            shard = fx.extract_shard(target, conds[lo:hi], tokens.tokens[lo:hi], cfg=use_cfg, **kw)
        cache.write(k, shard)
    extract_s = time.perf_counter() - t0
    _barrier(world)
    data = Data(cache.open(shards), checked["heldout"])
    drafter = fresh_drafter(target, layers=args.layers, seed=args.seed)
    if args.dtype == "bfloat16":
        drafter = drafter.to(torch.bfloat16)
    drafter.train().requires_grad_(True)
    drafter.embed_tokens.weight.requires_grad_(False)
    autocast = str(checked["device"]).startswith("cuda")
    result = train(drafter, data, checked["train"], state_path=work / "state.pt", meta=ident, resume=args.resume and
                   (work / "state.pt").is_file(), progress=not args.quiet, autocast=autocast,
                   log=lambda m: _say(rank, args.quiet, m))
    final = evaluate(drafter, data)
    untrained = evaluate(fresh_drafter(target, layers=args.layers, seed=args.seed), data)
    if rank == 0:
        manifest = {"model": args.model, "target_fingerprint": target_fingerprint(target), "format": "lantern-eagle1",
                    "command": "coolsd " + " ".join(sys.argv[1:]) if sys.argv[0].endswith(("coolsd", "__main__.py"))
                    else " ".join(sys.argv), "git_commit": code_version(), "identity": ident,
                    "validation": final, "validation_untrained": untrained, "history": result["history"],
                    "final_loss": result["final_loss"], "steps": result["steps"], "ranks": world,
                    "seconds": {"features": round(extract_s, 2), "training": round(result["seconds"], 2),
                                "total": round(time.perf_counter() - t_start, 2)},
                    "feature_cache_bytes": cache.nbytes(), "torch": torch.__version__}
        save_drafter(checked["out"], drafter, manifest)
        print(json.dumps({"out": str(checked["out"]), "model": args.model, "steps": result["steps"],
                          "final_loss": result["final_loss"], "validation": final,
                          "validation_untrained": untrained, "seconds": manifest["seconds"]}))
    _barrier(world)
    return 0
