"""``coolsd generate --record FILE --tree dynamic``: the recorded dynamic-tree rounds, each with its own tree, in the
form ``theory.likelihood.recorded.load_rows`` reads back as ``theory.likelihood.recorded.DynamicRows`` (docs/theory.md section 10)."""
from __future__ import annotations

import json

import numpy as np


def write_dynamic_record(path, gens, spec) -> int:
    """Write the rounds of ``gens`` (``real.decode.engine.Generation`` with ``record_rows``) that scored the whole
    block of ``spec.total`` nodes (rounds at an image's end score fewer: left out, as static-tree records keep only
    full trees) to ``path``: p, q (R, N+1, V) float32 (q empty in release mode: point-mass candidates), tokens,
    parent (R, N+1) int64, max_depth (R,) the walk's depth bound, image, accepted (R,), dynamic (JSON of
    ``spec.params()``). Returns R; ValueError when no round is complete."""
    from coolsd.io import atomic_file

    full = [(i, r) for i, g in enumerate(gens) for r in g.rounds
            if r.drafted > 0 and r.parent is not None and len(r.parent) == spec.total]
    if not full:
        raise ValueError("--record with --tree dynamic: no round scored the whole tree (images too short?)")
    arrs = {"p": np.stack([r.p for _, r in full]).astype(np.float32),
            "tokens": np.stack([r.drafts for _, r in full]).astype(np.int64),
            "parent": np.stack([r.parent for _, r in full]).astype(np.int64),
            "max_depth": np.array([r.depth for _, r in full], np.int64),
            "image": np.array([i for i, _ in full], np.int64),
            "accepted": np.array([r.accepted for _, r in full], np.int64),
            "dynamic": np.array(json.dumps(spec.params()))}
    # release mode: no draft rows (point-mass candidates), stored as an empty q (load_rows reads it as None)
    arrs["q"] = np.stack([r.q for _, r in full]).astype(np.float32) if full[0][1].q is not None \
        else np.zeros(0, np.float32)
    with atomic_file(path) as fh:
        np.savez_compressed(fh, **arrs)
    return len(full)
