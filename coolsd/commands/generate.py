"""`coolsd generate`: speculative decoding of real AR image models with any verifier.

  coolsd generate --model llamagen-tiny --method cool-sd --delta 2 --json
  coolsd generate --model llamagen-tiny --method vanilla --tree eagle25
  coolsd generate --model mnist --draft jacobi --window 16 --method vanilla     (Speculative Jacobi Decoding)

Models come from ``real.registry`` (``--list-models``); methods from ``real.decode.methods``; drafting and method
options are parsed by ``coolsd.options`` (shared with ``coolsd sweep``).
"""
from __future__ import annotations

import json
import os

from coolsd.io import atomic_file, json_safe
from coolsd.options import add_drafting_args, add_gsd_table_arg, add_method_args

from .generate_checks import plan


def register(sub):
    g = sub.add_parser("generate", help="speculative decoding of an AR image model (real engine)")
    g.add_argument("--model", default="llamagen-tiny", help="model pair from real.registry (default llamagen-tiny)")
    g.add_argument("--list-models", action="store_true", help="list the registered models and exit")
    g.add_argument("--method", default="vanilla",
                   help="a method of theory.rules.methods (vanilla, cool-sd, uniform-rsd, linear-rsd, lantern, lantern++, "
                        "lantern+G*, typical, greedy, scaled --weights) or ar (plain autoregressive baseline)")
    add_drafting_args(g)
    add_method_args(g)
    g.add_argument("--lantern-neighbors", choices=["raw", "l2"], default=None,
                   help="LANTERN neighbour table: Euclidean distance between the raw codebook vectors (default, as "
                        "released) or between l2-normalised ones (our earlier table)")
    add_gsd_table_arg(g)
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
                        "real.decode.memory.MAX_BATCH and what half the free memory holds); transformers adapters: 1")
    s.add_argument("--num-tokens", type=int, default=None, help="tokens per image (default: the whole image)")
    r = g.add_argument_group("run")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 for *-tiny models, whose ops are too small to share)")
    r.add_argument("--dtype", default=None, choices=["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
                   help="float32, bfloat16, float16 (default float32 on CPU, bfloat16 on CUDA)")
    r.add_argument("--compile", nargs="?", const="default", default=None,
                   choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                   help="torch.compile the decoder blocks of LlamaGen targets and drafts (real.nn.blocks; falls back "
                        "to eager with a warning when compilation fails); mode default, or reduce-overhead for "
                        "CUDA graphs. On CPU it does not pay at batch 1 (benchmarks/bench_engine.py --compile)")
    r.add_argument("--baseline", action="store_true", help="also run plain AR decoding and report the speed-up")
    r.add_argument("--record", default=None,
                   help="save the per-round P/Q rows (and image index) to this .npz (theory.likelihood.recorded, "
                        "coolsd tune); with --tree the rounds that drafted the whole tree")
    r.add_argument("--save", default=None, help="save tokens (and decoded images when a VQ is loaded) to this .npz")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--fidelity", action="store_true",
                   help="score the generated images exactly (real.decode.score): per-image log_p_hat (the sampler's law) "
                        "and log_p (the processed target) into --save, TV / KL to the target summaries into --json "
                        "(chains, static trees, and dynamic trees with --tree-sampling release)")
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
        print(json.dumps(json_safe(result), allow_nan=False))
    else:
        print(format_result(result))
    return 0


def generate(args) -> dict:
    """``coolsd generate``: the Namespace read once into a validated, built ``generate_checks.Plan`` (every input
    checked before any model is built), then in one direction: run the engine (and the AR baseline) writing the
    records, summarize, score, save; returns the JSON-ready result."""
    p = plan(args)
    gens = _recorded_run(p)
    base = _run(p, None, None) if p.cfg.baseline else []
    out = _result(p, gens, base)
    if p.cfg.record:
        out["record"] = str(p.cfg.record)
    fid = _fidelity(p, gens, base) if p.cfg.fidelity else None
    if fid is not None:
        out["fidelity"] = fid["report"]
    if p.cfg.save:
        _save(p, gens, fid)
        out["saved"] = str(p.cfg.save)
    return out


def _run(p, verifier, mode, on_batch=None) -> list:
    """One engine call over every image of plan ``p`` (``mode`` None: the plain AR baseline); ``on_batch``: the
    record's sink (``_recorded_run``)."""
    from real.decode import engine

    b, cfg = p.bundle, p.cfg
    return engine.generate(b.target, b.draft if mode is not None and mode.needs_draft else None, b.conds,
                           num_tokens=b.num_tokens, verifier=verifier, drafting=mode, processing=p.proc,
                           seed=cfg.seed, batch_size=cfg.batch_size, progress=None if not cfg.json else False,
                           record_rows=on_batch is not None, on_batch=on_batch)


def _recorded_run(p) -> list:
    """The run of plan ``p``, with --record streamed to disk batch by batch (``coolsd.npzstream``; docs/records.md):
    the arrays the mode declares (``ModeDef.record``; ``theory.likelihood.recorded.load_rows`` reads them back),
    written atomically once every batch is in; the rows of one batch at most are held."""
    from coolsd.npzstream import NpzStream
    from coolsd.rowfiles import record_arrays, record_batches, run_stamp

    spec, mode, cfg = p.spec, p.mode, p.cfg
    if not cfg.record or mode is None:
        return _run(p, p.verifier, mode)
    stamp = run_stamp(cfg.model, p.bundle, p.proc, spec.max_depth, method=p.method, images=len(p.bundle.conds),
                      seed=cfg.seed)
    with NpzStream(cfg.record, compress=True) as stream:
        sink = record_batches(stream, lambda gens: spec.mode.record(gens, mode, stamp, record_arrays))
        gens = _run(p, p.verifier, mode, sink)
        try:
            sink.finish()
        except ValueError as e:
            raise ValueError(f"--record with {spec.named}: {e}") from None
    return gens


