"""Argument checks of ``engine.generate``, the decoder's public entry point (the shared layer of issue 26:
``theory.core.checks``), kept out of the engine's body: every check here runs before any model call, in
microseconds, and raises a ValueError / TypeError whose message starts with the argument's name.

Adding an argument to ``engine.generate``: check it in ``generate_args`` (one line with ``theory.core.checks``)
and add a bad value to tests/test_probes.py. A drafting mode checks its own options (``Drafting.check``).
"""
from __future__ import annotations

import numbers

from theory.core import checks

from ..protocol import Caption, Prompt

__all__ = ["generate_args", "MAX_IMAGES"]

MAX_IMAGES = 10**6       # conditions per call: above, the per-image records alone outgrow memory


def generate_args(target, draft, conds, *, num_tokens, verifier, mode, seed, batch_size, processing,
                  features: bool = False, record_rows: bool = False):
    """Types and ranges of ``engine.generate``'s arguments (``mode``: the drafting mode,
    ``real.decode.engine.as_drafting`` of its ``drafting``), all in one place before the run; returns what the decoder
    runs on, read once here: (the conditions as a list of one kind, ``real.protocol.as_conds``; the target and the
    draft as the decoder calls them, ``real.protocol.as_batched``, the draft None when the mode drafts without one;
    the verifier guarded on the rows it meets, ``theory.rules.verifiers.guarded``, None for plain AR; the batch size,
    ``real.decode.memory.check_batch``, room made for the recorded rows of ``record_rows``).
    num_tokens an integer >= 1 (not 2.7, not "16"), seed an integer in [0, 2^64), batch_size an integer >= 1 or None,
    at most ``MAX_IMAGES`` conditions, a ``Processing``; when drafting: a verifier object, the mode's own checks
    (``Drafting.check``: its draft model, L within the image, tree sizes, cache room...), a draft that is not the target
    object itself and shares its vocabulary; ``features`` a bool, True only for plain AR; a batch that fits memory."""
    from theory.rules.verifiers import guarded

    from ..protocol import as_batched, as_conds, check_pair
    from .memory import check_batch, record_bytes
    from .sampling import Processing

    T = checks.integer("num_tokens", num_tokens, lo=1)
    checks.integer("seed", seed, lo=0, hi=checks.SEED_MAX)
    if batch_size is not None:
        checks.integer("batch_size", batch_size, lo=1)
    if not isinstance(processing, Processing):
        raise TypeError(f"processing must be a real.decode.sampling.Processing, got {type(processing).__name__}")
    if target is None or not callable(getattr(target, "prefill", None)):
        raise TypeError(f"target must be a model of the real.protocol contract (prefill, step, ...), "
                        f"got {type(target).__name__}")
    n = len(conds) if isinstance(conds, (list, tuple)) else 1
    if n > MAX_IMAGES:
        raise ValueError(f"conds: {n} images in one call is more than {MAX_IMAGES}; split the run")
    _check_class_ids(conds if isinstance(conds, (list, tuple)) else [conds])
    drafting = mode.max_depth != 0      # 0: plain AR (a mode with a bad depth is refused by its own check)
    if not drafting and draft is not None:     # plain AR: a draft model would be unused, which is a mistake
        raise ValueError("a draft model was given but no drafting: pass drafting= (an int L for chains of L "
                         "drafts, a theory.tree.Tree, a real.decode.modes mode), or draft=None for plain AR")
    if drafting:
        checks.verifier(verifier)
        if mode.needs_draft and draft is target:
            raise ValueError("draft is the target object itself (they would share one KV cache); give a separate "
                             "draft model, e.g. real.models.llamagen.truncated(target, 1) for a layer-skip draft")
    if drafting and mode.needs_draft and draft is not None:
        check_pair(target, draft)
    bt, bd = as_batched(target), as_batched(draft)
    if drafting:
        mode.check(bt, bd, T, verifier, processing, n if batch_size is None else int(batch_size))
    conds = as_conds(conds)
    if not isinstance(features, bool) or (features and drafting):
        raise ValueError(f"features must be a bool, and True only for plain AR (drafting None), got {features!r}")
    rec = record_bytes(mode, T, int(target.vocab_size)) if record_rows and drafting else 0
    bs = check_batch(target, draft if mode.needs_draft else None, len(conds), batch_size, processing, rec)
    return (conds, bt, bd if mode.needs_draft else None,
            guarded(verifier) if verifier is not None else None, bs)   # a user's rule checked on the rows it meets


def _check_class_ids(conds) -> None:
    """Conditions that are not a ``Caption`` or ``Prompt`` are class ids: integers (Python, numpy or 0-d integer
    tensors), not strings, floats, bools or None (a float 1.5 would silently become class 1). One pass over the
    conditions (validation, not a hot path)."""
    for i, c in enumerate(conds):   # a loop over the images' conditions, once per call
        if isinstance(c, (Caption, Prompt)):
            continue
        bad = c is None or isinstance(c, (str, bytes, bool, float, complex)) or not (
            isinstance(c, numbers.Integral) or (getattr(c, "ndim", None) == 0 and "int" in str(getattr(c, "dtype", ""))))
        if bad:
            raise TypeError(f"conds[{i}] must be a class id (an integer), a real.protocol.Caption or a Prompt, got "
                            f"{type(c).__name__} {c!r}"[:200])
