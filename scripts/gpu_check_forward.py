"""Forward timing check for a CUDA machine (``bash scripts/gpu_check.sh --forward``): LlamaGen-XL-sized target
and B-sized draft forwards (random weights, bf16, CFG batch of 2), the engine's per-round overhead and the batch
curve. The main check (eager vs compiled, every drafting mode, ops and syncs) is scripts/gpu_check.py.

Measured (median of --iters CUDA-synchronised repeats, cache half full as mid-image):
  * target forward of 1 token (a plain AR step) and of L + 1 tokens (a verification pass);
  * draft forward of 1 token (one drafting step);
  * theory.verify_chain alone on (L+1, 16384) rows for vanilla, cool-sd and lantern (k = 1000);
  * one whole image by speculative decoding and by plain AR through the engine: per-round wall time,
    and the per-round overhead = round time - (L' draft steps + 1 verification forward), i.e. the
    engine's logits processing, sampling, verification, rollback and Python work.
``--cpu-smoke`` runs the same on CPU with the tiny configs (seconds), to check the script itself.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from real.decode import engine
from real.models import llamagen as lg
from real.decode.methods import make_verifier
from real.decode.sampling import Processing
from theory.rules.chain import verify_chain

sys.path.insert(0, __import__("os").path.dirname(__file__))
from gpu_check import device_sync, timeit  # noqa: E402  (scripts/gpu_check.py: one timer for both scripts)




def build(name: str, image_size: int, dev, dtype, seed: int):
    c = lg.config(name, image_size=image_size)
    with torch.device(dev):
        m = lg.LlamaGen(c)
    return m.to(dtype).random_init(seed, std=0.02, output_std=0.1).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny configs on CPU (checks the script, not a GPU)")
    ap.add_argument("--target", default="XL")
    ap.add_argument("--draft", default="B")
    ap.add_argument("--image-size", type=int, default=384)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--cfg-scale", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--images", type=int, default=1, help="whole images generated per method (default 1)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 8, 32],
                    help="batched rounds: images per batch to time (default 1 8 32; none: skip)")
    a = ap.parse_args(argv)
    if a.cpu_smoke:
        a.target, a.draft, a.image_size, a.device, a.iters = "tiny", "tiny-draft", None, "cpu", 3
        torch.set_num_threads(1)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (use --cpu-smoke to check the script on CPU)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    tgt = build(a.target, a.image_size, dev, dtype, 0)
    drf = build(a.draft, a.image_size, dev, dtype, 1)
    T = tgt.config.block_size
    V = tgt.vocab_size
    L = a.L
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), {dtype}, "
          f"target {a.target} ({sum(p.numel() for p in tgt.parameters()) / 1e6:.0f}M), draft {a.draft} "
          f"({sum(p.numel() for p in drf.parameters()) / 1e6:.0f}M), {T} tokens/image, V={V}, L={L}, CFG batch 2 "
          f"[built in {time.perf_counter() - t0:.1f}s]")

    res: dict = {"device": str(dev), "dtype": str(dtype), "target": a.target, "draft": a.draft, "tokens": T, "L": L}
    g = torch.Generator(device=dev).manual_seed(0)
    half = torch.randint(0, V, (1, T // 2), generator=g, device=dev).expand(2, -1)
    one = half[:, :1]
    blk = half[:, : L + 1]

    def fwd(model, x):
        def f():
            model.forward(x)
            model.rollback(x.shape[1])
        return f

    with torch.no_grad():
        tgt.prefill(3, half, cfg=True)
        drf.prefill(3, half, cfg=True)
        res["target_step_ms"] = 1e3 * timeit(fwd(tgt, one), dev, a.iters)
        res["target_verify_ms"] = 1e3 * timeit(fwd(tgt, blk), dev, a.iters)
        res["draft_step_ms"] = 1e3 * timeit(fwd(drf, one), dev, a.iters)
    c = res["draft_step_ms"] / res["target_step_ms"]
    print(f"target forward: 1 token {res['target_step_ms']:.2f} ms, {L + 1} tokens {res['target_verify_ms']:.2f} ms; "
          f"draft forward 1 token {res['draft_step_ms']:.2f} ms (cost ratio c = {c:.3f})")

    # the verifier alone at full vocabulary
    from theory.rules import lantern_neighbors
    from real.models.vq import codebook_neighbors

    cb = torch.nn.functional.normalize(torch.randn(V, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    k = min(1000, V // 16)
    nb = codebook_neighbors(cb.to(dev), k + 1).numpy() if V > 4096 else lantern_neighbors(cb.numpy(), k + 1)
    p = torch.softmax(torch.randn(1, L + 1, V, device=dev, generator=g), -1)
    q = torch.softmax(torch.randn(1, L, V, device=dev, generator=g), -1)
    tok = torch.multinomial(q[0], 1, generator=g).view(1, L)
    ua, us = torch.rand(1, L, device=dev, generator=g), torch.rand(1, device=dev, generator=g)
    res["verify_ms"] = {}
    for m in ("vanilla", "cool-sd", "lantern"):
        v = make_verifier(m, L, {"k": k} if m.startswith("lantern") else None, nb, device=dev)
        res["verify_ms"][m] = 1e3 * timeit(lambda: verify_chain(p, q, tok, ua, us, v).accepted.tolist(), dev, a.iters)
    print("verify_chain alone: " + ", ".join(f"{m} {t:.3f} ms" for m, t in res["verify_ms"].items()))

    # whole images through the engine
    proc = Processing(temperature=1.0, top_k=0, cfg_scale=a.cfg_scale)
    for m in ("vanilla", "cool-sd"):
        v = make_verifier(m, L)
        gens = [engine.speculative_generate(tgt, drf, i, num_tokens=T, verifier=v, drafting=L, processing=proc, seed=i)
                for i in range(a.images)]
        s = engine.summarize(gens)
        rounds = [r for gg in gens for r in gg.rounds]
        wall = np.array([r.t_draft + r.t_target + r.t_verify for r in rounds])
        model = np.array([max(r.drafted, 0) * res["draft_step_ms"] / 1e3 + res["target_verify_ms"] / 1e3 for r in rounds])
        over = (wall - model).mean() * 1e3
        res[m] = {**{kk: s[kk] for kk in ("tokens_per_target_call", "seconds", "tokens_per_second", "verify_share")},
                  "round_ms": float(wall.mean() * 1e3), "overhead_ms": float(over)}
        print(f"engine {m:8s}: {s['tokens_per_target_call']:.2f} tokens/round, {s['seconds']:.2f} s/image, "
              f"round {wall.mean() * 1e3:.2f} ms, per-round overhead {over:.2f} ms ({100 * over / (wall.mean() * 1e3):.1f}%), "
              f"verify share {100 * s['verify_share']:.2f}%")
    ar = engine.summarize([engine.ar_generate(tgt, i, num_tokens=T, processing=proc, seed=i) for i in range(a.images)])
    res["ar"] = {"seconds": ar["seconds"], "tokens_per_second": ar["tokens_per_second"]}
    print(f"plain AR: {ar['seconds']:.2f} s/image ({ar['tokens_per_second']:.1f} tokens/s); speed-up of vanilla SD "
          f"with these random weights {ar['seconds'] / res['vanilla']['seconds']:.2f}x "
          f"(random weights: acceptance is not representative of trained models)")
    if a.batch_sizes:
        res["batched"] = batched(tgt, drf, a.batch_sizes, proc, L, T, dev, a.iters)
    print(f"total {time.perf_counter() - t0:.1f}s")
    if a.json:
        print(json.dumps(res))
    return 0


def batched(tgt, drf, sizes, proc, L: int, T: int, dev, iters: int) -> list:
    """The batch curve: at each batch size B (2B model rows with CFG), the target forward of 1 token (an AR
    step) and of L + 1 tokens (a verification pass), a draft step, and one batch of B images by vanilla
    chain SD and by plain AR through ``real.decode.engine.generate``: images/s, the measured SD/AR speed-up and
    the unit-cost prediction ``theory.markov.image.batch_speedup``."""
    from theory import rules
    from theory.markov.image import batch_speedup

    out = []
    V = tgt.vocab_size
    for B in sizes:
        R = proc.batch * B
        conds = [i % 1000 % tgt.config.num_classes for i in range(B)]
        x = torch.randint(0, V, (R, T // 2), device=dev)
        with torch.no_grad():
            tgt.prefill(conds, x, cfg=proc.cfg)
            drf.prefill(conds, x, cfg=proc.cfg)

            def fwd(model, S):
                def f():
                    model.forward(x[:, :S])
                    model.rollback(S)
                return f

            ar_ms = 1e3 * timeit(fwd(tgt, 1), dev, iters)
            ver_ms = 1e3 * timeit(fwd(tgt, L + 1), dev, iters)
            dr_ms = 1e3 * timeit(fwd(drf, 1), dev, iters)
        kw = dict(num_tokens=T, processing=proc, batch_size=B, seed=B)
        device_sync(dev)
        t0 = time.perf_counter()
        sd = engine.generate(tgt, drf, conds, verifier=rules.vanilla(), drafting=L, **kw)
        device_sync(dev)
        t1 = time.perf_counter()
        engine.generate(tgt, None, conds, **kw)
        device_sync(dev)
        t2 = time.perf_counter()
        rounds = [len(g.rounds) for g in sd]
        pred = batch_speedup(rounds, B, T, ar_ms, L * dr_ms + ver_ms)
        row = {"B": B, "target_step_ms": ar_ms, "target_verify_ms": ver_ms, "draft_step_ms": dr_ms,
               "sd_images_per_s": B / (t1 - t0), "ar_images_per_s": B / (t2 - t1),
               "speedup_measured": (t2 - t1) / (t1 - t0), "speedup_predicted": pred,
               "tokens_per_target_call": engine.summarize(sd)["tokens_per_target_call"]}
        out.append(row)
        print(f"batch {B:3d}: target 1 token {ar_ms:.2f} ms, {L + 1} tokens {ver_ms:.2f} ms, draft {dr_ms:.2f} ms; "
              f"SD {row['sd_images_per_s']:.2f} img/s, AR {row['ar_images_per_s']:.2f} img/s, speed-up measured "
              f"{row['speedup_measured']:.2f}x, predicted {pred:.2f}x")
    return out


if __name__ == "__main__":
    sys.exit(main())
