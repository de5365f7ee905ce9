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

__all__ = ["CONVENTIONS", "log_likelihood", "log_likelihoods", "scaled_weights", "scaled_emissions", "log_target",
           "round_masks", "check_chain_rule"]

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


def _validate(p, q, tokens, L, convention, xp):
    """Every check of the rows (one-line ValueErrors, before any work; the rules are checked by the callers).
    Returns (T, V, per_offset, draft mask, bonus mask). L is an int >= 1 (``cap_L`` checked it)."""
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


def _prepare(p, q, tokens, L, convention, who="log_likelihood"):
    """The checked, flattened inputs of ``log_likelihood`` / ``log_likelihoods`` (one-line ValueErrors, before any
    work): (pf (N, V), qf (N, L, V) or (N, V), tok (N,) int64, L, per_offset, draft, bonus, batch, xp, dev)."""
    p, q, tokens = (a if hasattr(a, "shape") and not isinstance(a, (str, bytes)) else
                    checks.array(f"{who}: {n}", a) for n, a in (("p", p), ("q", q), ("tokens", tokens)))
    xp = namespace(p, q, tokens)
    L, q = cap_L(p, q, L)                     # no round drafts more than T - 1 tokens: L above is the same law
    T, V, per_offset, draft, bonus = _validate(p, q, tokens, L, convention, xp)
    dev = array_api_compat.device(p)
    batch = tuple(p.shape[:-2])
    N = math.prod(batch) * T                  # emissions are per token row: chunks of rows bound the temporaries
    pf = xp.reshape(p, (N, V))
    qf = xp.reshape(q, (N, L, V) if per_offset else (N, V))
    tok = xp.astype(xp.reshape(tokens, (N,)), xp.int64)
    return pf, qf, tok, L, per_offset, draft, bonus, batch, xp, dev


def log_likelihood(p: Array, q: Array, tokens: Array, verifier, L: int, *, convention: str = "theory") -> Array:
    """log P^(tokens) (...,) float64 of chain relaxed SD with ``verifier`` and draft length L (module docstring,
    T12). Zeros are exact: a sequence the sampler cannot emit gets -inf. Bad input: one-line ValueError."""
    check_chain_rule(verifier)
    pf, qf, tok, L, per_offset, draft, bonus, batch, xp, dev = _prepare(p, q, tokens, L, convention)
    return _law(pf, qf, tok, guarded(verifier), L, per_offset, draft, bonus, batch, xp, dev)


def _law(pf, qf, tok, verifier, L, per_offset, draft, bonus, batch, xp, dev):
    """log P^ (batch) of one rule from checked flat rows (``_prepare``): ``_laws`` of that rule alone."""
    return _laws(pf, qf, tok, {0: verifier}, L, per_offset, draft, bonus, batch, xp, dev)[0]


