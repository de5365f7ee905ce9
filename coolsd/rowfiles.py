"""Stamped row files for the exact-law tuner (docs/theory.md section 8c; ``theory.likelihood.arrows``).

* ``run_stamp(model, bundle, processing, L, **extra)``: the stamp of a run (model, draft kind, processing, L, the
  likelihood convention of its draft, T, V, tokens per image row), shared by ``coolsd generate --record`` and the AR
  rows made here;
* ``make_ar_rows(model, n_images, ...)``: N images drawn from the target P (plain AR, or a lossless vanilla SD run)
  and their teacher-forced rows (``ARRows``); ``make_record(...)``: a vanilla chain run's recorded rounds with their
  starts (``StampedRecord``);
* ``save_ar_rows`` / ``save_record``: written atomically (``coolsd.io.atomic_file``), uncompressed (rows of
  probabilities do not compress; loading stays fast).

Every call into ``real.decode`` (generation and teacher-forced scoring, whose signatures are being refactored) is in
``_generate`` and ``_score``.
"""
from __future__ import annotations

import json
import math

import numpy as np

from coolsd.io import atomic_file

__all__ = ["run_stamp", "convention_of", "make_ar_rows", "make_record", "save_ar_rows", "save_record",
           "record_arrays", "record_batches", "AR_SOURCES"]

AR_SOURCES = ("ar", "vanilla")      # plain AR images, or a vanilla SD run's (distributed as P too)


def convention_of(draft) -> str:
    """The likelihood convention of a draft model (``theory.likelihood.log_likelihood``): "eagle" for a feature
    drafter (its first round is the target's prefill alone), else "theory"."""
    return "eagle" if draft is not None and bool(getattr(draft, "needs_features", False)) else "theory"


def per_row(bundle, T: int) -> int:
    """Tokens per image row (the speed model's row-wise survival): the model's code grid, else the side of a square
    image, else the whole image (as ``coolsd sweep``)."""
    grid = bundle.info.get("grid")
    if grid and len(grid) == 2 and grid[0] * grid[1] == T:
        return int(grid[1])
    side = math.isqrt(T)
    return side if side * side == T else T


def run_stamp(model: str, bundle, processing, L: int, **extra) -> dict:
    """The stamp of a run of ``model`` (its built ``bundle``) with ``processing`` and draft length L
    (``theory.likelihood.arrows.STAMP_FIELDS`` plus provenance ``extra``)."""
    T = int(bundle.num_tokens)
    return {"model": model, "draft": bundle.info.get("draft"), "processing": processing.params(), "L": int(L),
            "convention": convention_of(bundle.draft), "T": T, "V": int(bundle.target.vocab_size),
            "per_row": per_row(bundle, T), "conditions": bundle.info.get("conditions"), **extra}


def _generate(bundle, processing, L: int | None, seed: int, batch_size: int, record: bool, verifier=None):
    """``real.decode.engine.generate``: plain AR when ``verifier`` is None, else chain SD with the bundle's draft."""
    from real.decode.engine import generate

    draft = None if verifier is None else bundle.draft
    batch_size = min(batch_size, len(bundle.conds))
    return generate(bundle.target, draft, bundle.conds, num_tokens=bundle.num_tokens, verifier=verifier,
                    drafting=None if verifier is None else L, processing=processing, seed=seed, batch_size=batch_size,
                    record_rows=record)


def _score(bundle, conds, tokens, L: int, processing):
    """``real.decode.score.teacher_forced_rows`` of images ``tokens`` (B, T): (p, q, convention) as numpy."""
    from real.decode.score import teacher_forced_rows

    r = teacher_forced_rows(bundle.target, bundle.draft, conds, tokens, L=L, processing=processing)
    return r.p.cpu().numpy(), r.q.cpu().numpy(), r.convention


def _bundle(model: str, n_images: int, draft: str | None, seed: int, device: str = "cpu", class_id: int | None = None):
    from real.registry import BuildOptions, build

    return build(model, BuildOptions(draft=draft, num_images=n_images, seed=seed, device=device, class_id=class_id))


def _processing(bundle, temperature=None, top_k=None, top_p=None, cfg_scale=None):
    from real.decode.sampling import Processing

    return Processing(1.0 if temperature is None else temperature, bundle.top_k if top_k is None else top_k,
                      1.0 if top_p is None else top_p, bundle.cfg_scale if cfg_scale is None else cfg_scale)


