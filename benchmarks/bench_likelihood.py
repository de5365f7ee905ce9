"""Scoring an image exactly vs generating it with plain AR, on the shipped MNIST models (real.zoo; ``--model
natural256``: the natural-image zoo, 256 tokens, V = 1024, with its shipped EAGLE head or its small draft;
``--model llamagen-16k``: issue 54's real-size check, a random-weight LlamaGen c2i target at the published
vocabulary V = 16,384 and 1,000 classes, 256 tokens (``real.realsize.llamagen_files``: 2 layers, width 64, so
plain AR is as cheap as a target at this vocabulary gets and the ratio is the hardest case: the rows alone cost
about what AR does, both being V-sized heads and softmaxes), layer-skip draft; ``--model llamagen-16k-B``: the same at
LlamaGen-B's published depth (12 layers, width 768), where a plain-AR step costs what it does in practice).

Scoring = teacher-forced rows (``real.decode.score.teacher_forced_rows``: one target prefill, one draft
prefill or the EAGLE drafter's L passes) plus the forward recursion (``theory.likelihood.log_likelihood``) for
one rule; generating = ``real.decode.engine.generate`` with draft=None (plain AR) on the same images' classes, the
same batch size, CFG 2 as the sweep runs. Reported per image and as the ratio score / generate (the issue's
target: <= 1). Generation, the rows and each rule's recursion are timed interleaved (one call of each in turn,
--repeats rounds, after a warm-up), each by its fastest round, in CPU time of this thread at one thread
(``time.thread_time``: at one torch thread the work runs on the calling thread, within 1% of wall time on an idle
core, and time slices lost to other processes on a shared machine do not count; wall time at more threads).

  python benchmarks/bench_likelihood.py [--images 50] [--repeats 3] [--threads 1] [--json [FILE]] [--short]
                                        [--model mnist|natural256|llamagen-16k[-B]] [--drafts eagle small]

``--short``: 7 repeats of 20 images (llamagen-16k: 3 of 4; -B: 2 of 2), cool-sd only (for benchmarks/run_all.py); ``--json``: one JSON object
on stdout, ``--json FILE``: the same object written to FILE with the "ratios" benchmarks/run_all.py reads.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _timing import interleaved_best, single_thread_clock, write_ratios  # noqa: E402  (benchmarks/_timing.py)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import theory.rules.methods as tm  # noqa: E402
from real.decode.engine import generate  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.decode.score import teacher_forced_rows  # noqa: E402
from real.registry import build  # noqa: E402
from theory.likelihood import log_likelihood  # noqa: E402

# report name -> (method, parameters); LANTERN++ with its released resampler and with G* (T5)
RULES = {"cool-sd": ("cool-sd", {"delta": 4}), "lantern++": ("lantern++", {"lambda": 2}),
         "lantern++G*": ("lantern++", {"lambda": 2, "resampler": "optimal"})}


REALSIZE = "llamagen-16k"
REALSIZE_SIZES = {REALSIZE: "shallow", REALSIZE + "-B": "B"}     # --model -> real.realsize.llamagen_files size


def _build(model: str, draft: str, images: int):
    """The bundle: a registered model, or (``REALSIZE``) the random-weight LlamaGen at V = 16,384 and its VQ-16-shaped
    codebook (LANTERN's neighbour table) written once to a cache folder (``real.realsize.llamagen_files``)."""
    if model not in REALSIZE_SIZES:
        return build(model, draft=draft, num_images=images, seed=0)
    import tempfile

    from real.realsize import llamagen_files

    folder = os.path.join(tempfile.gettempdir(), "coolsd_bench_realsize")
    os.makedirs(folder, exist_ok=True)
    args = llamagen_files(folder, 256, size=REALSIZE_SIZES[model])
    opt = dict(zip(args[::2], args[1::2]))
    return build("llamagen", draft=draft, num_images=images, seed=0, target_ckpt=opt["--target-ckpt"],
                 target_size=opt["--target-size"], image_size=int(opt["--image-size"]), vq_ckpt=opt["--vq-ckpt"],
                 vq_size=opt["--vq-size"])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                    help="JSON on stdout, or (with FILE) to FILE with run_all.py's ratios")
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--model", default="mnist", choices=("mnist", "natural256", *REALSIZE_SIZES))
    ap.add_argument("--drafts", nargs="+", default=None, choices=("eagle", "small", "layerskip"),
                    help="default: eagle small (layerskip for llamagen-16k)")
    a = ap.parse_args(argv)
    a.drafts = a.drafts or (["layerskip"] if a.model in REALSIZE_SIZES else ["eagle", "small"])
    if a.model in REALSIZE_SIZES and a.drafts != ["layerskip"]:
        raise SystemExit(f"bench_likelihood: --model {a.model} has the layer-skip draft only")
    if a.short:      # llamagen-16k: 4 images x 3 repeats (about 0.5 s of work per image and repeat)
        a.images, a.repeats = {REALSIZE: (4, 3), REALSIZE + "-B": (2, 2)}.get(a.model, (20, 7))
    if a.images < 1 or a.repeats < 1 or a.threads < 1 or a.L < 1:
        raise SystemExit("bench_likelihood: --images, --repeats, --threads and --L must be >= 1")
    torch.set_num_threads(a.threads)
    proc = Processing(cfg_scale=2.0)
    out = {"model": a.model, "images": a.images, "batch_size": a.images, "L": a.L, "threads": a.threads, "results": []}
    rules = {"cool-sd": RULES["cool-sd"]} if a.short else RULES
    clock = single_thread_clock()
    for draft in a.drafts:
        b = _build(a.model, draft, a.images)
        gen = lambda: generate(b.target, None, b.conds, num_tokens=b.num_tokens, processing=proc, seed=1,  # noqa: E731
                               batch_size=a.images)
        tok = torch.stack([g.tokens for g in gen()])                  # also the warm-up
        rows_fn = lambda: teacher_forced_rows(b.target, b.draft, b.conds, tok, L=a.L, processing=proc)  # noqa: E731
        rows = rows_fn()
        p, q, x = rows.p.numpy(), rows.q.numpy(), tok.numpy()
        nb = np.asarray(b.neighbors)
        rec = {name: lambda v=tm.build(method, a.L, nb, params): log_likelihood(p, q, x, v, a.L, convention=rows.convention)
               for name, (method, params) in rules.items()}
        best = interleaved_best({"gen": gen, "rows": rows_fn, **{("rec", k): f for k, f in rec.items()}}, a.repeats,
                                clock=clock)
        t_gen, t_rows = best["gen"], best["rows"]
        for name in rules:
            t_rec = best["rec", name]
            out["results"].append({"draft": draft, "rule": name, "generate_ar_s_per_image": t_gen / a.images,
                                   "rows_s_per_image": t_rows / a.images, "recursion_s_per_image": t_rec / a.images,
                                   "ratio": (t_rows + t_rec) / t_gen})
    if a.json not in (None, "-"):
        tag = "" if a.model == "mnist" else f"{a.model}_"
        write_ratios(a.json, {f"likelihood_{tag}{r['rule']}_{r['draft']}_score_over_generate": {
            "value": r["ratio"], "better": "lower",
            "what": f"s per image, scoring ({r['draft']} draft rows + {r['rule']} recursion) / plain AR generation"
                    + ("" if a.model == "mnist" else f" ({a.model})")}
            for r in out["results"]}, extra=out)
    if a.json == "-":
        print(json.dumps(out))
    else:
        print(f"{a.model}: {a.images} images per batch, CFG 2, L = {a.L}, {a.threads} thread(s); per image:")
        print(f"{'draft':<7} {'rule':<11} {'AR generate':>12} {'rows':>9} {'recursion':>10} {'score/AR':>9}")
        for r in out["results"]:
            print(f"{r['draft']:<7} {r['rule']:<11} {r['generate_ar_s_per_image'] * 1e3:9.2f} ms "
                  f"{r['rows_s_per_image'] * 1e3:6.2f} ms {r['recursion_s_per_image'] * 1e3:7.2f} ms {r['ratio']:9.2f}")
    return out


if __name__ == "__main__":
    main()
