"""GSD's distance vectors, read from a built model (``real.registry.Bundle``): the rows of the target's input
embedding table (as released) or the VQ codebook (``--gsd-table``). Apart from ``real.decode.methods`` (method names
-> verifiers), so the model is read in one room and the verifier built in another; ``methods`` re-exports these
names."""
from __future__ import annotations

import torch

__all__ = ["GSD_TABLES", "gsd_vectors", "input_embedding_rows"]

GSD_TABLES = ("embedding", "codebook")   # GSD's distance table: the target's input embeddings (as released) / VQ codes


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
