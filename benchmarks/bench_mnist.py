"""Unit costs of the shipped MNIST models (real.zoo) on this machine, as ratios to the target's AR step.

Times (median of --repeats, after warm-up) with CFG (batch 2, as the demo runs): the target's AR step
(one-token forward + processing + sampling, through ``real.decode.engine.ar_generate``, per token), the target's
verification pass over L + 1 = 5 tokens and over the 11 nodes of the demo's static tree (tree mask), a
step of the independent 2-layer draft and of the EAGLE-1 drafter, and ``verify_chain`` with vanilla and
LANTERN++ rows at V = 512. A speculative round pays off when
  E[tau + 1] > (L x draft step + verification pass + verifier) / AR step.

  python benchmarks/bench_mnist.py [--repeats 200] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _timing import median_time  # noqa: E402  (benchmarks/_timing.py)

import torch  # noqa: E402

from real.decode import engine  # noqa: E402
from real.decode.sampling import Processing, sample  # noqa: E402
from real.zoo import gpt, vq  # noqa: E402
from coolsd.studies.demo.settings import SMALL_TREE  # noqa: E402
from theory import rules  # noqa: E402
from theory.tree import Tree  # noqa: E402
from theory.rules.chain import verify_chain  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, draft = gpt.load_target(), gpt.load_draft()
    eagle = gpt.load_eagle(target)
    proc = Processing(cfg_scale=2.0)
    gens = [engine.ar_generate(target, c % 10, num_tokens=49, processing=proc, seed=c) for c in range(max(4, args.repeats // 20))]
    ar_step = sum(g.seconds for g in gens) / sum(g.tokens.numel() for g in gens)
    x5 = torch.zeros(2, 5, dtype=torch.long)
    x1 = torch.zeros(2, 1, dtype=torch.long)
    tree = Tree(SMALL_TREE)
    xt = torch.zeros(2, tree.n_nodes + 1, dtype=torch.long)
    mask = torch.as_tensor(tree.attention_mask)

    def prefilled(m, n=20):
        m.prefill(3, torch.zeros(2, n, dtype=torch.long), cfg=True)

    prefilled(target)

    def verify5():
        target.forward(x5)
        target.rollback(5)

    def verify_tree_pass():
        target.forward(xt, position_ids=target.cache_len + torch.as_tensor(tree.node_depth), attn_mask=mask)
        target.rollback(tree.n_nodes + 1)

    t5 = median_time(verify5, args.repeats, warmup=5)
    tt = median_time(verify_tree_pass, args.repeats, warmup=5)
    prefilled(draft)

    def draft_step():
        o = draft.forward(x1)
        sample(proc(o.logits[:, -1]), torch.rand(o.logits.shape[0] // proc.batch))
        draft.rollback(1)

    td = median_time(draft_step, args.repeats, warmup=5)
    eagle.start(1, 2)
    feats = torch.zeros(2, 20, target.config.dim)
    eagle.forward(torch.zeros(2, 20, dtype=torch.long), features=feats)
    f1 = torch.zeros(2, 1, target.config.dim)

    def eagle_step():
        o = eagle.forward(x1, features=f1)
        sample(proc(o.logits[:, -1]), torch.rand(o.logits.shape[0] // proc.batch))
        eagle.rollback(1)

    te = median_time(eagle_step, args.repeats, warmup=5)
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, 5, 512, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(1, 4, 512, generator=g) * 3, -1)
    tok = torch.randint(0, 512, (1, 4), generator=g)
    u, us = torch.rand(1, 4, generator=g), torch.rand(1, generator=g)
    nb = torch.as_tensor(rules.lantern_neighbors(vq.codebook_embeddings().numpy(), 33))
    tv = median_time(lambda: verify_chain(p, q, tok, u, us, rules.vanilla()), args.repeats, warmup=5)
    tl = median_time(lambda: verify_chain(p, q, tok, u, us, rules.lantern_pp(nb, 32, 2.0)), args.repeats, warmup=5)
    print(f"MNIST zoo unit costs, {args.threads} thread(s), CFG 2 (batch 2); ratios to the target's AR step")
    rows = [("target AR step (engine, per token)", ar_step), ("target verification pass, 5 tokens", t5),
            (f"target verification pass, tree of {tree.n_nodes} nodes", tt), ("small draft step (2 layers)", td),
            ("EAGLE-1 drafter step", te), ("verify_chain vanilla, L = 4", tv), ("verify_chain LANTERN++, L = 4", tl)]
    for name, t in rows:
        print(f"  {name:42s} {t * 1e3:7.3f} ms   x{t / ar_step:6.3f}")
    L = 4
    need = (L * td + t5 + tv) / ar_step
    print(f"break-even tokens per target call for a chain round (L = {L}, small draft): {need:.2f}")


if __name__ == "__main__":
    main()
