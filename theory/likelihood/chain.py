"""Exact likelihood of a chain-drafted relaxed-SD sequence (docs/theory.md section 11).

API (array API: numpy, torch; everything computed in float64):

* ``log_likelihood(p, q, tokens, verifier, L, *, convention="theory")`` -> (...,) float64 log P^(tokens),
  the log-probability that chain speculative decoding with ``verifier`` and draft length L emits the
  sequence ``tokens``, from teacher-forced rows:
    p       (..., T, V)     target rows P(. | x_<t) (after the same processing as the sampler's rows);
    q       (..., T, V)     draft rows Q(. | x_<t) for a draft that ignores the round offset (independent or
                            layer-skip drafts), or
            (..., T, L, V)  q[..., t, i-1] = the draft row when token t is the i-th draft of its round (an
                            EAGLE drafter, whose row depends on its own features since the round began);
                            entries that can never be used (a round starting before 0, or 1 under
                            "eagle"; token T-1, always a target token) are not read and may hold anything;
    tokens  (..., T)        ints in [0, V).
  ``convention="theory"``: the simulator's (``sim.simulate_sequence``) and an independent draft's in the
  engine (``real.decode.engine``: it drafts from round 0): the first round drafts from the start, a round that
  starts with n tokens done drafts L' = min(L, T - n - 1). ``convention="eagle"``: the engine's EAGLE
  convention (``real.decode.steps.prefill_step``): token 0 comes from p_0 alone (round 0 is the target's prefill)
  and the first drafted round starts at n = 1 with the same L'.
* ``log_target(p, tokens)`` -> (...,) float64 log P(tokens) = sum_t log p_t(x_t) (-inf where a p_t(x_t) = 0),
  the law plain AR samples (rows normalised, as every draw normalises them).
* estimators with 95% intervals in ``theory.likelihood.fidelity`` (KL, TV, the per-image T11 bound).

The recursion (T12). The sampler's law is a hidden Markov model over the round offset i = the number of
drafts accepted so far in the current round (0..L). With a_{t,i} = q_{t,i+1}(x_t) f_{i+1}(x_t) (token t
emitted as the accepted (i+1)-th draft) and r_{t,i} = (1 - beta_{i+1}) G^eff_{i+1}(x_t) (emitted as the
replacement after a rejection; G^eff the effective resampling law of section 6, so rules whose G depends
on the rejected draft, LANTERN's, are covered), the forward probabilities alpha_t(i) = P(x_<t, offset i)
obey, with n = t - i the round's start and L'(n) its draft count,

    alpha_{t+1}(i+1) = alpha_t(i) a_{t,i}                          (i < L'(n))
    alpha_{t+1}(0)   = sum_{i < L'(n)} alpha_t(i) r_{t,i} + sum_{i = L'(n)} alpha_t(i) p_t(x_t)

from alpha_0 = [1, 0, .., 0], and P^(x) = alpha_T(0) (a round never runs past T). The emissions are
computed once, vectorised over (batch, T) and the L draft positions jointly (p as (rows, 1, V), so what
depends on p alone, LANTERN's neighbour masses, is formed once), by the verifier's own ``accept`` and
``resample(..., rejected=None)``; only token entries are kept, so nothing of size
(T, L, V, V) is formed: a resampler may provide ``effective_at(p, q, f, x)`` -> G^eff(x) (...,) (LANTERN's
released laws do, in O(V k) per row; its "renormalised" variants fall back to the dense (V, V) effective
law), and the token rows are processed in chunks of about 2^24 / (V L (k+1)) rows (k: LANTERN's neighbourhood,
else 0) to bound the rules' temporaries. The recursion itself is
a loop over the T positions, each step O(L) on (batch, L+1) arrays, with rescaling (alpha normalised
each step, the log of the scale accumulated), so there is no underflow at any T.
"""
from __future__ import annotations

import math

import array_api_compat

from ..core import checks
from ..core.xp import Array, gather, namespace
from ..rules.verifiers import guarded

__all__ = ["CONVENTIONS", "log_likelihood", "log_target", "round_masks", "check_chain_rule"]

CONVENTIONS = ("theory", "eagle")
CHUNK_ELEMENTS = 1 << 18   # rows x L x V elements (float64: 2 MiB per temporary) per chunk of token rows in the
# emission pass: temporaries that stay in cache (at 1 << 24, 128 MiB each, the pass ran 2-5x slower, measured on
# natural256 rows, V = 1024, L = 4: benchmarks/bench_likelihood.py); LANTERN's neighbour masses are summed block by
# block (theory.rules.lantern), so its temporaries do not grow with k either