def _result(p, gens: list, base: list) -> dict:
    """The JSON-ready summary of plan ``p``'s run (and of the baseline); the mode describes itself
    (``ModeDef.report``)."""
    from real.decode import engine

    verifier, mode, spec, b, cfg = p.verifier, p.mode, p.spec, p.bundle, p.cfg
    stats = engine.summarize(gens)
    out = {"model": cfg.model, "method": p.method, "L": spec.max_depth,
           "params": {k: _plain(v) for k, v in (verifier.params.items() if verifier else [])},
           "verifier": verifier.name if verifier else "ar", "processing": p.proc.params(),
           "image_tokens": b.num_tokens, "num_images": len(gens), "seed": cfg.seed,
           "batch_size": gens[0].info["batch_size"], "device": str(cfg.device), "dtype": cfg.dtype, "info": b.info,
           **stats}
    if mode is not None:
        out |= spec.mode.report(mode, spec.opts)
    if base:
        s = engine.summarize(base)
        out["baseline"] = {"seconds": s["seconds"], "tokens_per_second": s["tokens_per_second"]}
        out["speedup"] = s["seconds"] / stats["seconds"]
    tuned = _tuned_prediction(getattr(cfg, "weights", None), getattr(cfg, "schedule", None))
    if tuned:
        out["tuned_prediction"] = tuned
    return out


def _tuned_prediction(*paths) -> dict | None:
    """What ``coolsd tune`` predicted for the schedule file run here (the values of --weights / --schedule: the first
    that names a file): its predicted tokens per call and held-out KL(P||P^) per token, printed next to the measured
    figures."""
    import json

    for path in paths:
        if isinstance(path, str) and os.path.isfile(path):
            try:
                with open(path) as f:
                    d = json.load(f)
            except (OSError, ValueError):
                return None
            if not isinstance(d, dict):
                return None
            held = (d.get("heldout") or {}).get("kl_per_token") or {}
            return {"file": path, "objective": d.get("objective"), "tokens_per_call": d.get("predicted_tokens_per_call"),
                    "tokens_per_call_ci95": d.get("predicted_tokens_per_call_ci95"),
                    "kl_ar_per_token": held.get("measured"), "kl_ar_per_token_ci": held.get("ci")}
    return None


def _fidelity(p, gens: list, base: list) -> dict:
    """--fidelity: exact per-image likelihoods of the images just made (``real.decode.score.summary`` with the
    drafting the mode's likelihood hook gave: ``Plan.scored``); with --baseline the plain-AR images are scored too
    (KL(P||P^) per token, and a second TV)."""
    import torch

    from real.decode.score import summary

    b = p.bundle
    return summary(b.target, None if p.rule is None else b.draft, b.conds, torch.stack([g.tokens for g in gens]),
                   verifier=p.rule, processing=p.proc, batch_size=p.cfg.batch_size or 64, drafting=p.scored,
                   ar_conds=b.conds if base else None, ar_tokens=torch.stack([g.tokens for g in base]) if base else None)


def _save(p, gens: list, fid: dict | None) -> None:
    """--save: tokens (and decoded images when a VQ is loaded, and the per-image likelihoods with --fidelity)."""
    import numpy as np
    import torch

    b = p.bundle
    toks = np.stack([g.tokens.numpy() for g in gens])
    extra = {} if fid is None else {"log_p_hat": fid["log_p_hat"], "log_p": fid["log_p"]}
    side = int(round(b.num_tokens ** 0.5))
    if b.vq is not None and side * side == b.num_tokens:
        extra["images"] = b.vq.decode_code(torch.as_tensor(toks)).float().cpu().numpy()
    with atomic_file(p.cfg.save) as fh:
        np.savez_compressed(fh, tokens=toks, **extra)


def _plain(x):
    return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)


def format_result(r: dict) -> str:
    shape = (f"tree {r['tree']['name']}: {r['tree']['nodes']} nodes, depth {r['tree']['depth']}" if r.get("tree")
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
    t = r.get("tuned_prediction")
    if t and t.get("tokens_per_call") is not None:
        kl = t.get("kl_ar_per_token")
        lines.append(f"  predicted by coolsd tune {t['tokens_per_call']:.3f} tokens per call"
                     + (f", KL(P||P^) per token {kl:.5f} (held-out AR images)" if kl is not None else ""))
    f = r.get("fidelity")
    if f:
        lines.append(f"  NLL/token (sampled law) {f['nll_per_token']:.4f}")
        for k, name in (("kl_per_token", "KL(P^||P) per token"), ("kl_ar_per_token", "KL(P||P^) per token (AR)")):
            d = f.get(k)
            if d and d.get("measured") is not None:
                lines.append(f"  {name:<23} {d['measured']:.5f} [{d['ci'][0]:.5f}, {d['ci'][1]:.5f}]")
        d = f.get("kl_to_target")
        if d and d.get("measured") is None:
            lines.append(f"  {'KL to target':<23} {d.get('reason', '-')}")
        d = f.get("tv_to_target")
        if d and d.get("measured") is not None:
            lines.append(f"  {'TV to target':<23} {d['measured']:.4f} [{d['ci'][0]:.4f}, {d['ci'][1]:.4f}]  (whole-image "
                         "TV saturates with length; KL per token does not)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- input validation (before any work)
# Kept apart from ``generate`` so new options (e.g. --batch-size) add their checks here.
