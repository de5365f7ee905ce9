"""Lumina-mGPT-7B-shaped timing check (random weights, bf16, CFG batch of 2) through the transformers
Chameleon adapter (real.adapters.chameleon.ChameleonImageLM). Run through ``scripts/gpu_check.sh --lumina``.

Measured (median of --iters CUDA-synchronised repeats, cache filled with --context image tokens):
  * raw ``model.model`` forward of 1 token with a DynamicCache (transformers alone) and the adapter's
    1-token forward (+ its layout bookkeeping: forced newline insertion, cache accounting);
  * the adapter's verification pass over L + 1 tokens (crossing a row end);
  * an EAGLE-1 drafter step (real.models.eagle layout, hidden 4096, 1 layer) and a layer-skip draft step
    (the target's first --draft-layers layers);
  * theory.verify_chain alone on (L+1, 8192) rows (vanilla, cool-sd);
  * --tokens image tokens by speculative decoding (vanilla, cool-sd; EAGLE draft; and an EAGLE-25 static
    tree, vanilla) and by plain AR
    through the engine: per-round wall time and per-round overhead = round time - (L' draft steps + one
    verification pass), i.e. the engine's and adapter's own work.
Budget on one H200: about 1 minute to build, well under 5 minutes in all with the defaults.
``--cpu-smoke`` runs the same on CPU with the tiny Chameleon config (seconds), to check the script.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time

import numpy as np
import torch
from transformers import DynamicCache

from gpu_check import device_sync, timeit
from real.decode import engine
from real.adapters.chameleon import ChameleonImageLM, lumina_7b_config, lumina_layout, tiny_chameleon
from real.adapters.imagelm_eagle import eagle_for
from real.adapters.imagelm_loading import truncated_hf
from real.decode.methods import make_verifier
from real.protocol import Prompt, left_pad
from real.decode.sampling import Processing
from theory.rules.chain import verify_chain


def build(a, dev, dtype):
    """(model, layout, text id range)."""
    if a.cpu_smoke:
        m, lay, text = tiny_chameleon(0, side=8)
        return m.to(dev, dtype), lay, text
    cfg = lumina_7b_config()
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            m = __import__("transformers").ChameleonForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(old)
    return m.eval(), lumina_layout(a.image_size), (8900, 9000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny Chameleon on CPU (checks the script, not a GPU)")
    ap.add_argument("--image-size", type=int, default=768)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--cfg-scale", type=float, default=3.0)
    ap.add_argument("--top-k", type=int, default=2000)
    ap.add_argument("--context", type=int, default=1176, help="image tokens in the cache for the forward timings")
    ap.add_argument("--tokens", type=int, default=384, help="image tokens generated per engine run (8 rows at 768 px)")
    ap.add_argument("--draft-layers", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.cpu_smoke:
        a.device, a.iters, a.context, a.tokens, a.draft_layers, a.top_k = "cpu", 3, 20, 24, 1, 0
        torch.set_num_threads(1)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check --lumina: no CUDA device visible (use --cpu-smoke to check the script on CPU)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    m, lay, text = build(a, dev, dtype)
    tgt = ChameleonImageLM(m, lay)
    eag = eagle_for(tgt, seed=1)
    skip = ChameleonImageLM(truncated_hf(m, a.draft_layers, "model.layers",
                                         lambda c, n: setattr(c, "num_hidden_layers", n)), lay)
    V, L = tgt.vocab_size, a.L
    n_par = sum(p.numel() for p in m.model.layers.parameters()) + m.lm_head.weight.numel()
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), {dtype}, Chameleon "
          f"{'tiny' if a.cpu_smoke else '7B (Lumina-mGPT shape)'} ({n_par / 1e6:.1f}M decoder+head params), "
          f"{lay.height}x{lay.width} codes + newlines, V={V}, L={L}, CFG batch 2 [built in {time.perf_counter() - t0:.1f}s]")
    res: dict = {"device": str(dev), "dtype": str(dtype), "grid": [lay.height, lay.width], "L": L, "V": V}

    g = torch.Generator(device=dev).manual_seed(0)
    prompt = Prompt(torch.randint(*text, (40,), generator=torch.Generator().manual_seed(0)))
    ctx = torch.randint(0, V, (1, a.context), generator=g, device=dev).expand(2, -1)
    nxt = torch.randint(0, V, (1, L + 1), generator=g, device=dev).expand(2, -1)

    def fwd(model, x, **kw):
        def f():
            model.forward(x, **kw)
            model.rollback(x.shape[1])
        return f

    with torch.no_grad():
        tgt.prefill(prompt, ctx, cfg=True)
        res["adapter_step_ms"] = 1e3 * timeit(fwd(tgt, nxt[:, :1]), dev, a.iters)
        res["target_verify_ms"] = 1e3 * timeit(fwd(tgt, nxt), dev, a.iters)
        # the same step through transformers alone, on its own DynamicCache of the padded CFG pair (mask + positions)
        pr = tgt.prompt(prompt, True)
        pids, real, _ = left_pad([pr.ids, pr.uncond_ids], dev)
        seq = torch.cat([pids, tgt.code_ids[ctx]], 1)
        mask = torch.cat([real.long(), torch.ones(2, ctx.shape[1] + 1, dtype=torch.long, device=dev)], 1)
        pos_all = (mask.cumsum(1) - 1).clamp_min(0)
        kw = "cache" if "cache" in inspect.signature(tgt.backbone.forward).parameters else "past_key_values"
        hc = DynamicCache()
        tgt.backbone(input_ids=seq, attention_mask=mask[:, :-1], position_ids=pos_all[:, :-1], use_cache=True,
                     **{kw: hc})
        ids, pos = tgt.code_ids[nxt[:, :1]], pos_all[:, -1:]

        def raw():
            tgt.backbone(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{kw: hc})
            hc.crop(-1)
        res["hf_step_ms"] = 1e3 * timeit(raw, dev, a.iters)
        skip.prefill(prompt, ctx, cfg=True)
        res["layerskip_step_ms"] = 1e3 * timeit(fwd(skip, nxt[:, :1]), dev, a.iters)
        P = tgt.prefix_len
        eag.start(P, 2)
        feats = torch.randn(2, P - 1 + a.context, tgt.hidden_size, device=dev, dtype=dtype, generator=g)
        toks = torch.zeros(2, P - 1 + a.context, dtype=torch.long, device=dev)
        eag.forward(toks, features=feats)
        res["eagle_step_ms"] = 1e3 * timeit(fwd(eag, nxt[:, :1], features=feats[:, :1]), dev, a.iters)
    print(f"target forward: transformers alone 1 token {res['hf_step_ms']:.2f} ms, adapter 1 token "
          f"{res['adapter_step_ms']:.2f} ms (layout bookkeeping {res['adapter_step_ms'] - res['hf_step_ms']:+.2f} ms), "
          f"{L + 1} tokens {res['target_verify_ms']:.2f} ms; EAGLE draft step {res['eagle_step_ms']:.2f} ms "
          f"(c = {res['eagle_step_ms'] / res['adapter_step_ms']:.3f}), layer-skip ({a.draft_layers} layers) "
          f"{res['layerskip_step_ms']:.2f} ms")

    p = torch.softmax(torch.randn(1, L + 1, V, device=dev, generator=g), -1)
    q = torch.softmax(torch.randn(1, L, V, device=dev, generator=g), -1)
    tok = torch.multinomial(q[0], 1, generator=g).view(1, L)
    ua, us = torch.rand(1, L, device=dev, generator=g), torch.rand(1, device=dev, generator=g)
    res["verify_ms"] = {mm: 1e3 * timeit(lambda: verify_chain(p, q, tok, ua, us, make_verifier(mm, L)).accepted.tolist(),
                                         dev, a.iters) for mm in ("vanilla", "cool-sd")}
    print("verify_chain alone: " + ", ".join(f"{mm} {t:.3f} ms" for mm, t in res["verify_ms"].items()))

    proc = Processing(temperature=1.0, top_k=a.top_k, cfg_scale=a.cfg_scale)
    T = a.tokens
    for mm in ("vanilla", "cool-sd"):
        gen = engine.speculative_generate(tgt, eag, prompt, num_tokens=T, verifier=make_verifier(mm, L), drafting=L,
                                          processing=proc, seed=0)
        s = engine.summarize([gen])
        rounds = gen.rounds
        wall = np.array([r.t_draft + r.t_target + r.t_verify for r in rounds])
        model = np.array([r.drafted * res["eagle_step_ms"] / 1e3 + res["target_verify_ms"] / 1e3 for r in rounds])
        over = float((wall - model).mean() * 1e3)
        res[mm] = {**{k: s[k] for k in ("tokens_per_target_call", "seconds", "tokens_per_second", "verify_share")},
                   "round_ms": float(wall.mean() * 1e3), "overhead_ms": over}
        print(f"engine {mm:8s} (EAGLE, random): {s['tokens_per_target_call']:.2f} tokens/round, {T} tokens in "
              f"{s['seconds']:.2f} s, round {wall.mean() * 1e3:.2f} ms, per-round overhead {over:.2f} ms "
              f"({100 * over / (wall.mean() * 1e3):.1f}%), verify share {100 * s['verify_share']:.2f}%")
    from theory.tree import EAGLE_25, Tree

    gen = engine.speculative_generate(tgt, eag, prompt, num_tokens=T, verifier=make_verifier("vanilla", 5), drafting=Tree(EAGLE_25),
                               processing=proc, seed=0)
    s = engine.summarize([gen])
    wall = np.array([r.t_draft + r.t_target + r.t_verify for r in gen.rounds])
    res["tree_eagle25"] = {**{k: s[k] for k in ("tokens_per_target_call", "seconds", "tokens_per_second", "verify_share")},
                           "round_ms": float(wall.mean() * 1e3)}
    print(f"engine tree eagle25 (vanilla, EAGLE, random): {s['tokens_per_target_call']:.2f} tokens/round, {T} tokens in "
          f"{s['seconds']:.2f} s, round {wall.mean() * 1e3:.2f} ms (draft {1e3 * s['time_draft_s'] / s['rounds']:.2f}, "
          f"target {1e3 * s['time_target_s'] / s['rounds']:.2f}, verify {1e3 * s['time_verify_s'] / s['rounds']:.2f} ms)")
    ar = engine.summarize([engine.ar_generate(tgt, prompt, num_tokens=T, processing=proc, seed=0)])
    res["ar"] = {"seconds": ar["seconds"], "tokens_per_second": ar["tokens_per_second"]}
    print(f"plain AR: {T} tokens in {ar['seconds']:.2f} s ({ar['tokens_per_second']:.1f} tokens/s; a whole "
          f"{lay.height}x{lay.width} image ~{lay.num_tokens / ar['tokens_per_second']:.0f} s); random weights: acceptance is "
          "not representative of trained models")
    print(f"total {time.perf_counter() - t0:.1f}s")
    if a.json:
        print(json.dumps(res))
    device_sync(dev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
