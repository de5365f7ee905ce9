"""Method names (as on the command line) -> ``theory.rules`` verifiers on a device, and the processing they imply.
The names, parameters, defaults and ranges live in one registry, ``theory.rules.methods``; this module adds the torch
concerns (the LANTERN neighbour table kept on the model's device, GSD's codebook as numpy). Command-line flags become
registry parameters in ``coolsd.options.method_params`` (namespaced per method).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from theory.rules import methods as registry
from theory.rules.methods import default_lantern_k

from .sampling import Processing

__all__ = ["METHODS", "make_verifier", "method_processing", "default_lantern_k", "neighbors_on"]

METHODS = registry.names()


def neighbors_on(neighbors, device=None):
    """The neighbour table (V, K) as numpy (device None) or as a torch tensor kept on ``device`` (no
    host-to-device copy per round)."""
    if neighbors is None:
        return None
    if isinstance(neighbors, torch.Tensor):
        return neighbors if device is None else neighbors.to(device)
    nb = np.asarray(neighbors)
    return nb if device is None else torch.as_tensor(nb, device=device)


def make_verifier(method: str, L: int, params: dict | None = None, neighbors=None, device=None, embeddings=None, **kw):
    """The ``theory.rules.Verifier`` for a method name (``theory.rules.methods``) with registry parameters ``params``
    and/or ``kw`` (the method's own names: ``k``, ``delta``, ``lambda``, ...; the rest take its defaults). LANTERN
    methods need the codebook neighbour table ``neighbors`` (V, K) (``theory.rules.lantern_neighbors`` /
    ``real.models.vq.codebook_neighbors``); with ``device`` the table is kept there as a torch tensor. GSD methods
    take the codebook vectors ``embeddings`` (V, d) (``real.registry.Bundle.codebook``; their (V, V) closeness table is
    built once, as numpy)."""
    m = registry.get(method)
    nb = neighbors_on(neighbors, device) if m.needs_neighbors else None
    emb = None
    if m.needs_embeddings and embeddings is not None:
        emb = embeddings.detach().cpu().double().numpy() if isinstance(embeddings, torch.Tensor) else embeddings
    return registry.build(method, L, nb, {**(params or {}), **kw}, embeddings=emb)


def method_processing(method: str, processing: Processing) -> Processing:
    """``greedy`` means temperature 0 (one-hot rows) for draft and target; other methods keep ``processing``."""
    return replace(processing, temperature=0.0) if registry.get(method).greedy_rows else processing
