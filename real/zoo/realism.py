"""How ambiguous a zoo target's rows are, on real and on generated images: ``python -m real.zoo.realism``.

For each zoo (``--zoos mnist natural256``): the target's processed rows (CFG at the model's default scale 2,
temperature 1, no top-k: the rows the sampler draws from) are read teacher-forced along (a) held-out images'
codes and (b) the target's own plain-AR samples. Per row: the entropy (nats) and the top-1 probability; reported
as means, quantiles and the share of rows with top-1 above 0.5. Also: vanilla speculative sampling with the
small draft on a chain of L = 4 (acceptance rate and tokens per target call), and the Frechet distance (in the
zoo classifier's feature space) of the samples to the held-out images, against the held-out half-vs-half floor.
Writes ``report.json``, ``realism.md`` and a sample grid ``samples.png`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
import torch

from . import classifier, gpt, vq, zoos
from .metrics import frechet_distance

CFG = 2.0


@torch.no_grad()
def row_stats(target, labels: torch.Tensor, codes: torch.Tensor, cfg: float = CFG, batch_size: int = 100) -> dict:
    """Entropy and top-1 probability of the target's CFG rows (temperature 1) teacher-forced along codes (N, T)."""
    null = torch.full_like(labels, target.cls_embedding.embedding_table.num_embeddings - 1)
    ent, top = [], []
    for lb, nb, cb in zip(labels.split(batch_size), null.split(batch_size), codes.split(batch_size)):
        lc, lu = gpt.train_logits(target, lb, cb), gpt.train_logits(target, nb, cb)
        logp = torch.log_softmax((lu + cfg * (lc - lu)).double(), -1)
        p = logp.exp()
        ent.append(-(p * logp).sum(-1).flatten())
        top.append(p.max(-1).values.flatten())
    ent, top = torch.cat(ent).numpy(), torch.cat(top).numpy()
    q = [0.1, 0.25, 0.5, 0.75, 0.9]
    return {"rows": int(ent.size), "entropy_mean": float(ent.mean()),
            "entropy_quantiles": dict(zip(map(str, q), np.quantile(ent, q).tolist())),
            "top1_mean": float(top.mean()), "top1_quantiles": dict(zip(map(str, q), np.quantile(top, q).tolist())),
            "share_top1_above_0.5": float((top > 0.5).mean())}


def measure(zoo: str, n_samples: int, n_heldout: int, n_spec: int, seed: int = 0,
            n_eagle: int = 0) -> tuple[dict, torch.Tensor]:
    """The figures of one zoo (see the module docstring) and its samples' codes (n_samples, T)."""
    from real.decode import engine
    from real.decode.sampling import Processing
    from theory import rules

    z = zoos.get(zoo)
    target, draft = gpt.load_target(zoo), gpt.load_draft(zoo)
    proc = Processing(cfg_scale=CFG)
    ho_codes, ho_labels = gpt.heldout_tokens(zoo)
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(ho_labels), generator=g)[:n_heldout]
    labels = torch.arange(n_samples) % z.num_classes
    t0, c0 = time.perf_counter(), time.process_time()
    gens = engine.generate(target, None, labels.tolist(), num_tokens=z.tokens, processing=proc, seed=seed,
                           batch_size=min(n_samples, 250))
    ar_wall, ar_cpu = time.perf_counter() - t0, time.process_time() - c0
    samples = torch.stack([x.tokens for x in gens])
    spec = engine.summarize(engine.generate(target, draft, labels[:n_spec].tolist(), num_tokens=z.tokens,
                                            verifier=rules.vanilla(), drafting=4, processing=proc, seed=seed + 1,
                                            batch_size=min(n_spec, 100)))
    eagle = {}
    if n_eagle:
        from real.decode.modes import StaticTree
        from theory.tree.shapes import parse_tree

        d = gpt.load_eagle(target, zoo)
        for name, drafting in (("chain_L4", 4), ("eagle25_topk", StaticTree(parse_tree("eagle25", 4), "topk"))):
            s = engine.summarize(engine.generate(target, d, labels[:n_eagle].tolist(), num_tokens=z.tokens,
                                                 verifier=rules.vanilla(), drafting=drafting, processing=proc,
                                                 seed=seed + 2, batch_size=min(n_eagle, 100)))
            eagle[name] = {k: s[k] for k in ("images", "tokens_per_target_call", "tokens_per_target_call_se",
                                             "acceptance_rate") if k in s}
    x_ho = z.data.check_images(z.data.heldout_split()[0])
    f_ho = classifier.features(x_ho, zoo=zoo)
    f_s = classifier.features(vq.decode(samples, zoo=zoo), zoo=zoo)
    half = len(f_ho) // 2
    return {
        "zoo": zoo, "tokens_per_image": z.tokens, "vocab": z.vocab, "cfg_scale": CFG,
        "rows_heldout": row_stats(target, ho_labels[pick], ho_codes[pick]),
        "rows_samples": row_stats(target, labels, samples),
        "plain_ar": {"images": n_samples, "wall_s": ar_wall, "cpu_s": ar_cpu},
        "vanilla_chain_L4_small_draft": {k: spec[k] for k in ("images", "tokens_per_target_call",
                                                                 "tokens_per_target_call_se", "acceptance_rate")
                                         if k in spec},
        "vanilla_eagle": eagle,
        "fd_samples_vs_heldout": frechet_distance(f_s, f_ho),
        "fd_heldout_half_vs_half": frechet_distance(f_ho[:half], f_ho[half:]),
        "samples_fd_n": n_samples,
    }, samples