def make_ar_rows(model: str, n_images: int, *, draft: str | None = None, L: int = 4, seed: int = 0,
                 source: str = "ar", batch_size: int = 64, device: str = "cpu", class_id: int | None = None,
                 **processing):
    """``theory.likelihood.arrows.ARRows`` of ``n_images`` images of ``model`` drawn from the target (``source`` "ar":
    plain AR; "vanilla": a lossless SD run with the draft), with their teacher-forced rows for ``draft`` and L.
    ``processing``: temperature, top_k, top_p, cfg_scale (None: the model's defaults)."""
    import torch

    from theory.likelihood.arrows import ARRows
    from theory import rules

    if source not in AR_SOURCES:
        raise ValueError(f"AR rows: source must be one of {AR_SOURCES}, got {source!r}")
    bundle = _bundle(model, n_images, draft, seed, device, class_id)
    if bundle.draft is None:
        raise ValueError(f"AR rows: --model {model} with draft {draft!r} has no draft model to score")
    proc = _processing(bundle, **processing)
    gens = _generate(bundle, proc, L, seed, batch_size, False, None if source == "ar" else rules.vanilla())
    tok = torch.stack([g.tokens for g in gens])
    ps, qs, conv = [], [], None
    for a in range(0, n_images, batch_size):      # teacher-forced rows, one batch of images at a time
        p, q, conv = _score(bundle, bundle.conds[a:a + batch_size], tok[a:a + batch_size], L, proc)
        ps.append(p)
        qs.append(q)
    stamp = run_stamp(model, bundle, proc, L, source=source, images=int(n_images), seed=int(seed))
    if stamp["convention"] != conv:
        raise ValueError(f"AR rows: the scorer's convention {conv!r} is not the draft's {stamp['convention']!r}")
    return ARRows(np.concatenate(ps), np.concatenate(qs), tok.numpy(), stamp, name="AR rows")


def record_arrays(gens, L: int, stamp: dict) -> dict:
    """The arrays ``coolsd generate --record`` writes for a chain run: p, q, drafts, n_drafted, image, accepted, the
    tokens generated before each drafted round (``start``) and the run's ``stamp`` (JSON)."""
    from real.decode.records import records_to_arrays

    recs = [r for g in gens for r in g.rounds]
    p, q, d, nd = records_to_arrays(recs, L)
    image, start = [], []
    for i, g in enumerate(gens):
        n = 0
        for r in g.rounds:            # rounds in order: each yields accepted + 1 tokens
            if r.drafted > 0:
                image.append(i)
                start.append(n)
            n += r.accepted + 1
    return {"p": p, "q": q, "drafts": d, "n_drafted": nd, "image": np.array(image, np.int64),
            "accepted": np.array([r.accepted for r in recs if r.drafted > 0]), "start": np.array(start, np.int64),
            "stamp": np.array(json.dumps({**stamp, "format": "coolsd-record/1"}))}


def record_batches(stream, make_arrays):
    """An ``on_batch(first, gens)`` for ``real.decode.engine.generate`` that streams each batch's record to
    ``stream`` (``coolsd.npzstream.NpzStream``) and drops its rows (``engine.drop_rows``), so a recording run holds
    one batch's rows at most. ``make_arrays(gens)``: the arrays of a list of generations (a mode's declared record,
    ``ModeDef.record``); their ``image`` indices are shifted by the batch's first image. A batch with no round to
    record (its ValueError) adds nothing; ``finish()`` on the returned callable raises the last such error when no
    batch added anything."""
    from real.decode.engine import drop_rows

    state = {"added": 0, "error": None}

    def on_batch(first: int, gens: list) -> None:
        try:
            arrs = make_arrays(gens)
        except ValueError as e:
            state["error"] = e
        else:
            if "image" in arrs:
                arrs["image"] = np.asarray(arrs["image"], np.int64) + int(first)
            stream.append(arrs)
            state["added"] += 1
        drop_rows(gens)

    def finish() -> None:
        if not state["added"]:
            raise state["error"] or ValueError("no batch was recorded")

    on_batch.finish = finish
    return on_batch


def make_record(model: str, n_images: int, *, draft: str | None = None, L: int = 4, seed: int = 1,
                batch_size: int = 64, device: str = "cpu", **processing) -> dict:
    """The arrays of a vanilla chain run of ``n_images`` images with recorded rows (``record_arrays``)."""
    from theory import rules

    bundle = _bundle(model, n_images, draft, seed, device)
    proc = _processing(bundle, **processing)
    gens = _generate(bundle, proc, L, seed, batch_size, True, rules.vanilla())
    stamp = run_stamp(model, bundle, proc, L, method="vanilla", images=int(n_images), seed=int(seed))
    return record_arrays(gens, L, stamp)


def save_ar_rows(path, rows) -> None:
    """Write ``ARRows`` atomically in the npz format ``theory.likelihood.arrows.FORMAT``."""
    from theory.likelihood.arrows import ar_rows_arrays

    with atomic_file(path) as fh:
        np.savez(fh, **ar_rows_arrays(rows))


def save_record(path, arrays: dict) -> None:
    """Write a record's arrays (``record_arrays``) atomically."""
    with atomic_file(path) as fh:
        np.savez(fh, **arrays)
