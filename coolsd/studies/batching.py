"""At which batch size speculative decoding stops paying on this machine (the newcomer note of the demo and
sweep reports, issue 26; ``benchmarks/bench_batch.py`` measures the same curve with full runs).

:func:`unit_costs` times, at batch size B, one plain AR step of the whole batch, one target pass over L + 1
tokens, one draft step and the chain verifier; :func:`stops_paying` feeds them to the speed-up model with
batch size (``theory.markov.image.batch_speedup``: T a(B) / (E[max_B rounds] r(B)), section 7) with a method's
measured per-image round counts, and returns the smallest B at which the predicted speed-up falls below 1.
The timings are of the shipped LlamaGen-style models (``prefill`` / ``forward`` / ``rollback``; EAGLE drafts
``start`` and take ``features``), inside ``real.nn.layers.inference_weights`` as ``engine.generate`` runs.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

__all__ = ["median_time", "unit_costs", "stops_paying", "batches_up_to", "BATCHES", "note"]

BATCHES = (1, 2, 4, 8, 16, 32, 64)      # batch sizes timed (those up to the run's batch size, and it)


def median_time(fn, repeats: int, warmup: int = 1, reduce=statistics.median) -> float:
    """Median (or ``reduce``, e.g. ``min``) wall time in seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return reduce(ts)


def unit_costs(target, draft, B: int, proc, L: int, repeats: int = 9, prefix: int = 20, reduce=min,
               T: int | None = None) -> dict:
    """Fastest (``reduce``; the benchmark takes the median) seconds at batch B (CFG: ``proc.batch`` model rows per image): "ar_step" (1-token target forward
    + processing + sampling), "verify_pass" (the target over L + 1 tokens), "draft_step" (one draft token) and
    "verifier" (``verify_chain`` of a B-row round, Cool-SD). ``T``: the image's tokens (default the target's
    ``num_tokens`` when it has one): the prefix and the verify pass are clipped so that they fit in one image, as a
    real round never drafts past it (--L up to T)."""
    import torch

    T = T if T is not None else getattr(getattr(target, "layout", None), "num_tokens", None) or getattr(
        getattr(target, "config", None), "block_size", None)
    n_verify = L + 1
    if T is not None:
        prefix = max(1, min(prefix, int(T) - L - 1))
        n_verify = max(1, min(L + 1, int(T) - prefix))

    from real.nn.layers import inference_weights
    from theory import rules
    from theory.rules.chain import verify_chain

    g = torch.Generator().manual_seed(0)
    R = proc.batch * B
    conds = [i % 10 for i in range(B)]
    zeros = lambda n: torch.zeros(R, n, dtype=torch.long, device=target.device)  # noqa: E731
    with torch.no_grad(), inference_weights():
        target.prefill(conds, zeros(prefix), cfg=proc.cfg, return_hidden=True)
        feat = bool(getattr(draft, "needs_features", False))
        if feat:
            draft.start(target.cache_len - prefix, R)
            h = torch.zeros(R, prefix, target.config.dim, device=target.device)
            draft.forward(zeros(prefix), features=h)
        else:
            draft.prefill(conds, zeros(prefix), cfg=proc.cfg)

        def ar():
            o = target.forward(zeros(1), return_hidden=True)
            torch.multinomial(proc.rows(o.logits)[:, 0].float().cpu(), 1, generator=g)
            target.rollback(1)

        def verify_pass():
            o = target.forward(zeros(n_verify), return_hidden=True)
            proc.rows(o.logits)
            target.rollback(n_verify)

        def draft_step():
            o = draft.forward(zeros(1), features=h[:, :1]) if feat else draft.forward(zeros(1))
            torch.multinomial(proc.rows(o.logits[:, -1]).float().cpu(), 1, generator=g)
            draft.rollback(1)

        V = target.vocab_size
        p = torch.softmax(torch.randn(B, L + 1, V, generator=g), -1)
        q = torch.softmax(torch.randn(B, L, V, generator=g), -1)
        x = torch.randint(0, V, (B, L), generator=g)
        u, us = torch.rand(B, L, generator=g), torch.rand(B, generator=g)
        v = rules.cool_sd(2.0)
        t = lambda f: median_time(f, repeats, reduce=reduce)  # noqa: E731  (the fastest run: the least disturbed)
        return {"ar_step": t(ar), "verify_pass": t(verify_pass), "draft_step": t(draft_step),
                "verifier": t(lambda: verify_chain(p, q, x, u, us, v))}


def stops_paying(rounds_per_image, costs: dict, T: int, L: int) -> dict:
    """{"predicted": {B: speed-up}, "stops_paying_at": the smallest timed B from which on the predicted speed-up
    stays below 1 (None: it pays at the largest B timed)} from a method's per-image round counts (n,) and
    ``costs`` {B: unit_costs}. "From which on": timings on a busy machine are noisy, one slow B is no verdict."""
    from theory.markov.image import batch_speedup

    r = np.asarray(rounds_per_image, dtype=np.float64)
    pred = {}
    for B, c in sorted(costs.items()):       # a loop over the few batch sizes timed
        round_cost = L * c["draft_step"] + c["verify_pass"] + c["verifier"]
        pred[int(B)] = float(batch_speedup(r, int(B), T, c["ar_step"], round_cost))
    at = None
    for B in sorted(pred, reverse=True):     # walk down from the largest B while it stays below 1
        if pred[B] >= 1:
            break
        at = B
    return {"predicted": pred, "stops_paying_at": at}


def batches_up_to(B: int) -> tuple[int, ...]:
    return tuple(sorted({b for b in BATCHES if b <= B} | {int(B)}))


def note(per_method: dict, batch_size: int, device: str) -> str:
    """One paragraph for the report, beside the speed-up column: per method (label -> ``stops_paying``), the
    batch size from which SD is predicted slower than plain AR on this machine."""
    parts = []
    for name, r in per_method.items():
        at = r["stops_paying_at"]
        b1 = r["predicted"].get(1)
        parts.append(f"{name}: " + (f"from B = {at}" if at is not None else f"not up to B = {max(r['predicted'])}")
                     + (f" (predicted {b1:.2f}x at B = 1)" if b1 is not None else ""))
    return (f"Speed-ups are measured at batch size {batch_size} on {device}, where one forward of the whole batch "
            "may already be compute-bound, so a round's target pass over L + 1 tokens costs nearly L + 1 AR steps. "
            "SD stops paying (predicted speed-up < 1; theory.markov.image.batch_speedup with one AR step, one target pass, "
            "one draft step and the verifier timed at each batch size on this machine) " + "; ".join(parts) + ".")
