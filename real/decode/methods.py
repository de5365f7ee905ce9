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
from .sampling import Processing

__all__ = ["METHODS", "make_verifier", "method_processing", "default_lantern_k", "gsd_vectors", "input_embedding_rows",
           "GSD_TABLES", "needed_width"]

GSD_TABLES = ("embedding", "codebook")   # GSD's distance table: the target's input embeddings (as released) / VQ codes

METHODS = registry.names()


def make_verifier(method: str, L: int, params: dict | None = None, neighbors=None, device=None, embeddings=None, **kw):
    """The ``theory.rules.Verifier`` for a method name (``theory.rules.methods``) with registry parameters ``params``
    and/or ``kw`` (the method's own names: ``k``, ``delta``, ``lambda``, ...; the rest take its defaults). LANTERN
    methods need the codebook neighbour table ``neighbors`` (V, K) (``theory.rules.lantern_neighbors`` /
    ``real.models.vq.codebook_neighbors``; a lazy table, ``real.neighbors``, is read as wide as the rule reads:
    ``needed_width``); with ``device`` the table is kept there as a torch tensor (no host-to-device copy per round),
    or as numpy where its rounds are verified on the host (a CPU unless the device path is forced,
    ``real.nn.devpath.host_path``; a verifier holding no torch tensor verifies on numpy views there,
    ``real.decode.round.host_verification``); without ``device`` as given. GSD methods take the codebook vectors
    ``embeddings`` (V, d) (``real.registry.Bundle.codebook``; their (V, V) closeness table is built once, as numpy).
    Where the tables live is decided once, and the parameters are resolved once, before the rule is built."""
    host = device is not None and host_path(device)
    m = registry.get(method)
    full = registry.resolve(method, {**(params or {}), **kw})
    nb = None
    if m.needs_neighbors and neighbors is not None:
        if hasattr(neighbors, "table"):             # a lazy table (real.neighbors): as wide as the rule reads
            neighbors = neighbors.table(needed_width(full, neighbors.shape[0], neighbors.shape[1]))
        if isinstance(neighbors, torch.Tensor):
            nb = neighbors.cpu().numpy() if host else neighbors if device is None else neighbors.to(device)
        else:
            nb = np.asarray(neighbors)
            nb = nb if device is None or host else torch.as_tensor(nb, device=device)
    emb = None
    if m.needs_embeddings and embeddings is not None:
        if isinstance(embeddings, torch.Tensor):   # bf16 (the release's input-embedding table) stays bf16 on its
            emb = embeddings.detach()               # device: the distance is computed in it, as released; else
            emb = emb if emb.dtype == torch.bfloat16 else emb.cpu().double().numpy()   # float64 numpy
        else:
            emb = embeddings
    v = registry.build(method, L, nb, full, embeddings=emb)
    close = getattr(v.accept, "close", None)
    if isinstance(close, torch.Tensor) and host:      # GSD's table, built from the bf16 rows: numpy, as LANTERN's
        v = replace(v, accept=replace(v.accept, close=close.cpu().numpy()))
    return v


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


def input_embedding_rows(target, V: int | None = None):
    """(V, d) rows of the target LM's INPUT embedding table for the engine's image tokens 0..V-1, or None where the
    model has none: ``code_embeddings()`` (multimodal adapters: the ids that feed each code), else the rows of
    ``tok_embeddings`` (LlamaGen; codes are the ids), else the wrapped HF model's ``get_input_embeddings()`` at
    ``image_token_ids`` (ids 0..V-1 when None)."""
    if hasattr(target, "code_embeddings"):
        return target.code_embeddings().detach()
    emb = getattr(target, "tok_embeddings", None)
    ids = None
    if emb is None:
        hf = getattr(target, "model", target)
        emb = hf.get_input_embeddings() if hasattr(hf, "get_input_embeddings") else None
        ids = getattr(target, "image_token_ids", None)
    w = getattr(emb, "weight", None)
    if w is None:
        return None
    w = w.detach()
    if ids is not None:
        return w[ids.to(w.device)]
    return w[:V] if V is not None else w


def gsd_vectors(bundle, table: str | None = None):
    """GSD's distance vectors and which table they are: (vectors, "embedding" | "codebook" | None).

    ``table`` "embedding" (the default; as released, junhyukso/GSD@4216c7c: rows of the target LM's input embedding
    table, ``model.embed_tokens.weight[:10000]``, distances in bf16) -> ``input_embedding_rows`` cast to bf16, the
    codebook where the model has no input embedding table; "codebook" -> the raw VQ code vectors
    (``bundle.codebook``; distances in float64), None where the model has none."""
    table = table or "embedding"
    if table not in GSD_TABLES:
        raise ValueError(f"GSD table must be one of {GSD_TABLES}, got {table!r}")
    cb = getattr(bundle, "codebook", None)
    if table == "embedding":
        V = getattr(bundle.target, "vocab_size", None) or (None if cb is None else int(cb.shape[0]))
        rows = input_embedding_rows(bundle.target, V)
        if rows is not None:
            return rows.to(dtype=torch.bfloat16), "embedding"       # on the model's device
    return cb, (None if cb is None else "codebook")
