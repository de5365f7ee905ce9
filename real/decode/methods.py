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

from ..nn.devpath import host_path
from .embeddings import GSD_TABLES, gsd_vectors, input_embedding_rows
from .sampling import Processing

__all__ = ["METHODS", "make_verifier", "resolved_verifier", "resolved_verifiers", "method_processing", "default_lantern_k", "gsd_vectors",
           "input_embedding_rows", "GSD_TABLES", "needed_width"]

METHODS = registry.names()


def make_verifier(method: str, L: int, params: dict | None = None, neighbors=None, device=None, embeddings=None, **kw):
    """The ``theory.rules.Verifier`` for a method name (``theory.rules.methods``) with registry parameters ``params``
    and/or ``kw`` (the method's own names: ``k``, ``delta``, ``lambda``, ...; the rest take its defaults): the
    parameters resolved by the registry (``theory.rules.methods.resolve``), then ``resolved_verifier``."""
    return resolved_verifier(method, L, registry.resolve(method, {**(params or {}), **kw}), neighbors, device,
                             embeddings)


def resolved_verifier(method: str, L: int, params: dict, neighbors=None, device=None, embeddings=None):
    """The ``theory.rules.Verifier`` of a method name with its RESOLVED parameters ``params`` for draft length ``L``,
    its tables kept on ``device`` (``resolved_verifiers`` without ``host_L``)."""
    return resolved_verifiers(method, params, neighbors, embeddings, L=L, device=device)[0]


def resolved_verifiers(method: str, params: dict, neighbors=None, embeddings=None, *, L: int, device=None,
                       host_L: int | None = None) -> list:
    """[the ``theory.rules.Verifier`` of a method name with its RESOLVED parameters ``params``
    (``theory.rules.methods.resolve``, e.g. ``coolsd.validate.RunConfig.method_params``) for draft length ``L``, its
    tables kept on ``device``], and with ``host_L`` a second one for draft length ``host_L`` with its tables as given
    (``coolsd generate --fidelity``'s rule, for the host's float64 likelihood), made in one pass. LANTERN methods
    need the codebook neighbour table ``neighbors`` (V, K) (``theory.rules.lantern_neighbors`` /
    ``real.models.vq.codebook_neighbors``; a lazy table, ``real.neighbors``, is read once, as wide as the rule reads:
    ``needed_width``); with ``device`` the table is kept there as a torch tensor (no host-to-device copy per round),
    or as numpy where its rounds are verified on the host (a CPU unless the device path is forced,
    ``real.nn.devpath.host_path``; a verifier holding no torch tensor verifies on numpy views there,
    ``real.decode.round.host_verification``); without ``device`` as given. GSD methods take the codebook vectors
    ``embeddings`` (V, d) (``real.registry.Bundle.codebook``; their (V, V) closeness table is built per verifier, as
    numpy on the host). How wide the table is read, then where the tables live, is decided once, before the rules are
    built."""
    m: registry.Method = registry.get(method)
    if m.needs_neighbors and hasattr(neighbors, "table"):   # a lazy table (real.neighbors): as wide as the rule reads
        neighbors = neighbors.table(needed_width(params, neighbors.shape[0], neighbors.shape[1]))
    host = device is not None and host_path(device)
    emb = None
    if m.needs_embeddings and embeddings is not None:
        if isinstance(embeddings, torch.Tensor):   # bf16 (the release's input-embedding table) stays bf16 on its
            emb = embeddings.detach()               # device: the distance is computed in it, as released; else
            emb = emb if emb.dtype == torch.bfloat16 else emb.cpu().double().numpy()   # float64 numpy
        else:
            emb = embeddings
    out = []
    for n, dev, on_host in [(L, device, host)] + ([(host_L, None, False)] if host_L is not None else []):
        nb = None                                  # (a loop over the at most two verifiers)
        if m.needs_neighbors and neighbors is not None:
            if isinstance(neighbors, torch.Tensor):
                nb = neighbors.cpu().numpy() if on_host else neighbors if dev is None else neighbors.to(dev)
            else:
                nb = np.asarray(neighbors)
                nb = nb if dev is None or on_host else torch.as_tensor(nb, device=dev)
        v = m.verifier(n, params, nb, emb)              # the parameters were resolved once, before
        close = getattr(v.accept, "close", None)
        if isinstance(close, torch.Tensor) and on_host:   # GSD's table, built from the bf16 rows: numpy, as LANTERN's
            v = replace(v, accept=replace(v.accept, close=close.cpu().numpy()))
        out.append(v)
    return out


def needed_width(params: dict, V: int, K: int) -> int:
    """Columns of the neighbour table a LANTERN method reads with its resolved parameters ``params``
    (``theory.rules.methods.resolve``): k (its acceptance; None: ``default_lantern_k(V)``), k + 1 with the release's
    resamplers (they zero k + 1 neighbours); at most the table's width K (a wider need is refused, with the reason, by
    the method itself)."""
    k = params["k"] if params.get("k") is not None else default_lantern_k(V)
    return int(min(K, k if params.get("resampler") == "optimal" else k + 1))


def method_processing(method: str, processing: Processing) -> Processing:
    """``greedy`` means temperature 0 (one-hot rows) for draft and target; other methods keep ``processing``."""
    return replace(processing, temperature=0.0) if registry.get(method).greedy_rows else processing
