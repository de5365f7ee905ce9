"""The CPU kernel choices of ``real.nn.layers`` measured on this machine: dense layers (``F.linear``, i.e. torch's BLAS,
against oneDNN with the weight unpacked and packed once, as ``real.nn.layers.linear`` does) and attention
(``scaled_dot_product_attention`` against the three operations written out, as ``real.nn.layers.attend`` picks).

Dense layers are timed as a forward uses them: 30 different weights (in x out as in the tiny LlamaGen of
bench_engine: 256 -> 704/768) cycled, so they come from cache levels past L2 as in a real forward, at the row
counts of the engine (2-8 rows: batch-1 drafting, 52: a 25-node tree with CFG, 400: a batched round). Times are
per weight; ratios < 1 mean faster than ``F.linear``. Attention: one call at the shapes of the engine (B rows x 4
heads, S queries over K keys, a boolean mask).

  python benchmarks/bench_kernels.py [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from real.nn import layers  # noqa: E402


def _time(f, reps: int) -> float:
    for _ in range(3):
        f()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps


def dense(rows_list=(2, 8, 52, 400)) -> None:
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(704 if i % 3 else 768, 256, generator=g) for i in range(30)]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
    lp = torch.ops.mkldnn._linear_pointwise
    print(f"dense layers: 30 weights (704-768 x 256) cycled, {torch.get_num_threads()} thread(s); us per weight "
          "(ratio to F.linear)")
    print(f"{'rows':>5s} {'F.linear':>9s} {'oneDNN':>16s} {'oneDNN packed':>16s}  MACs/weight")
    for M in rows_list:
        x = torch.randn(M, 256, generator=g)
        reps = max(3, 3000 // M)
        a = _time(lambda: [F.linear(x, w) for w in ws], reps) / 30 * 1e6
        b = _time(lambda: [lp(x, w, None, "none", [], "") for w in ws], reps) / 30 * 1e6
        c = _time(lambda: [lp(x, w, None, "none", [], "") for w in packed], reps) / 30 * 1e6
        print(f"{M:5d} {a:9.1f} {b:9.1f} ({b / a:.2f}) {c:9.1f} ({c / a:.2f})  {M * 256 * 736:,}")
    print(f"(real.nn.layers.linear packs Parameters for oneDNN above {layers.ONEDNN_MIN_WEIGHT:,} weight entries or "
          f"from {layers.ONEDNN_MIN_MACS:,} multiply-adds)")


def attention() -> None:
    g = torch.Generator().manual_seed(1)
    print("\nattention: us per call (ratio fused / written out)")
    print(f"{'B':>4s} {'H':>2s} {'S':>3s} {'K':>4s} {'written out':>12s} {'fused':>8s}")
    for B, S, K in ((2, 1, 250), (2, 4, 230), (2, 26, 230), (16, 26, 230), (8, 1, 200), (32, 1, 200), (64, 1, 200)):
        q, k, v = (torch.randn(B, 4, n, 64, generator=g) for n in (S, K, K))
        mask = torch.rand(B, 1, S, K, generator=g) > 0.2
        mask[..., -1] = True

        def written():
            a = (q @ k.transpose(-1, -2)) * 0.125
            return a.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        a = _time(written, 300) * 1e6
        b = _time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), 300) * 1e6
        print(f"{B:4d} {4:2d} {S:3d} {K:4d} {a:12.1f} {b:8.1f} ({b / a:.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    if a.threads < 1:
        ap.error("--threads must be >= 1")
    torch.set_num_threads(a.threads)
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        raise SystemExit("this torch has no oneDNN linear ops (built without MKLDNN): nothing to compare")
    dense()
    attention()


if __name__ == "__main__":
    main()
