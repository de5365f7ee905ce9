"""Speculative and plain autoregressive generation of one image through ``real.protocol`` models.

One round (THEORY section 1), with n of the T image tokens generated:
  L' = min(L, T - n - 1) drafts x~_1..x~_L' sampled from the processed draft rows q_i;
  one target forward over [last committed token; x~_1..x~_L'] gives the processed rows p_1..p_{L'+1};
  ``theory.verify.verify_chain`` (the shared rules, on torch tensors) returns tau and the next token;
  both KV caches are rolled back to the accepted prefix. L' = 0 is a single target step.
The first round's target forward is the prefill itself ([condition prefix; drafts] in one call), so
target forwards == rounds. Feature drafters (EAGLE) cannot draft the first token: their first round is
the prefill alone (L' = 0), then the convention above applies.

Uniforms come from one seeded ``torch.Generator`` on the model device (draft sampling, acceptance and
the final draw), so runs are reproducible. Probabilities are float32 (or float64) whatever the model
dtype. Greedy decoding = temperature 0 (one-hot rows) with ``theory.rules.greedy()``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory.verify import verify_chain

from .protocol import check_pair
from .sampling import Processing, sample

__all__ = ["RoundRecord", "Generation", "speculative_generate", "ar_generate", "summarize", "records_to_arrays"]


@dataclass
class RoundRecord:
    """One round: ``drafted`` = L', ``accepted`` = tau (tokens produced: tau + 1), wall times in seconds
    (CUDA-synchronised), and with ``record_rows=True`` the processed rows along the drafted path:
    ``p`` (L'+1, V) target rows P(.|h_{i-1}), i = 1..L'+1; ``q`` (L', V) draft rows; ``drafts`` (L',)."""
    drafted: int
    accepted: int
    t_draft: float
    t_target: float
    t_verify: float
    p: np.ndarray | None = None
    q: np.ndarray | None = None
    drafts: np.ndarray | None = None


@dataclass
class Generation:
    tokens: torch.Tensor                 # (T,) int64 image tokens
    rounds: list[RoundRecord]
    seconds: float
    target_forwards: int
    draft_forwards: int
    info: dict = field(default_factory=dict)

    def stats(self) -> dict:
        return summarize([self])


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _rows(out_logits: torch.Tensor, k: int, proc: Processing) -> torch.Tensor:
    """Processed rows of the last k positions: logits (B, S, V) -> (k, V)."""
    return proc(out_logits[:, -k:])


def _check_rows(p: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"non-finite {name} probabilities (NaN/inf logits from the model?)")


def _device_of(model) -> torch.device:
    d = getattr(model, "device", None)
    return torch.device(d) if d is not None else torch.device("cpu")


def speculative_generate(target, draft, cond, *, num_tokens: int, verifier, L: int,
                         processing: Processing = Processing(), seed: int = 0,
                         generator: torch.Generator | None = None, record_rows: bool = False,
                         progress: bool | None = False) -> Generation:
    """Generate ``num_tokens`` image tokens with speculative decoding (chain drafts of length L).

    ``target`` follows ``real.protocol.ARModel``; ``draft`` an ``ARModel`` (independent small model,
    prefilled with the same condition) or a ``FeatureDrafter`` (EAGLE). ``verifier`` is a
    ``theory.rules.Verifier``; ``processing`` is applied identically to draft and target logits.
    Returns tokens (T,), per-round records and counts."""
    from tqdm.auto import tqdm

    check_pair(target, draft)
    T = int(num_tokens)
    if T < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if L < 1:
        raise ValueError(f"draft length L must be >= 1, got {L}")
    dev = _device_of(target)
    gen = generator or torch.Generator(device=dev).manual_seed(seed)
    proc = processing
    B = proc.batch
    feat = bool(getattr(draft, "needs_features", False))

    out: list[torch.Tensor] = []
    records: list[RoundRecord] = []
    t_pending: torch.Tensor | None = None       # last committed token, not yet fed to the target
    d_tok: list[torch.Tensor] = []               # committed tokens not yet fed to the draft
    d_feat: list[torch.Tensor] = []              # (B, k, D) target features paired with d_tok (EAGLE)
    n_target = n_draft = 0
    bar = tqdm(total=T, disable=not progress if progress is not None else None, desc="spec decode", leave=False)
    _sync(dev)
    t_start = time.perf_counter()
    n = 0
    while n < T:
        Lr = 0 if (feat and n == 0) else min(L, T - n - 1)
        # ------------------------------------------------------------------ draft
        t0 = time.perf_counter()
        drafts: list[torch.Tensor] = []
        qrows: list[torch.Tensor] = []
        if Lr > 0:
            if feat:
                o = draft.forward(torch.stack(d_tok).view(1, -1).expand(B, -1), features=torch.cat(d_feat, 1))
            elif n == 0:
                o = draft.prefill(cond, cfg=proc.cfg)
            else:
                o = draft.forward(torch.stack(d_tok).view(1, -1).expand(B, -1))
            n_draft += 1
            d_tok, d_feat = [], []
            for i in range(Lr):
                q = proc(o.logits[:, -1])
                x = sample(q, gen)
                drafts.append(x)
                qrows.append(q)
                if i < Lr - 1:
                    xb = x.view(1, 1).expand(B, 1)
                    o = draft.forward(xb, features=o.hidden[:, -1:]) if feat else draft.forward(xb)
                    n_draft += 1
        _sync(dev)
        t1 = time.perf_counter()
        # ------------------------------------------------------------------ target
        block = torch.stack(drafts).view(1, -1).expand(B, -1) if drafts else None
        if n == 0:
            o_t = target.prefill(cond, block, cfg=proc.cfg, return_hidden=feat)
        else:
            inp = t_pending.view(1, 1).expand(B, 1)
            o_t = target.forward(inp if block is None else torch.cat([inp, block], 1), return_hidden=feat)
        n_target += 1
        p = _rows(o_t.logits, Lr + 1, proc)                     # (L'+1, V)
        _sync(dev)
        t2 = time.perf_counter()
        # ------------------------------------------------------------------ verify
        if Lr == 0:
            _check_rows(p, "target")
            nxt = sample(p[0], gen)
            tau = 0
        else:
            q = torch.stack(qrows)
            if not bool(torch.isfinite(p).all() & torch.isfinite(q).all()):   # one sync for both
                _check_rows(p, "target")
                _check_rows(q, "draft")
            tok = torch.stack(drafts)
            u_acc = torch.rand(Lr, generator=gen, device=dev, dtype=p.dtype)
            u_smp = torch.rand((), generator=gen, device=dev, dtype=p.dtype)
            # a leading batch dim of 1: rules index rows with (...,)-shaped tokens (LANTERN's resampler
            # gathers neighbour rows of the rejected token, which needs at least a 1-d index on torch)
            verdict = verify_chain(p[None], q[None], tok[None], u_acc[None], u_smp[None], verifier)
            tau = int(verdict.accepted[0])
            nxt = verdict.next_token[0]
        _sync(dev)
        t3 = time.perf_counter()
        # ------------------------------------------------------------------ commit + rollback
        new = drafts[:tau] + [nxt]
        out.extend(new)
        if Lr - tau:
            target.rollback(Lr - tau)
        if feat:
            hid = o_t.hidden[:, -(Lr + 1):]
            if n == 0:                                  # pairs over the prefix: (id 0, h_p), then (x_0, h_{P-1})
                P = o_t.hidden.shape[1]
                draft.start(P, B)
                zeros = [torch.zeros((), dtype=torch.long, device=dev)] * (P - 1)
                d_tok, d_feat = zeros + new, [o_t.hidden]
            else:
                if Lr > 1:
                    draft.rollback(Lr - 1)              # the drafter's own (draft, predicted feature) pairs
                d_tok = d_tok + new
                d_feat = d_feat + [hid[:, :tau + 1]]
        elif Lr > 0:
            if tau <= Lr - 1:
                if Lr - 1 - tau:
                    draft.rollback(Lr - 1 - tau)
                d_tok = [nxt]
            else:                                        # all accepted: the last draft was never fed
                d_tok = [drafts[-1], nxt]
        else:
            d_tok = d_tok + [nxt]
        t_pending = nxt
        rec = RoundRecord(Lr, tau, t1 - t0, t2 - t1, t3 - t2)
        if record_rows:
            rec.p = p.float().cpu().numpy()
            rec.q = (torch.stack(qrows) if qrows else p[:0]).float().cpu().numpy()
            rec.drafts = (torch.stack(drafts) if drafts else torch.zeros(0, dtype=torch.long)).cpu().numpy()
        records.append(rec)
        n += tau + 1
        bar.update(tau + 1)
    bar.close()
    _sync(dev)
    seconds = time.perf_counter() - t_start
    tokens = torch.stack(out).reshape(-1).cpu()
    return Generation(tokens, records, seconds, n_target, n_draft,
                      {"method": getattr(verifier, "name", "custom"), "L": L, **proc.params()})


def ar_generate(model, cond, *, num_tokens: int, processing: Processing = Processing(), seed: int = 0,
                generator: torch.Generator | None = None, progress: bool | None = False) -> Generation:
    """Plain autoregressive sampling through the same protocol and processing (the baseline): one
    target forward per token, the token drawn from the processed row with the seeded generator."""
    from tqdm.auto import tqdm

    T = int(num_tokens)
    if T < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    dev = _device_of(model)
    gen = generator or torch.Generator(device=dev).manual_seed(seed)
    proc = processing
    B = proc.batch
    out, records = [], []
    _sync(dev)
    t_start = time.perf_counter()
    for n in tqdm(range(T), disable=not progress if progress is not None else None, desc="AR decode", leave=False):
        t1 = time.perf_counter()
        o = model.prefill(cond, cfg=proc.cfg) if n == 0 else model.forward(out[-1].view(1, 1).expand(B, 1))
        p = _rows(o.logits, 1, proc)
        _sync(dev)
        t2 = time.perf_counter()
        if n == 0:
            _check_rows(p, "model")
        out.append(sample(p[0], gen))
        _sync(dev)
        records.append(RoundRecord(0, 0, 0.0, t2 - t1, time.perf_counter() - t2))
    _sync(dev)
    seconds = time.perf_counter() - t_start
    return Generation(torch.stack(out).cpu(), records, seconds, T, 0, {"method": "ar", **proc.params()})


def summarize(gens: list[Generation]) -> dict:
    """Aggregate figures over generations: tokens per target call (= tokens per round, mean of tau + 1)
    with its standard error over rounds, accepted drafts tau, acceptance rate, time split."""
    taus = np.array([r.accepted for g in gens for r in g.rounds], dtype=np.float64)
    drafted = np.array([r.drafted for g in gens for r in g.rounds], dtype=np.float64)
    R = len(taus)
    tokens = int(sum(g.tokens.numel() for g in gens))
    secs = float(sum(g.seconds for g in gens))
    td = float(sum(r.t_draft for g in gens for r in g.rounds))
    tt = float(sum(r.t_target for g in gens for r in g.rounds))
    tv = float(sum(r.t_verify for g in gens for r in g.rounds))
    se = float(taus.std(ddof=1) / math.sqrt(R)) if R > 1 else float("nan")
    return {
        "tokens": tokens, "rounds": R, "images": len(gens),
        "target_forwards": int(sum(g.target_forwards for g in gens)),
        "draft_forwards": int(sum(g.draft_forwards for g in gens)),
        "tokens_per_target_call": tokens / R, "tokens_per_target_call_se": se,
        "accepted_mean": float(taus.mean()), "accepted_se": se,
        "drafted_mean": float(drafted.mean()),
        "acceptance_rate": float(taus.sum() / drafted.sum()) if drafted.sum() else float("nan"),
        "seconds": secs, "tokens_per_second": tokens / secs if secs > 0 else float("nan"),
        "time_draft_s": td, "time_target_s": tt, "time_verify_s": tv,
        "verify_share": tv / (td + tt + tv) if (td + tt + tv) > 0 else float("nan"),
    }


def records_to_arrays(records: list[RoundRecord], L: int):
    """Stack recorded rounds for ``theory.recorded.predict_rounds``: p (R, L+1, V), q (R, L, V),
    drafts (R, L), n_drafted (R,). Rounds with L' < L are padded with uniform rows (f = 1, D = 0 there,
    and ``n_drafted`` masks them anyway) and token 0; L' = 0 rounds are dropped (nothing to predict)."""
    recs = [r for r in records if r.drafted > 0]
    if not recs:
        raise ValueError("no drafted rounds recorded")
    if any(r.p is None for r in recs):
        raise ValueError("rounds were recorded without rows: run with record_rows=True")
    V = recs[0].p.shape[-1]
    R = len(recs)
    p = np.full((R, L + 1, V), 1.0 / V, dtype=np.float32)
    q = np.full((R, L, V), 1.0 / V, dtype=np.float32)
    d = np.zeros((R, L), dtype=np.int64)
    nd = np.array([r.drafted for r in recs], dtype=np.int64)
    for j, r in enumerate(recs):  # copying R recorded rounds into padded arrays, not a hot path
        k = r.drafted
        p[j, :k + 1], q[j, :k], d[j, :k] = r.p, r.q, r.drafts
    return p, q, d, nd
