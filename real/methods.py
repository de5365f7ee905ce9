"""Method names (as on the command line) -> ``theory.rules`` verifiers and the processing they imply.

No rule is re-implemented here: every verifier comes from ``theory.rules``' factories.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from theory import rules

from .sampling import Processing

__all__ = ["METHODS", "MethodParams", "make_verifier", "method_processing", "default_lantern_k", "RESAMPLERS",
           "resampler_for"]

METHODS = ("vanilla", "cool-sd", "uniform-rsd", "linear-rsd", "lantern", "lantern++", "typical", "greedy")


@dataclass(frozen=True)
class MethodParams:
    delta: float = 2.0            # Cool-SD relaxation budget (w_1 = delta when mu is None)
    nu: float = 0.7               # Cool-SD decay
    mu: float | None = None       # Cool-SD offset (None: normalise to w_1 = delta)
    c: float = 1.5                # UniformRSD weight
    linear_first: float = 3.0     # linear-rsd w_1
    linear_last: float = 1.0      # linear-rsd w_L
    lantern_k: int | None = None  # neighbourhood size (None: default_lantern_k(V))
    lantern_delta: float = 0.2    # LANTERN absolute mass threshold
    lam: float = 2.0              # LANTERN++ relative threshold lambda
    resampler: str | None = None  # None: the release's (see RESAMPLERS); lantern/lantern++: "lantern" (released),
    #                               "renormalised" (our earlier variant), "optimal" (G*); typical: "argmax", "optimal"
    eps: float = 0.09             # typical acceptance
    alpha: float = 0.3


# ---- resampler names per method (issue 16): the first is the release's default; one mapping, used by the CLI
RESAMPLERS = {"lantern": rules.LANTERN_RESAMPLERS, "lantern++": rules.LANTERN_RESAMPLERS,
              "typical": rules.TYPICAL_RESAMPLERS}


def resampler_for(method: str, resampler: str | None) -> str | None:
    """The resampler name for ``method`` (None: the release's default); ValueError for a name the method lacks."""
    m = method.lower()
    if resampler is None:
        return RESAMPLERS[m][0] if m in RESAMPLERS else None
    if m not in RESAMPLERS:
        raise ValueError(f"--resampler applies to {sorted(RESAMPLERS)}; method {method!r} has a fixed resampler")
    if resampler not in RESAMPLERS[m]:
        raise ValueError(f"--resampler {resampler!r} is not available for {method!r}; choose from {RESAMPLERS[m]}")
    return resampler
# ----


def default_lantern_k(V: int) -> int:
    """LANTERN's k = 1000 neighbours of 16384 codes (about V/16), capped at 1000."""
    return int(min(1000, max(1, V // 16)))


def make_verifier(method: str, L: int, params: MethodParams = MethodParams(), neighbors=None, device=None):
    """The ``theory.rules.Verifier`` for a method name. LANTERN methods need the codebook neighbour
    table ``neighbors`` (V, K) (``theory.rules.lantern_neighbors`` / ``real.vq.codebook_neighbors``);
    with ``device`` the table is kept there as a torch tensor (no host-to-device copy per round)."""
    m = method.lower()
    resampler = resampler_for(m, params.resampler) if m in METHODS else None
    if m == "vanilla":
        return rules.vanilla()
    if m == "cool-sd":
        return rules.cool_sd(params.delta, params.nu, params.mu)
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
        need = k if resampler == "optimal" else k + 1
        if need > K:
            raise ValueError(f"{method}: k={k} needs {need} neighbours per code, the table has {K}")
        if m == "lantern":
            return rules.lantern(nb, k, params.lantern_delta, resample=resampler)
        return rules.lantern_pp(nb, k, params.lam, resample=resampler)
    if m == "typical":
        return rules.typical(params.eps, params.alpha, resample=resampler)
    if m == "greedy":
        return rules.greedy()
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def method_processing(method: str, processing: Processing) -> Processing:
    """``greedy`` means temperature 0 (one-hot rows) for draft and target; other methods keep ``processing``."""
    return replace(processing, temperature=0.0) if method.lower() == "greedy" else processing