def _laws(pf, qf, tok, verifiers: dict, L, per_offset, draft, bonus, batch, xp, dev) -> dict:
    """{key: log P^ (batch)} of rules ({key: verifier}) from checked flat rows (``_prepare``): the emission pass
    chunk by chunk, every rule on a chunk in turn with one ``memo`` (the chunk's float64 rows, and what the rules'
    ``memo_key`` / ``memo_ok`` share: LANTERN's admitted masses of one (table, k, threshold), its "q" law's
    neighbour sums), then ``_forward`` per rule."""
    B = math.prod(batch)
    if B == 0:
        return {k: xp.zeros(batch, dtype=xp.float64, device=dev) for k in verifiers}
    N, V = pf.shape
    T = N // B
    step = max(1, CHUNK_ELEMENTS // (V * L))   # the L offsets are processed jointly (rows, L, V)
    parts = {k: [] for k in verifiers}
    for s in range(0, N, step):   # a loop over chunks of rows (memory), each vectorised
        memo = {}
        for k, v in verifiers.items():   # a loop over the rules on this chunk
            parts[k].append(_emissions(pf[s:s + step], qf[s:s + step], tok[s:s + step], v, L, per_offset, xp, memo))
    out = {}
    for k, ps in parts.items():   # a loop over the rules: the forward recursion each
        a = xp.reshape(xp.concat([e[0] for e in ps], axis=0), (B, T, L))
        r = xp.reshape(xp.concat([e[1] for e in ps], axis=0), (B, T, L))
        pt = xp.reshape(xp.concat([e[2] for e in ps], axis=0), (B, T))
        out[k] = xp.reshape(_forward(a, r, pt, draft, bonus, L, xp, dev), batch)
    return out


def scaled_weights(verifier, L: int):
    """The weights (L,) float64 numpy of ``verifier`` when it is scaled acceptance f_i = min(1, w_i p/q) with G*
    (``rules.Scaled`` + ``rules.Optimal``; the schedule read at positions 1..L as the rule reads them, a float64
    array) or vanilla (``rules.Vanilla`` + ``rules.Residual``: w = 1, G* = Norm([p - q]_+), the same law, T1/T5);
    None for any other rule, or weights that are not finite and > 0 (row-dependent schedules included)."""
    import numpy as np

    from ..rules.acceptance import Scaled, Vanilla
    from ..rules.resampling import Optimal, Residual

    a, g = getattr(verifier, "accept", None), getattr(verifier, "resample", None)
    if type(a) is Vanilla and type(g) is Residual:
        return np.ones(L)
    if not (type(a) is Scaled and type(g) is Optimal):
        return None
    try:
        w = np.asarray(a.schedule(np.arange(1, L + 1, dtype=np.float64), np), dtype=np.float64)
    except (TypeError, ValueError):
        return None
    w = np.broadcast_to(w, (L,)) if w.ndim == 0 else w
    return w.copy() if w.shape == (L,) and np.all(np.isfinite(w)) and np.all(w > 0) else None


def scaled_emissions(W, px, qx, sp, sq, zvan, rej, xp):
    """Emissions a, r (..., L) of scaled acceptance with G* (f = min(1, w p/q)) at the tokens, from sufficient
    statistics (``theory.likelihood.objective`` module docstring): weights W (..., L), p(x) px (..., 1), q_i(x) qx,
    sum p sp (..., 1), sum q_i sq, Z_van = sum [p - q_i]_+ zvan and the rejection mass rej = sum [q_i - w_i p]_+
    (..., L). a = min(q(x), w p(x)) / sum q; r = rej / sum q * G*(x) with G*(x) = [p(x) - min(q(x), w p(x))]_+ / Z,
    Z = sum p - sum q + rej (w < 1) or Z_van (w >= 1), and p(x) / sum p where Z = 0. The one formula of the numpy
    grid pass (``log_likelihoods``) and the JAX objective."""
    mn = xp.minimum(qx, W * px)
    num = xp.maximum(px - mn, xp.zeros_like(mn))
    Z = xp.where(W < 1, sp - sq + rej, zvan)
    pos = Z > 0
    g = xp.where(pos, num / xp.where(pos, Z, xp.ones_like(Z)), px / sp)
    return mn / sq, rej / sq * g


def log_likelihoods(p: Array, q: Array, tokens: Array, verifiers: dict, L: int, *, convention: str = "theory") -> dict:
    """{key: log P^(tokens) (...,) float64} of every rule of ``verifiers`` ({key: verifier}) on the same rows: the
    rows checked once; a rule with ``scaled_weights`` (scaled acceptance with G*, vanilla) from sufficient
    statistics formed once per chunk of rows (p(x), q(x), sum p, sum q, Z_van) and one pass over the rows for its
    rejection mass rej = sum [q - w p]_+ (``scaled_emissions``), in place of its full emission pass; every other
    rule by ``log_likelihood``'s pass. Equal to ``log_likelihood`` rule by rule to float64 rounding (the same law,
    T12; tests/test_likelihood_grid.py). Bad input: one-line ValueError."""
    if not isinstance(verifiers, dict):
        raise ValueError(f"log_likelihoods: verifiers must be a dict {{key: verifier}}, got {type(verifiers).__name__}")
    for v in verifiers.values():
        check_chain_rule(v, "log_likelihoods")
    pf, qf, tok, L, per_offset, draft, bonus, batch, xp, dev = _prepare(p, q, tokens, L, convention,
                                                                          "log_likelihoods")
    weights = {k: scaled_weights(v, L) for k, v in verifiers.items()}
    out = _laws(pf, qf, tok, {k: guarded(v) for k, v in verifiers.items() if weights[k] is None}, L, per_offset,
                draft, bonus, batch, xp, dev)                       # the other rules: their emission passes
    fast = {k: w for k, w in weights.items() if w is not None}
    if fast:
        import numpy as np

        with np.errstate(divide="ignore", invalid="ignore"):   # rows that are never read may hold anything
            out.update(_scaled_laws(pf, qf, tok, fast, L, per_offset, draft, bonus, batch, xp, dev))
    return {k: out[k] for k in verifiers}


def _rejection(p, q, W, xp):
    """sum_y [q_y - w_i p_y]_+ (n, L) for p (n, 1, V), q (n, L or 1, V), W (L,) float64 (numpy: in place, four passes;
    a NaN entry, which only rows never read can hold, gives NaN rather than 0)."""
    if array_api_compat.is_numpy_array(p):
        import numpy as np

        e = np.multiply(W[:, None], p)                                                 # (n, L, V)
        np.subtract(q, e, out=e)
        np.maximum(e, 0.0, out=e)
        return e.sum(axis=-1)
    e = q - W[:, None] * p
    return xp.sum(xp.where(e > 0, e, xp.zeros_like(e)), axis=-1)


def _scaled_laws(pf, qf, tok, weights: dict, L, per_offset, draft, bonus, batch, xp, dev) -> dict:
    """``log_likelihoods``' scaled rules ({key: w (L,)}): statistics once per chunk of rows, rej per rule."""
    B = math.prod(batch)
    if B == 0:
        return {k: xp.zeros(batch, dtype=xp.float64, device=dev) for k in weights}
    N, V = pf.shape
    T = N // B
    f64 = xp.float64
    Ws = {k: xp.asarray(w, dtype=f64, device=dev) for k, w in weights.items()}
    parts = {k: [] for k in weights}
    pts = []
    step = max(1, CHUNK_ELEMENTS // (V * L))
    for s in range(0, N, step):   # a loop over chunks of rows (memory), each vectorised over rows, offsets and V
        p = xp.astype(pf[s:s + step], f64)[:, None, :]                                 # (n, 1, V)
        q = xp.astype(qf[s:s + step], f64) if per_offset else xp.astype(qf[s:s + step], f64)[:, None, :]
        x = tok[s:s + step][:, None]
        n = p.shape[0]
        px = gather(p, x, xp)[:, :, None]                                              # (n, 1, 1) -> p(x)
        px = xp.reshape(px, (n, 1))
        qx = gather(q, xp.broadcast_to(x, (n, q.shape[1])), xp)                        # (n, L or 1)
        sp = xp.sum(p, axis=-1)                                                        # (n, 1)
        sq = xp.sum(q, axis=-1)
        d = p - q
        zvan = xp.sum(xp.where(d > 0, d, xp.zeros_like(d)), axis=-1)                   # sum [p - q]_+
        pts.append(px[:, 0] / sp[:, 0])
        for k, W in Ws.items():   # a loop over the scaled rules: one pass over the rows each
            rej = _rejection(p, q, W, xp)                                              # (n, L) sum [q - w p]_+
            Wb = xp.broadcast_to(W, (n, L))
            parts[k].append(scaled_emissions(Wb, px, qx, sp, sq, zvan, rej, xp))
    pt = xp.reshape(xp.concat(pts, axis=0), (B, T))
    out = {}
    for k, ps in parts.items():   # a loop over the scaled rules: the forward recursion each
        a = xp.reshape(xp.concat([xp.broadcast_to(e[0], (e[0].shape[0], L)) for e in ps], axis=0), (B, T, L))
        r = xp.reshape(xp.concat([e[1] for e in ps], axis=0), (B, T, L))
        out[k] = xp.reshape(_forward(a, r, pt, draft, bonus, L, xp, dev), batch)
    return out


def _emissions(p, q, tok, verifier, L, per_offset, xp, memo=None):
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
    memo = {} if memo is None else memo      # one chunk's: the float64 rows, and what rules share (``_laws``)
    if "rows" not in memo:
        memo["rows"] = (xp.astype(p, f64)[:, None, :], xp.astype(q, f64) if per_offset else xp.astype(q, f64)[:, None, :])
    p, q = memo["rows"]
    x = tok[:, None]
    key = getattr(verifier.accept, "memo_key", None)     # equal keys: the same f on the same rows (LANTERN's)
    f = memo.get(key) if key is not None else None
    if f is None:
        f = verifier.accept(p, q, xp.arange(1, L + 1, device=dev))      # (n, L or 1, V): i = 1..L jointly
        if key is not None:
            memo[key] = f
    _, q, f = xp.broadcast_arrays(p, q, f)          # (n, L, V), or (n, 1, V): the offset-free case, once
    m = f.shape[1]
    xb = xp.broadcast_to(x, (n, m))
    sq = xp.sum(q, axis=-1)
    wk = None if key is None else ("rejection", key)                   # rules with one f share its rejection mass
    if wk is not None and wk in memo:
        w, ws = memo[wk]
    else:
        w = q * (1 - f)                                                 # (n, m, V) rejection mass
        ws = xp.sum(w, axis=-1)
        if wk is not None:
            memo[wk] = (w, ws)
    at = getattr(verifier.resample, "effective_at", None)
    g = None if at is None else at(p, q, f, x, memo=memo, w=w) if getattr(verifier.resample, "memo_ok", False) \
        else at(p, q, f, x)
    if g is None:
        G = xp.broadcast_to(verifier.resample(p, q, f), (n, m, V))      # effective law (section 6)
        g = gather(G, xb, xp) / xp.sum(G, axis=-1)
    a = gather(q, xb, xp) * gather(f, xb, xp) / sq                      # (q f)(x): the same product, at x only
    # (1 - beta) G^eff(x) = sum_y q(y)(1 - f(y)) G(x|y) (T0; a sum of non-negative terms: exactly 0 when
    # nothing can be rejected)
    r = ws / sq * xp.broadcast_to(g, (n, m))
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