def round_masks(T: int, L: int, convention: str = "theory"):
    """numpy bool masks (T, L+1) over (token t, offset i): ``draft[t, i]`` token t may be the (i+1)-th
    draft of a round that started at n = t - i (i < L'(n)); ``bonus[t, i]`` token t is the target token
    after L'(n) = i accepted drafts. L'(n) = min(L, T - n - 1), and 0 for n = 0 under "eagle"."""
    import numpy as np

    t = np.arange(T)[:, None]
    i = np.arange(L + 1)[None, :]
    n = t - i
    Lp = np.minimum(L, T - n - 1)
    if convention == "eagle":
        Lp = np.where(n == 0, 0, Lp)
    live = n >= 0
    return live & (i < Lp), live & (i == Lp)


def check_chain_rule(verifier, who: str = "log_likelihood") -> None:
    """ValueError (naming ``who``) unless ``verifier`` has the chain rule's accept(p, q, i) and resample(p, q, f,
    rejected): the rules the recursion and the engine's chain rounds call."""
    if not (callable(getattr(verifier, "accept", None)) and callable(getattr(verifier, "resample", None))):
        raise ValueError(f"{who}: verifier must be a chain rule with accept(p, q, i) and resample(p, q, f, "
                         f"rejected) (theory.rules.Verifier); got {type(verifier).__name__}")


def _validate(p, q, tokens, verifier, L, convention, xp):
    """Every check of ``log_likelihood`` (one-line ValueErrors, before any work). Returns (T, V, per_offset,
    draft mask, bonus mask). L is an int >= 1 (``cap_L`` checked it)."""
    check_chain_rule(verifier)
    if convention not in CONVENTIONS:
        raise ValueError(f"log_likelihood: convention must be one of {CONVENTIONS}, got {convention!r}")
    for name, a in (("p", p), ("q", q)):
        if not xp.isdtype(a.dtype, "real floating"):
            raise ValueError(f"log_likelihood: {name} must be a real floating array, got dtype {a.dtype}")
    if p.ndim < 2 or p.shape[-2] < 1 or p.shape[-1] < 1:
        raise ValueError(f"log_likelihood: p must be (..., T, V) with T, V >= 1, got shape {tuple(p.shape)}")
    T, V = p.shape[-2], p.shape[-1]
    if tuple(q.shape) == tuple(p.shape):
        per_offset = False
    elif tuple(q.shape) == (*p.shape[:-1], L, V):
        per_offset = True
    else:
        raise ValueError(f"log_likelihood: q must be (..., T, V) = {tuple(p.shape)} or (..., T, L, V) = "
                         f"{(*p.shape[:-1], L, V)}, got {tuple(q.shape)}")
    if tuple(tokens.shape) != tuple(p.shape[:-1]):
        raise ValueError(f"log_likelihood: tokens must be (..., T) = {tuple(p.shape[:-1])}, got {tuple(tokens.shape)}")
    checks.check_tokens_xp("log_likelihood: tokens", tokens, V, xp)
    draft, bonus = round_masks(T, L, convention)
    dev = array_api_compat.device(p)
    # rows: finite, >= 0, summing to 1 within checks.rows_tol_xp (float32 rounding at least: model rows)
    checks.check_rows_xp("log_likelihood: p", p, xp)
    used = draft[:, :L] if per_offset else draft[:, :L].any(axis=1)       # (T, L) or (T,) q rows read
    tol = checks.rows_tol_xp(q)
    ok = xp.all(q >= 0, axis=-1) & (xp.abs(xp.sum(q, axis=-1) - 1) <= tol)   # NaN fails both
    if not bool(xp.all(ok | ~xp.asarray(used, device=dev))):
        raise ValueError("log_likelihood: q rows that are read must be distributions (finite, >= 0, summing to 1 "
                         f"within {tol:g}); found one that is not")
    return T, V, per_offset, draft, bonus