def save_samples(path: pathlib.Path, zoo: str, samples: torch.Tensor, per_row: int = 16) -> None:
    """A grid PNG of decoded samples (class k in column k mod per_row)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .evaluate import image_rows

    imgs = vq.decode(samples[: (len(samples) // per_row) * per_row][:4 * per_row], zoo=zoo)
    rows = list(imgs.split(per_row))
    fig = plt.figure(figsize=(per_row * 0.8, len(rows) * 0.8))
    plt.imshow(image_rows(rows), vmin=0, vmax=1)
    plt.axis("off")
    plt.title(f"{zoo}: plain-AR samples of the shipped target (CFG {CFG}), column = class")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def markdown(reports: list[dict], command: str) -> str:
    """The side-by-side table of ``reports`` (one per zoo)."""
    names = [r["zoo"] for r in reports]
    lines = ["# Realism: how ambiguous are the target's rows?", "", f"Command: `{command}`", "",
             "| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def row(label, f):
        lines.append(f"| {label} | " + " | ".join(f(r) for r in reports) + " |")

    row("tokens per image / V", lambda r: f"{r['tokens_per_image']} / {r['vocab']}")
    for part, title in (("rows_samples", "own samples"), ("rows_heldout", "held-out images")):
        row(f"mean row entropy, nats ({title})", lambda r: f"{r[part]['entropy_mean']:.3f}")
        row(f"median row entropy ({title})", lambda r: f"{r[part]['entropy_quantiles']['0.5']:.3f}")
        row(f"mean top-1 probability ({title})", lambda r: f"{r[part]['top1_mean']:.3f}")
        row(f"share of rows with top-1 > 0.5 ({title})", lambda r: f"{r[part]['share_top1_above_0.5']:.3f}")
    row("vanilla chain L = 4 (small draft): tokens per call",
        lambda r: f"{r['vanilla_chain_L4_small_draft']['tokens_per_target_call']:.3f} +- "
                  f"{r['vanilla_chain_L4_small_draft']['tokens_per_target_call_se']:.3f}")
    row("vanilla chain L = 4: acceptance rate",
        lambda r: f"{r['vanilla_chain_L4_small_draft'].get('acceptance_rate', float('nan')):.3f}")
    for key, title in (("chain_L4", "EAGLE-1 chain L = 4"), ("eagle25_topk", "EAGLE-1 25-node static tree (top-k)")):
        row(f"vanilla, {title}: tokens per call",
            lambda r: (f"{r['vanilla_eagle'][key]['tokens_per_target_call']:.3f} +- "
                       f"{r['vanilla_eagle'][key]['tokens_per_target_call_se']:.3f}") if key in r.get("vanilla_eagle", {})
            else "not run")
        row(f"vanilla, {title}: acceptance rate",
            lambda r: f"{r['vanilla_eagle'][key].get('acceptance_rate', float('nan')):.3f}"
            if key in r.get("vanilla_eagle", {}) else "not run")
    row("FD samples vs held-out (classifier space)", lambda r: f"{r['fd_samples_vs_heldout']:.2f} (n = {r['samples_fd_n']})")
    row("FD held-out half vs half (floor)", lambda r: f"{r['fd_heldout_half_vs_half']:.2f}")
    row("plain AR: images, wall s, CPU s", lambda r: f"{r['plain_ar']['images']}, {r['plain_ar']['wall_s']:.0f}, "
                                                   f"{r['plain_ar']['cpu_s']:.0f}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    """Measure the zoos, write report.json, realism.md and samples PNGs under --out."""
    p = argparse.ArgumentParser(prog="python -m real.zoo.realism", description=__doc__.splitlines()[0])
    p.add_argument("--zoos", nargs="+", default=["mnist", "natural256"], choices=sorted(zoos.ZOOS))
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--heldout", type=int, default=500)
    p.add_argument("--spec-images", type=int, default=50)
    p.add_argument("--eagle-images", type=int, default=0, help="images per EAGLE-1 run (chain L = 4, eagle25 tree)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs/results/natural256"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    reports = []
    for zoo in args.zoos:
        r, samples = measure(zoo, args.samples, args.heldout, args.spec_images, n_eagle=args.eagle_images)
        save_samples(args.out / f"samples_{zoo}.png", zoo, samples)
        reports.append(r)
        print(json.dumps(r, indent=1), flush=True)
    command = "python -m real.zoo.realism " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    wall = time.perf_counter() - t0
    (args.out / "report.json").write_text(json.dumps({"command": command, "wall_clock_s": wall,
                                                      "reports": reports}, indent=1) + "\n")
    (args.out / "realism.md").write_text(markdown(reports, command) + f"\nWall clock: {wall:.0f} s.\n")


if __name__ == "__main__":
    main()
