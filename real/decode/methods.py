"""Method names (as on the command line) -> ``theory.rules`` verifiers on a device, and the processing
they imply. The names, parameters, defaults and ranges live in one registry, ``theory.rules.methods``; this
module adds the torch concerns (the LANTERN neighbour table kept on the model's device) and the flat
option set of ``coolsd generate`` (``MethodParams``, generated from the registry's flags).
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import torch

from theory.rules import methods as registry
from theory.rules.methods import default_lantern_k

from .sampling import Processing

__all__ = ["METHODS", "MethodParams", "make_verifier", "method_params", "method_processing", "default_lantern_k",
           "neighbors_on"]

METHODS = registry.names()

# One field per flat option of the registry (delta, nu, mu, c, linear_first, ..., lantern_k, lam, resampler,
# eps, alpha); None = the method's default. Generated, so a parameter added to the registry appears here.
MethodParams = dataclasses.make_dataclass(
    "MethodParams", [(flag, object, dataclasses.field(default=None)) for flag in registry.flags()], frozen=True)
MethodParams.__doc__ = ("Flat method options (``coolsd generate``'s verifier flags, from ``theory.rules.methods.flags``); "
                        "None = the method's default; options of other methods are ignored by ``make_verifier``.")


def method_params(method: str, params=None) -> dict:
    """The registry parameters of ``method`` set in the flat ``params`` (MethodParams; None fields skipped)."""
    m = registry.get(method)
    if params is None:
        return {}
    return {p.name: getattr(params, p.option) for p in m.free if getattr(params, p.option) is not None}


def neighbors_on(neighbors, device=None):
    """The neighbour table (V, K) as numpy (device None) or as a torch tensor kept on ``device`` (no
    host-to-device copy per round)."""
    if neighbors is None:
        return None
    if isinstance(neighbors, torch.Tensor):
        return neighbors if device is None else neighbors.to(device)
    nb = np.asarray(neighbors)
    return nb if device is None else torch.as_tensor(nb, device=device)


def make_verifier(method: str, L: int, params=None, neighbors=None, device=None, embeddings=None, **kw):
    """The ``theory.rules.Verifier`` for a method name (``theory.rules.methods``) from flat options ``params``
    (MethodParams) and/or registry parameters ``kw``. LANTERN methods need the codebook neighbour table
    ``neighbors`` (V, K) (``theory.rules.lantern_neighbors`` / ``real.models.vq.codebook_neighbors``); with
    ``device`` the table is kept there as a torch tensor. GSD methods take the codebook vectors ``embeddings``
    (V, d) (``real.registry.Bundle.codebook``; their (V, V) closeness table is built once, as numpy)."""
    m = registry.get(method)
    nb = neighbors_on(neighbors, device) if m.needs_neighbors else None
    emb = None
    if m.needs_embeddings and embeddings is not None:
        emb = embeddings.detach().cpu().double().numpy() if isinstance(embeddings, torch.Tensor) else embeddings
    return registry.build(method, L, nb, {**method_params(method, params), **kw}, embeddings=emb)


def method_processing(method: str, processing: Processing) -> Processing:
    """``greedy`` means temperature 0 (one-hot rows) for draft and target; other methods keep ``processing``."""
    return replace(processing, temperature=0.0) if registry.get(method).greedy_rows else processing
