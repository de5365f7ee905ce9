"""Method names (as on the command line) -> ``theory.rules`` verifiers and the processing they imply.

No rule is re-implemented here: every verifier comes from ``theory.rules``' factories.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from theory import rules

from .sampling import Processing

__all__ = ["METHODS", "MethodParams", "make_verifier", "method_processing", "default_lantern_k"]

METHODS = ("vanilla", "cool-sd", "uniform-rsd", "linear-rsd", "lantern", "lantern++", "typical", "greedy", "scaled")


@dataclass(frozen=True)
class MethodParams:
    delta: float = 2.0            # Cool-SD relaxation budget (w_1 = delta when mu is None)
    nu: float = 0.7               # Cool-SD decay
    mu: float | None = None       # Cool-SD explicit offset mu (None: the normalisation ``norm``)
    norm: str | None = None       # Cool-SD normalisation (None: theory.rules.COOL_SD_NORM)
    c: float = 1.5                # UniformRSD weight
    linear_first: float = 3.0     # linear-rsd w_1
    linear_last: float = 1.0      # linear-rsd w_L
    lantern_k: int | None = None  # neighbourhood size (None: default_lantern_k(V))
    lantern_delta: float = 0.2    # LANTERN absolute mass threshold
    lam: float = 2.0              # LANTERN++ relative threshold lambda
    resampler: str = "lantern"    # LANTERN/LANTERN++ resampling: their own ("lantern") or "optimal" (G*)
    eps: float = 0.09             # typical acceptance
    alpha: float = 0.3
    weights: tuple | None = None  # scaled: explicit weights w_1..w_L (e.g. from ``coolsd tune``)


def default_lantern_k(V: int) -> int:
    """LANTERN's k = 1000 neighbours of 16384 codes (about V/16), capped at 1000."""
    return int(min(1000, max(1, V // 16)))


def make_verifier(method: str, L: int, params: MethodParams = MethodParams(), neighbors=None, device=None):
    """The ``theory.rules.Verifier`` for a method name. LANTERN methods need the codebook neighbour
    table ``neighbors`` (V, K) (``theory.rules.lantern_neighbors`` / ``real.vq.codebook_neighbors``);
    with ``device`` the table is kept there as a torch tensor (no host-to-device copy per round)."""
    m = method.lower()
    if m == "vanilla":
        return rules.vanilla()
    if m == "cool-sd":
        return rules.cool_sd(params.delta, params.nu, params.mu, norm=params.norm, L=L)
    if m == "uniform-rsd":
        return rules.uniform_rsd(params.c)
    if m == "linear-rsd":
        return rules.linear_rsd(params.linear_first, params.linear_last, L)
    if m in ("lantern", "lantern++"):
        if neighbors is None:
            raise ValueError(f"method {method!r} needs a codebook neighbour table (the model has no VQ codebook here)")
        nb = np.asarray(neighbors) if device is None else torch.as_tensor(np.asarray(neighbors), device=device)
        V, K = nb.shape
        k = params.lantern_k if params.lantern_k is not None else default_lantern_k(V)
        need = k + 1 if params.resampler == "lantern" else k
        if need > K:
            raise ValueError(f"{method}: k={k} needs {need} neighbours per code, the table has {K}")
        if m == "lantern":
            return rules.lantern(nb, k, params.lantern_delta, resample=params.resampler)
        return rules.lantern_pp(nb, k, params.lam, resample=params.resampler)
    if m == "typical":
        return rules.typical(params.eps, params.alpha)
    if m == "greedy":
        return rules.greedy()
    if m == "scaled":   # ---- the tuned schedule of ``coolsd tune`` (issue 15): explicit weights, G*
        if params.weights is None:
            raise ValueError("method 'scaled' needs weights (--weights schedule.json or a list like 3,1.2,1,1)")
        if len(params.weights) != L:
            raise ValueError(f"method 'scaled': {len(params.weights)} weights given for draft length L={L}")
        return rules.scaled(rules.Explicit(params.weights))
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def method_processing(method: str, processing: Processing) -> Processing:
    """``greedy`` means temperature 0 (one-hot rows) for draft and target; other methods keep ``processing``."""
    return replace(processing, temperature=0.0) if method.lower() == "greedy" else processing
