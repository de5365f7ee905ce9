"""`coolsd generate`'s last stage: a validated, built ``generate_checks.Plan`` run in one direction (issue 47): the
engine over every image (and the plain-AR baseline with --baseline), --record streamed to disk batch by batch, the
summary (the mode describes itself: ``ModeDef.report``), --fidelity's exact scores, --save. ``execute`` returns the
JSON-ready result that ``coolsd.commands.generate`` prints."""
from __future__ import annotations

import os

from coolsd.io import atomic_file


def execute(p) -> dict:
    """Plan ``p`` (``generate_checks.Plan``) run: the engine (and the AR baseline) writing the records (``_runs``),
    then, in this one pass, the JSON-ready summary of the run and of the baseline (the mode describes itself:
    ``ModeDef.report``), with --fidelity the exact per-image likelihoods of the images just made
    (``real.decode.score.summary`` with the drafting the mode's likelihood hook gave: ``Plan.scored``; with --baseline
    the plain-AR images are scored too: KL(P||P^) per token, and a second TV), and --save written: the tokens (and the
    decoded images when a VQ is loaded, and the per-image likelihoods with --fidelity). Returns the JSON-ready
    result."""
    import numpy as np
    import torch

    from real.decode.records import summarize

    gens, base = _runs(p)
    b = p.bundle
    verifier, mode, spec, cfg = p.verifier, p.mode, p.spec, p.cfg
    stats = summarize(gens)
    out = {"model": cfg.model, "method": p.method, "L": spec.max_depth,
           "params": {k: _plain(v) for k, v in (verifier.params.items() if verifier else [])},
           "verifier": verifier.name if verifier else "ar", "processing": p.proc.params(),
           "image_tokens": b.num_tokens, "num_images": len(gens), "seed": cfg.seed,
           "batch_size": gens[0].info["batch_size"], "device": str(cfg.device), "dtype": cfg.dtype, "info": b.info,
           **stats}
    if mode is not None:
        out |= spec.mode.report(mode, spec.opts)
    if base:
        s = summarize(base)
        out["baseline"] = {"seconds": s["seconds"], "tokens_per_second": s["tokens_per_second"]}
        out["speedup"] = s["seconds"] / stats["seconds"]
    tuned = _tuned_prediction(getattr(cfg, "weights", None), getattr(cfg, "schedule", None))
    if tuned:
        out["tuned_prediction"] = tuned
    if cfg.record:
        out["record"] = str(cfg.record)
    fid = None
    if cfg.fidelity:
        from real.decode.score import summary

        fid = summary(b.target, None if p.rule is None else b.draft, b.conds, torch.stack([g.tokens for g in gens]),
                      verifier=p.rule, processing=p.proc, batch_size=cfg.batch_size or 64, drafting=p.scored,
                      ar_conds=b.conds if base else None,
                      ar_tokens=torch.stack([g.tokens for g in base]) if base else None)
        out["fidelity"] = fid["report"]
    if p.cfg.save:
        toks = np.stack([g.tokens.numpy() for g in gens])
        extra = {} if fid is None else {"log_p_hat": fid["log_p_hat"], "log_p": fid["log_p"]}
        side = int(round(b.num_tokens ** 0.5))
        if b.vq is not None and side * side == b.num_tokens:
            extra["images"] = b.vq.decode_code(torch.as_tensor(toks)).float().cpu().numpy()
        with atomic_file(p.cfg.save) as fh:
            np.savez_compressed(fh, tokens=toks, **extra)
        out["saved"] = str(p.cfg.save)
    return out


def _runs(p) -> tuple[list, list]:
    """The runs of plan ``p``: the mode's (with --record streamed to disk batch by batch: ``coolsd.npzstream``;
    docs/records.md: the arrays the mode declares, ``ModeDef.record``, which ``theory.likelihood.recorded.load_rows``
    reads back, written atomically once every batch is in; the rows of one batch at most are held) and, with
    --baseline, the plain AR one (no verifier, no mode). Returns (the mode's generations, the baseline's or [])."""
    from contextlib import ExitStack

    from real.decode import engine

    b = p.bundle
    spec, mode, cfg = p.spec, p.mode, p.cfg
    with ExitStack() as stack:
        sink = None
        if cfg.record and mode is not None:
            from coolsd.npzstream import NpzStream
            from coolsd.rowfiles import record_arrays, record_batches, run_stamp

            stamp = run_stamp(cfg.model, b, p.proc, spec.max_depth, method=p.method, images=len(b.conds),
                              seed=cfg.seed)
            stream = stack.enter_context(NpzStream(cfg.record, compress=True))
            sink = record_batches(stream, lambda gens: spec.mode.record(gens, mode, stamp, record_arrays))
        runs = [(p.verifier, mode, sink)] + ([(None, None, None)] if cfg.baseline else [])
        out = []
        for verifier, m, on_batch in runs:   # a loop over the (at most two) engine runs
            out.append(engine.generate(b.target, b.draft if m is not None and m.needs_draft else None, b.conds,
                                       num_tokens=b.num_tokens, verifier=verifier, drafting=m, processing=p.proc,
                                       seed=cfg.seed, batch_size=cfg.batch_size,
                                       progress=None if not cfg.json else False, record_rows=on_batch is not None,
                                       on_batch=on_batch))
            if on_batch is not None:
                try:
                    on_batch.finish()
                except ValueError as e:
                    raise ValueError(f"--record with {spec.named}: {e}") from None
            stack.close()                    # the record is written before the baseline runs
    return out[0], out[1] if cfg.baseline else []


def _tuned_prediction(*paths) -> dict | None:
    """What ``coolsd tune`` predicted for the schedule file run here (the values of --weights / --schedule: the first
    that names a file): its predicted tokens per call and held-out KL(P||P^) per token, printed next to the measured
    figures."""
    import json

    for path in paths:
        if isinstance(path, str) and os.path.isfile(path):
            try:
                with open(path) as f:
                    d = json.load(f)
            except (OSError, ValueError):
                return None
            if not isinstance(d, dict):
                return None
            held = (d.get("heldout") or {}).get("kl_per_token") or {}
            return {"file": path, "objective": d.get("objective"), "tokens_per_call": d.get("predicted_tokens_per_call"),
                    "tokens_per_call_ci95": d.get("predicted_tokens_per_call_ci95"),
                    "kl_ar_per_token": held.get("measured"), "kl_ar_per_token_ci": held.get("ci")}
    return None


def _plain(x):
    return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)
