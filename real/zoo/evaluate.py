"""Cross-model quality of a shipped zoo: ``python -m real.zoo.evaluate [--zoo natural256]``.

Measures, with the zoo's shipped VQ and classifier, how the tokenizer's reconstructions of the held-out
images look in classifier space (Frechet distance to the held-out images and class accuracy),
next to the real-vs-real noise floor, and records them under ``"evaluation"`` in the zoo's manifest.
Optionally saves a PNG grid of held-out images above their reconstructions (``--grid PATH``).
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import torch

from theory.rules import lantern_neighbors

from . import classifier, vq, zoos
from .checkpoint import MANIFEST, read_manifest
from .metrics import frechet_distance


def measure(zoo: str = "mnist") -> dict:
    """Figures of the zoo's shipped VQ and classifier on its held-out images: VQ reconstruction MSE, FD and class
    accuracy; the same after swapping every code for its nearest codebook neighbour; FD of 1,000 train images
    and of the two held-out halves; the mean cosine of codebook neighbours."""
    d = zoos.get(zoo).data
    x_ho, y_ho = d.heldout_split()
    x_tr, _ = d.train_split()
    x_ho = d.check_images(x_ho)
    codes = vq.encode(x_ho, zoo=zoo)
    recon = vq.decode(codes, zoo=zoo)
    E = vq.codebook_embeddings(zoo)
    nearest = torch.from_numpy(lantern_neighbors(E.numpy(), 1)[:, 0])  # (V,)
    swapped = vq.decode(nearest[codes], zoo=zoo)
    feats = lambda x: classifier.features(x, zoo=zoo)  # noqa: E731
    acc = lambda x: float((classifier.predict(x, zoo=zoo) == y_ho).double().mean())  # noqa: E731
    f_ho, f_rec = feats(x_ho), feats(recon)
    f_tr = feats(x_tr[:1000])  # train split is in seeded random order
    half = len(f_ho) // 2
    return {
        "vq_recon_heldout_mse": float(((recon - x_ho) ** 2).mean()),
        "fd_vq_recon_vs_heldout": frechet_distance(f_rec, f_ho),
        "fd_train1000_vs_heldout": frechet_distance(f_tr, f_ho),
        "fd_heldout_half_vs_half": frechet_distance(f_ho[:half], f_ho[half:]),
        "class_accuracy_heldout": acc(x_ho),
        "class_accuracy_vq_recon_heldout": acc(recon),
        "codebook_nearest_neighbour_cosine_mean": float((E * E[nearest]).sum(1).mean()),
        "nn_swap_heldout_mse": float(((swapped - x_ho) ** 2).mean()),
        "fd_nn_swap_vs_heldout": frechet_distance(feats(swapped), f_ho),
        "class_accuracy_nn_swap_heldout": acc(swapped),
    }


def image_rows(rows: list[torch.Tensor]) -> "np.ndarray":
    """Rows of images (n, C, S, S) in [-1, 1] -> one (rows * S, n * S, 3) float array in [0, 1] to show."""
    out = []
    for r in rows:
        r = r.float().clamp(-1, 1)
        r = r.expand(-1, 3, -1, -1) if r.shape[1] == 1 else r
        out.append(torch.cat(list(r), 2))                    # (3, S, n S)
    return ((torch.cat(out, 1) + 1) / 2).permute(1, 2, 0).numpy()


def save_grid(path: pathlib.Path, n: int = 20, zoo: str = "mnist") -> None:
    """Rows: held-out images, their VQ reconstructions, |difference| (n columns), three blocks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    z = zoos.get(zoo)
    x = z.data.check_images(z.data.heldout_split()[0][:3 * n])
    r = vq.decode(vq.encode(x, zoo=zoo), zoo=zoo)
    rows = []
    for k in range(3):
        xs, rs = x[k * n:(k + 1) * n], r[k * n:(k + 1) * n]
        rows += [xs, rs, (xs - rs).abs() - 1]
    fig = plt.figure(figsize=(n * 0.6 * z.image_size / 28, 9 * 0.6 * z.image_size / 28))
    plt.imshow(image_rows(rows), vmin=0, vmax=1)
    plt.axis("off")
    plt.title(f"{zoo}: held-out images / VQ reconstructions ({z.side}x{z.side} tokens) / |difference|, three blocks")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    """``python -m real.zoo.evaluate``: print ``measure()``, optionally save the grid PNG, record the figures in
    the manifest unless ``--no-write``."""
    p = argparse.ArgumentParser(prog="python -m real.zoo.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=pathlib.Path, default=None, help="save a reconstruction grid PNG here")
    p.add_argument("--no-write", action="store_true", help="print only, leave the manifest alone")
    p.add_argument("--zoo", choices=sorted(zoos.ZOOS), default="mnist")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = measure(args.zoo)
    for k, v in result.items():
        print(f"  {k}: {v:.5g}")
    if args.grid:
        save_grid(args.grid, zoo=args.zoo)
        print(f"wrote {args.grid}")
    if not args.no_write:
        directory = zoos.get(args.zoo).directory
        manifest = read_manifest(directory)
        command = "python -m real.zoo.evaluate" + (f" --zoo {args.zoo}" if args.zoo != "mnist" else "")
        manifest["evaluation"] = {"command": command, **result}
        (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