def cap_L(p, q, L):
    """(L', q'): the draft length capped at T - 1 (at least 1), the most drafts any round of a T-token sequence has
    (``round_masks``: L'(n) = min(L, T - n - 1)), so a huge L costs what T - 1 costs and gives the same law (the
    verifier is read at offsets 1..L' only); a per-offset q (..., T, L, V) is cut to its first L' offsets. L is
    checked first (an int >= 1: one-line ValueError)."""
    import numbers

    if isinstance(L, bool) or not isinstance(L, numbers.Integral) or L < 1:
        raise ValueError(f"log_likelihood: L must be an int >= 1, got {checks.brief(L)}")
    L = int(L)
    shape = getattr(p, "shape", None)
    if shape is None or len(shape) < 2:
        return L, q                           # _validate names the bad shape
    Lc = min(L, max(int(shape[-2]) - 1, 1))
    qs = getattr(q, "shape", None)
    if Lc < L and qs is not None and len(qs) == len(shape) + 1 and int(qs[-2]) == L:
        q = q[..., :Lc, :]
    return Lc, q


def log_likelihood(p: Array, q: Array, tokens: Array, verifier, L: int, *, convention: str = "theory") -> Array:
    """log P^(tokens) (...,) float64 of chain relaxed SD with ``verifier`` and draft length L (module docstring,
    T12). Zeros are exact: a sequence the sampler cannot emit gets -inf. Bad input: one-line ValueError."""
    p, q, tokens = (a if hasattr(a, "shape") and not isinstance(a, (str, bytes)) else
                    checks.array(f"log_likelihood: {n}", a) for n, a in (("p", p), ("q", q), ("tokens", tokens)))
    xp = namespace(p, q, tokens)
    L, q = cap_L(p, q, L)                     # no round drafts more than T - 1 tokens: L above is the same law
    T, V, per_offset, draft, bonus = _validate(p, q, tokens, verifier, L, convention, xp)
    verifier = guarded(verifier)              # a user's rule is checked on the rows it is used on
    dev = array_api_compat.device(p)
    batch = tuple(p.shape[:-2])
    B = math.prod(batch)
    f64 = xp.float64
    if B == 0:
        return xp.zeros(batch, dtype=f64, device=dev)
    N = B * T                              # emissions are per token row: chunks of rows bound the temporaries
    pf = xp.reshape(p, (N, V))
    qf = xp.reshape(q, (N, L, V) if per_offset else (N, V))
    tok = xp.astype(xp.reshape(tokens, (N,)), xp.int64)
    step = max(1, CHUNK_ELEMENTS // (V * L))   # the L offsets are processed jointly (rows, L, V)
    parts = [_emissions(pf[s:s + step], qf[s:s + step], tok[s:s + step], verifier, L, per_offset, xp)
             for s in range(0, N, step)]   # a loop over chunks of rows (memory), each vectorised
    a = xp.reshape(xp.concat([e[0] for e in parts], axis=0), (B, T, L))
    r = xp.reshape(xp.concat([e[1] for e in parts], axis=0), (B, T, L))
    pt = xp.reshape(xp.concat([e[2] for e in parts], axis=0), (B, T))
    out = _forward(a, r, pt, draft, bonus, L, xp, dev)
    return xp.reshape(out, batch)


def _emissions(p, q, tok, verifier, L, per_offset, xp):
    """Token entries of the emissions for a chunk of n token rows: a (n, L) = q_i f_i (x), r (n, L) =
    (1 - beta_i) G^eff_i(x), pt (n,) = p(x), for draft positions i = 1..L (columns i-1). A resampler with
    ``effective_at(p, q, f, x)`` (LANTERN's released laws) gives G^eff at the token without the full row
    (None: not available); otherwise the rule's ``resample(p, q, f)`` row is gathered.

    As the engine does: the rule sees the rows as given, and every draw (draft, replacement, target token)
    is an inverse-CDF draw that normalises its row (``theory.core.xp.sample_categorical``). So the draft law is
    q / sum(q), the rejection mass sum(q (1 - f)) / sum(q), a replacement G(x) / sum(G) and the target
    token p(x) / sum(p). Rows pass validation within float32 rounding of 1; dividing by the sums (not
    assuming 1) keeps P^ the law the engine samples from such rows. (That law is not exactly P under
    vanilla when sum(p) != sum(q): the mass sum(q) - sum(p), ~1e-6 for float32 rows, lands on the
    residual; rows normalised in float64 before the call make vanilla's P^ = P exact, T1.)"""
    f64 = xp.float64
    n, V = p.shape
    dev = array_api_compat.device(p)
    # p and the token are offset-independent: one (n, 1, V) row shared by the L offsets (rules broadcast it,
    # and LANTERN's neighbour masses of p are formed once, not L times); q is (n, L, V) or (n, 1, V)
    p = xp.astype(p, f64)[:, None, :]
    q = xp.astype(q, f64) if per_offset else xp.astype(q, f64)[:, None, :]
    x = tok[:, None]
    f = verifier.accept(p, q, xp.arange(1, L + 1, device=dev))          # (n, L or 1, V): i = 1..L jointly
    _, q, f = xp.broadcast_arrays(p, q, f)          # (n, L, V), or (n, 1, V): the offset-free case, once
    m = f.shape[1]
    xb = xp.broadcast_to(x, (n, m))
    sq = xp.sum(q, axis=-1)
    at = getattr(verifier.resample, "effective_at", None)
    g = at(p, q, f, x) if at is not None else None
    if g is None:
        G = xp.broadcast_to(verifier.resample(p, q, f), (n, m, V))      # effective law (section 6)
        g = gather(G, xb, xp) / xp.sum(G, axis=-1)
    a = gather(q * f, xb, xp) / sq
    # (1 - beta) G^eff(x) = sum_y q(y)(1 - f(y)) G(x|y) (T0; a sum of non-negative terms: exactly 0 when
    # nothing can be rejected)
    r = xp.sum(q * (1 - f), axis=-1) / sq * xp.broadcast_to(g, (n, m))
    pt = p[:, 0, :]
    return xp.broadcast_to(a, (n, L)), xp.broadcast_to(r, (n, L)), gather(pt, tok, xp) / xp.sum(pt, axis=-1)


def _forward(a, r, pt, draft, bonus, L, xp, dev):
    """Scaled forward recursion (module docstring) on emissions a, r (B, T, L), pt (B, T) -> (B,) log P^."""
    B, T = pt.shape
    f64 = xp.float64
    dm = xp.asarray(draft, device=dev)                                   # (T, L+1) bool
    bm = xp.asarray(bonus, device=dev)
    zL = xp.zeros((B, T, 1), dtype=f64, device=dev)
    A = xp.where(dm, xp.concat([a, zL], axis=-1), xp.zeros_like(zL))     # (B, T, L+1): i -> i+1
    R = xp.where(dm, xp.concat([r, zL], axis=-1),                        # (B, T, L+1): i -> 0
                 xp.where(bm, pt[..., None], xp.zeros_like(zL)))
    alpha = xp.concat([xp.ones((B, 1), dtype=f64, device=dev), xp.zeros((B, L), dtype=f64, device=dev)], axis=-1)
    logz = xp.zeros((B,), dtype=f64, device=dev)
    for t in range(T):   # a loop over the T positions, each step O(L) vectorised over images and offsets
        new = xp.concat([xp.sum(alpha * R[:, t], axis=-1, keepdims=True), (alpha * A[:, t])[:, :L]], axis=-1)
        c = xp.sum(new, axis=-1)
        pos = c > 0
        logz = logz + xp.log(xp.where(pos, c, xp.ones_like(c)))
        logz = xp.where(pos, logz, xp.full_like(logz, -math.inf))
        alpha = xp.where(pos[:, None], new / xp.where(pos, c, xp.ones_like(c))[:, None], xp.zeros_like(new))
    # alpha_T lives on offset 0 only (a round never runs past T; draft[T-1] is all False), so the product of
    # the scales is P^; a zero scale anywhere (a sequence the sampler cannot emit) left logz at -inf
    return logz


def log_target(p: Array, tokens: Array) -> Array:
    """log P(tokens) = sum_t log p_t(x_t) (...,) float64 for rows p (..., T, V) and tokens (..., T); -inf where
    some p_t(x_t) = 0 (exact zero, no epsilon). Rows and tokens are validated as in ``log_likelihood``."""
    p, tokens = (a if hasattr(a, "shape") and not isinstance(a, (str, bytes)) else
                 checks.array(f"log_target: {n}", a) for n, a in (("p", p), ("tokens", tokens)))
    xp = namespace(p, tokens)
    if p.ndim < 2 or tuple(tokens.shape) != tuple(p.shape[:-1]):
        raise ValueError(f"log_target: expected p (..., T, V) and tokens (..., T); got p {tuple(p.shape)}, "
                         f"tokens {tuple(tokens.shape)}")
    checks.check_tokens_xp("log_target: tokens", tokens, p.shape[-1], xp)
    checks.check_rows_xp("log_target: p", p, xp)
    pf = xp.astype(p, xp.float64)
    pt = gather(pf, xp.astype(tokens, xp.int64), xp) / xp.sum(pf, axis=-1)   # as drawn: the row normalised
    pos = pt > 0
    lg = xp.where(pos, xp.log(xp.where(pos, pt, xp.ones_like(pt))), xp.full_like(pt, -math.inf))
    return xp.sum(lg, axis=-1)
