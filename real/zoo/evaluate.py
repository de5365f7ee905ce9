"""Cross-model quality of the shipped zoo: ``python -m real.zoo.evaluate``.

Measures, with the shipped VQ and classifier, how the tokenizer's reconstructions of the held-out
digits look in classifier space (Frechet distance to the held-out digits and class accuracy),
next to the real-vs-real noise floor, and records them under ``"evaluation"`` in the manifest.
Optionally saves a PNG grid of held-out digits above their reconstructions (``--grid PATH``).
"""
from __future__ import annotations

import argparse
import json
import pathlib

import torch

from theory.rules import lantern_neighbors

from . import classifier, data, vq
from .checkpoint import CHECKPOINTS, MANIFEST, read_manifest
from .metrics import frechet_distance


def measure() -> dict:
    """Figures of the shipped VQ and classifier on the held-out digits: VQ reconstruction MSE, FD and class
    accuracy; the same after swapping every code for its nearest codebook neighbour; FD of 1,000 train digits
    and of the two held-out halves; the mean cosine of codebook neighbours."""
    x_ho, y_ho = data.heldout_split()
    x_tr, _ = data.train_split()
    codes = vq.encode(x_ho)
    recon = vq.decode(codes)
    E = vq.codebook_embeddings()
    nearest = torch.from_numpy(lantern_neighbors(E.numpy(), 1)[:, 0])  # (V,)
    swapped = vq.decode(nearest[codes])
    f_ho, f_rec = classifier.features(x_ho), classifier.features(recon)
    f_tr = classifier.features(x_tr[:1000])  # train split is in seeded random order
    return {
        "vq_recon_heldout_mse": float(((recon - x_ho) ** 2).mean()),
        "fd_vq_recon_vs_heldout": frechet_distance(f_rec, f_ho),
        "fd_train1000_vs_heldout": frechet_distance(f_tr, f_ho),
        "fd_heldout_half_vs_half": frechet_distance(f_ho[:500], f_ho[500:]),
        "class_accuracy_heldout": float((classifier.predict(x_ho) == y_ho).double().mean()),
        "class_accuracy_vq_recon_heldout": float((classifier.predict(recon) == y_ho).double().mean()),
        "codebook_nearest_neighbour_cosine_mean": float((E * E[nearest]).sum(1).mean()),
        "nn_swap_heldout_mse": float(((swapped - x_ho) ** 2).mean()),
        "fd_nn_swap_vs_heldout": frechet_distance(classifier.features(swapped), f_ho),
        "class_accuracy_nn_swap_heldout": float((classifier.predict(swapped) == y_ho).double().mean()),
    }


def save_grid(path: pathlib.Path, n: int = 20) -> None:
    """Rows: held-out digits, their VQ reconstructions, |difference| (n columns)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = data.heldout_split()[0][:3 * n]
    r = vq.decode(vq.encode(x))
    rows = []
    for k in range(3):
        xs, rs = x[k * n:(k + 1) * n, 0], r[k * n:(k + 1) * n, 0]
        rows += [torch.cat(list(xs), 1), torch.cat(list(rs), 1), torch.cat(list((xs - rs).abs() - 1), 1)]
    img = torch.cat(rows, 0).numpy()
    fig = plt.figure(figsize=(n * 0.6, 9 * 0.6))
    plt.imshow(img, cmap="gray", vmin=-1, vmax=1)
    plt.axis("off")
    plt.title("held-out digits / VQ reconstructions (7x7 tokens) / |difference|, three blocks")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    """``python -m real.zoo.evaluate``: print ``measure()``, optionally save the grid PNG, record the figures in
    the manifest unless ``--no-write``."""
    p = argparse.ArgumentParser(prog="python -m real.zoo.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=pathlib.Path, default=None, help="save a reconstruction grid PNG here")
    p.add_argument("--no-write", action="store_true", help="print only, leave the manifest alone")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = measure()
    for k, v in result.items():
        print(f"  {k}: {v:.5g}")
    if args.grid:
        save_grid(args.grid)
        print(f"wrote {args.grid}")
    if not args.no_write:
        manifest = read_manifest()
        manifest["evaluation"] = {"command": "python -m real.zoo.evaluate", **result}
        (CHECKPOINTS / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
