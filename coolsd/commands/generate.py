"""`coolsd generate`: speculative decoding of real AR image models with any verifier.

  coolsd generate --model llamagen-tiny --method cool-sd --delta 2 --json
  coolsd generate --model llamagen-tiny --method vanilla --tree eagle25
  coolsd generate --model mnist --draft jacobi --window 16 --method vanilla     (Speculative Jacobi Decoding)

Models come from ``real.registry`` (``--list-models``); methods from ``real.decode.methods``; drafting and method
options are parsed by ``coolsd.options`` (shared with ``coolsd sweep``).
"""
from __future__ import annotations

import json

from coolsd.io import json_safe
from coolsd.options import add_drafting_args, add_gsd_table_arg, add_method_args



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
    """``coolsd generate`` as a pipeline, each stage in its own module, in one direction: the Namespace validated once
    into the frozen ``RunConfig`` (``coolsd.validate.run_config``: every option, file and combination checked before
    any model is built), the models built and the run planned (``generate_checks.build_plan``: the checks that need the
    built models, the mode, the processing, the verifier), then the plan run (``generate_run.execute``: the engine and
    the AR baseline, the records, the summary, the scores, the saved files); returns the JSON-ready result."""
    from coolsd.validate import run_config

    from .generate_checks import build_plan
    from .generate_run import execute

    cfg = run_config(args)
    plan = build_plan(cfg)
    return execute(plan)


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

