"""Exact theory of one round of relaxed speculative decoding on order-1 Markov chains (section 4).

P, Q: (V, V) row-stochastic, P[s, x] = P(x | previous token s). Per-position tables
F (L, V, V) with F[i-1, s, x] = f_i(x | s) and G (L, V, V) with G[i-1, s, :] = G_i(. | s), the
(effective) resampling law. ``init`` is the start state (int) or a distribution over states (V,).

Public functions validate their input and compute in float64 numpy. The ``*_xp`` cores behind them
are array-API code with no checks, so they can be traced by JAX (the optimisers differentiate them).

Costs: E[tau] and B are O(L V^2) with vector-matrix products (T8, T9); the exact TV (T7) is a dynamic
programme over prefixes whose size is (number of start states) x V^L.
"""
from __future__ import annotations

import math
import numbers

import array_api_compat
import numpy as np

from .. import rules as _rules
from ..core import checks
from ..core.xp import namespace
from ..rules.discrepancy import discrepancy_of, optimal_discrepancy_of

ROW_SUM_TOL = checks.ROW_SUM_TOL   # |sum of a float64 row - 1| allowed for P, Q and G rows
DEFAULT_MAX_SEQUENCES = 10**8

__all__ = [
    "expected_accepted", "acceptance_probs", "tv_bound", "bound_terms", "exact_tv", "exact_tv_per_state",
    "optimal_resampling", "rule_tables", "sequence_laws", "check_chain", "init_distribution",
    "expected_accepted_xp", "bound_terms_xp", "ROW_SUM_TOL", "DEFAULT_MAX_SEQUENCES", "exact_tv_bytes",
    "tables_bytes", "tables_seconds", "prefix_masses_xp", "bound_terms_optimal_xp",
    "round_terms", "round_terms_xp", "context_free_vanilla",
]


# --------------------------------------------------------------------------- validation

def check_chain(P, Q, copy: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Validate a target/draft pair of V x V row-stochastic matrices (section 4); return float64 copies
    (``copy=False``: float64 inputs as they are, for callers that only read them).
    Rows are checked against the tolerance of the dtype they came in (``checks.row_sum_tol``)."""
    P, p_dtype = checks.float_array("P", P, allow_empty=True, copy=copy)
    Q, q_dtype = checks.float_array("Q", Q, allow_empty=True, copy=copy)
    if P.ndim != 2 or P.shape[0] != P.shape[1] or P.shape[0] < 1:
        raise ValueError(f"P must be a square (V, V) matrix with V >= 1, got shape {P.shape}")
    if Q.shape != P.shape:
        raise ValueError(f"P and Q must have the same shape, got P {P.shape} and Q {Q.shape}")
    checks.stochastic("P", P, p_dtype)
    checks.stochastic("Q", Q, q_dtype)
    return P, Q


def init_distribution(init, V: int) -> np.ndarray:
    """Start distribution mu_0 (V,) of T8-T9 from a start state (int) or a distribution (V,)."""
    if isinstance(init, (bool, np.bool_)):
        raise ValueError(f"init must be a state (int) or a distribution, got the bool {init!r}")
    if isinstance(init, numbers.Integral):
        s = int(init)
        if not 0 <= s < V:
            raise ValueError(f"init state {s} is out of range for V={V}")
        mu = np.zeros(V)
        mu[s] = 1.0
        return mu
    if isinstance(init, numbers.Real):
        raise ValueError(f"init must be a start state (an integer in [0, {V})) or a distribution of shape "
                         f"({V},), got the float {init!r}")
    mu, src = checks.float_array("init", init, allow_empty=True)
    if mu.shape != (V,):
        raise ValueError(f"init must be a state in [0, {V}) or a distribution of shape ({V},), got shape {mu.shape}")
    checks.stochastic("init", mu, src)
    return mu


# --------------------------------------------------------------------------- array-API cores

# Rows per cache block of the numpy float64 path: four (128, V) float64 blocks (F_i, G_i, the scratch, the
# block of A_i) are 4 MiB at V = 1024, so each block is read once from memory and then worked on (and, in
# the public calls, checked) in cache. Measured (bench_theory.py, V = 1024, L = 8, one thread): 64 / 128 /
# 256 rows 1.04x / 1.00x / 0.98x the (unblocked) touch-once numpy work with the checks folded in; unblocked
# validation + core 1.16-1.23x.
_ROW_BLOCK = 128


def _path_terms_xp(Q, F, mu, d_of=None, check=None):
    """(Pr(tau >= i), mu^T A_1 ... A_{i-1} d_i) for i = 1..L (T8, T9), A_i = Q * F_i, each (L,).

    d_of(i, A, work, rows) -> d_i on the states ``rows`` (a slice) from the rows A of A_i already formed
    (None: no path terms, an empty second output); ``work`` is a scratch array of A's shape it may
    overwrite, or None. One A_i and one (V,) @ (V, V) product per position: (V, V) temporaries only, no
    (L, V, V). On float64 numpy input A_i is formed in one buffer reused across positions, block of
    ``_ROW_BLOCK`` rows by block (row-wise operations: the same bits as whole rows), and ``check(i, rows)``,
    if given, is called on each block just before it is used, while it is in cache: False stops the pass
    and returns None (the public calls' folded validation). Elsewhere (array API: JAX traces this) rows is
    ``slice(None)`` and ``check`` must be None."""
    xp = namespace(Q, F, mu)
    V = Q.shape[-1]
    host = array_api_compat.is_numpy_namespace(xp) and Q.dtype == F.dtype == np.float64 and Q.shape == F.shape[1:]
    if check is not None and not host:
        raise ValueError("_path_terms_xp: check needs float64 numpy tables")
    blocks = [slice(r, min(V, r + _ROW_BLOCK)) for r in range(0, V, _ROW_BLOCK)] if host else None
    buf = np.empty_like(Q) if host else None
    work = np.empty((min(V, _ROW_BLOCK), V)) if host and d_of is not None else None
    d = np.empty(V) if host else None
    acc, terms = [], []
    v = mu
    for i in range(F.shape[0]):  # loop over draft positions
        if not host:
            A = Q * F[i]
            if d_of is not None:
                terms.append(v @ d_of(i, A, None, slice(None)))
        else:
            for rows in blocks:  # cache blocks of rows (V / 128 of them), not states
                if check is not None and not check(i, rows):
                    return None
                a = np.multiply(Q[rows], F[i, rows], out=buf[rows])
                if d_of is not None:
                    d[rows] = d_of(i, a, work[:a.shape[0]], rows)
            A = buf
            if d_of is not None:
                terms.append(v @ d)
        v = v @ A
        acc.append(xp.sum(v))
    return xp.stack(acc), (xp.stack(terms) if terms else None)


def acceptance_probs_xp(P, Q, F, mu):
    """Pr(tau >= i) for i = 1..L (T8): mu^T A_1 ... A_i 1 with A_i = Q * F_i, by vector-matrix products."""
    return _path_terms_xp(Q, F, mu)[0]


def expected_accepted_xp(P, Q, F, mu):
    """E[tau] = sum_i Pr(tau >= i)  (T2, T8)."""
    xp = namespace(P, Q, F, mu)
    return xp.sum(acceptance_probs_xp(P, Q, F, mu))


def round_terms_xp(P, Q, F, G, mu):
    """(Pr(tau >= i), per-position terms of B) for i = 1..L in one pass over the tables (T2-T4, T8, T9):
    each A_i = Q * F_i is formed once and serves both the acceptance product and D_i. Array API, no checks."""
    xp = namespace(P, Q, F, G, mu)
    return _path_terms_xp(Q, F, mu, lambda i, A, work, rows: discrepancy_of(A, P[rows], G[i, rows], xp, work))


def bound_terms_xp(P, Q, F, G, mu):
    """Per-position terms of B: mu^T A_1 ... A_{i-1} d_i, d_i the discrepancy of (F_i, G_i)  (T3, T4, T9)."""
    return round_terms_xp(P, Q, F, G, mu)[1]


def bound_terms_optimal_xp(P, Q, F, mu):
    """Per-position terms of B with the optimal resampler G* (T6, T9): d_i = optimal_discrepancy(P, Q, F_i).
    What the optimisers minimise (no G* formed, so no division by 1 - beta in the gradient)."""
    xp = namespace(P, Q, F, mu)
    return _path_terms_xp(Q, F, mu, lambda i, A, work, rows: optimal_discrepancy_of(A, P[rows], xp))[1]


# --------------------------------------------------------------------------- public API (contract)

def _validated(P, Q, F, G, init):
    """The public boundary: (P, Q, F, G, mu_0) checked once, as float64 without copies (the cores only
    read them); the unchecked ``*_xp`` cores run on the result. G or init None: not checked, None back.
    Each table costs one (F) or two (G) vectorised reads when valid (``checks.acceptance_tables``,
    ``checks.resampling_tables``)."""
    P, Q = check_chain(P, Q, copy=False)
    F = checks.acceptance_tables(F, P.shape[0], copy=False)
    if G is not None:
        G = checks.resampling_tables(G, F, copy=False)
    return P, Q, F, G, (None if init is None else init_distribution(init, P.shape[0]))


def acceptance_probs(P, Q, F, init) -> np.ndarray:
    """Pr(tau >= i) for i = 1..L (T8), float64 (L,)."""
    P, Q = check_chain(P, Q, copy=False)
    mu = init_distribution(init, P.shape[0])
    out = _round_terms_checked(P, Q, F, None, mu)
    return out[0] if out is not None else acceptance_probs_xp(*_validated(P, Q, F, None, mu)[:3], mu)


def expected_accepted(P, Q, F, init) -> float:
    """Expected number of accepted drafts E[tau] in one round (T2, T8). Tokens per target call = E[tau] + 1."""
    return float(acceptance_probs(P, Q, F, init).sum())


def bound_terms(P, Q, F, G, init) -> np.ndarray:
    """The L terms of the TV upper bound B (T4, T9), float64 (L,)."""
    return round_terms(P, Q, F, G, init)[1]


def tv_bound(P, Q, F, G, init) -> float:
    """B >= TV(Phat, P): the upper bound of Theorem 2(b) (T3, T4, T9). It can exceed 1."""
    return float(bound_terms(P, Q, F, G, init).sum())


def _round_terms_checked(P, Q, F, G, mu):
    """``round_terms_xp`` (``acceptance_probs_xp`` when G is None) on numpy float64 tables with their validation
    folded into the pass: ``checks.tables_block_ok`` on each block of rows of F_i and G_i just before it is used
    (``_path_terms_xp``'s ``check``). None when the tables are not C-contiguous float64 (L, V, V) or a block is
    refused: the caller then validates in full (which raises the detailed message) and runs the core. P, Q, mu
    already checked."""
    V = P.shape[0]
    ok = (isinstance(F, np.ndarray) and F.dtype == np.float64 and F.flags.c_contiguous and F.ndim == 3
          and F.shape[0] >= 1 and F.shape[1:] == (V, V))
    if G is not None:
        ok = ok and isinstance(G, np.ndarray) and G.dtype == np.float64 and G.flags.c_contiguous \
            and G.shape == F.shape
    if not ok:
        return None
    tol = checks.row_sum_tol(np.float64, V)
    check = lambda i, rows: checks.tables_block_ok(F[i, rows], None if G is None else G[i, rows], tol)  # noqa: E731
    d_of = None if G is None else (lambda i, A, work, rows: discrepancy_of(A, P[rows], G[i, rows], np, work))
    return _path_terms_xp(Q, F, mu, d_of, check=check)


def round_terms(P, Q, F, G, init) -> tuple[np.ndarray, np.ndarray]:
    """(Pr(tau >= i), terms of B) for i = 1..L, each float64 (L,), in one pass over the tables (T2-T4,
    T8, T9): ``E[tau] = acc.sum()``, ``B = terms.sum()``. Cheaper than expected_accepted and tv_bound
    called one after the other (one validation, each A_i = Q * F_i formed once). On float64 tables the
    validation is folded into the pass (``_round_terms_checked``), so it costs about one read of them."""
    P, Q = check_chain(P, Q, copy=False)
    mu = init_distribution(init, P.shape[0])
    out = _round_terms_checked(P, Q, F, G, mu)
    return out if out is not None else round_terms_xp(*_validated(P, Q, F, G, mu))


def optimal_resampling(P, Q, F) -> np.ndarray:
    """G*_i = Norm([P - Q F_i]_+) per position and state (T5); P where beta_i = 1. (L, V, V)."""
    P, Q, F, _, _ = _validated(P, Q, F, None, None)
    return _rules.Optimal()(P[None], Q[None], F)


def tables_bytes(verifier, V: int, L: int) -> int:
    """Estimated peak memory (bytes) of ``verifier.tables`` on (V, V) float64 chain rows.

    Elementwise rules keep about 4L + 2 (V, V) float64 arrays alive (per-position temporaries and the
    stacked (L, V, V) F and G); LANTERN's acceptance (section 6) adds its neighbours' masses one column
    at a time (about 2L + 11 (V, V) arrays, whatever k; a few more where the rows are small enough for a block of
    columns at once; with LANTERN's absolute threshold the whole neighbour sums come first, about 2L + 12, from 2L +
    10 when most codes' neighbours fit under delta to 2L + 14 when none do), and the effective law of our renormalised
    LANTERN++ resampler (``dense_effective_law``; not the released one) forms dense (V_x, V_x, V_y)
    stacks: about 5 float64 arrays of V^3 at its peak; GSD's group acceptance (section 6b) gathers its 2w
    window members into (V, V, 2w) arrays (about 10 w + 2L + 10 (V, V) arrays in all). Measured with
    tracemalloc (tests/test_bad_input.py, tests/test_gsd.py): within 20%."""
    V, L = checks.integer("tables_bytes: V", V, lo=1), checks.integer("tables_bytes: L", L, lo=1)
    acc, res = getattr(verifier, "accept", None), getattr(verifier, "resample", None)
    n = 4 * L + 2
    if isinstance(acc, _rules.Lantern):   # its neighbour masses: a column at a time, or small blocks at once
        from ..rules.prefix_mass import COLUMNS_ABOVE, FIRST_BLOCK, WHOLE_FIRST
        n = 2 * L + 11 + (3 * (FIRST_BLOCK + 1) if V * V * FIRST_BLOCK <= COLUMNS_ABOVE else 0)
        if acc.delta is not None and WHOLE_FIRST:     # (the whole sums first: the prefix scan for a few codes)
            n = 2 * L + 12
    if isinstance(acc, _rules.Grouped) and acc.window > 0:
        n = 10 * int(acc.window) + 2 * L + 10
    cube = 5 * V ** 3 if getattr(res, "dense_effective_law", False) else 0
    return 8 * (n * V * V + cube)


def tables_seconds(verifier, V: int, L: int) -> float:
    """Estimated run time (s) of ``verifier.tables``: a Python step per position (about 0.1 ms) plus about
    150 ns per (V, V) entry and position (measured on one core, V = 4..256: 60-80 us and 90-125 ns; LANTERN's
    k neighbour gathers count k times). An upper-side estimate for the cost guard, not a benchmark."""
    V, L = checks.integer("tables_seconds: V", V, lo=1), checks.integer("tables_seconds: L", L, lo=1)
    acc = getattr(verifier, "accept", None)
    per = 1.5e-7 * V * V * (max(1, int(acc.k)) if isinstance(acc, _rules.Lantern) else 1)
    return L * (1e-4 + per)


def rule_tables(P, Q, L: int, verifier, max_bytes: float | None = checks.MAX_BYTES,
                max_seconds: float | None = checks.MAX_SECONDS) -> tuple[np.ndarray, np.ndarray]:
    """(F, G) tables (L, V, V) of a verifier on this chain (section 4); G is the effective resampling law (section 6).

    ``expected_accepted(P, Q, *rule_tables(P, Q, L, v)[:1], init)`` and
    ``tv_bound(P, Q, *rule_tables(P, Q, L, v), init)`` are one line each. Refused before any work (SizeError)
    when the estimated memory (``tables_bytes``) or time (``tables_seconds``) exceeds its budget (None: none).
    """
    checks.verifier(verifier, "verifier", ("accept", "resample", "tables"))
    L = checks.integer("draft length L", L, lo=1)
    P, Q = check_chain(P, Q)
    V = P.shape[0]
    checks.check_cost(f"rule_tables for {getattr(verifier, 'name', 'this verifier')} (V={V}, L={L})",
                      tables_bytes(verifier, V, L), tables_seconds(verifier, V, L), max_bytes, max_seconds,
                      "pass larger max_bytes / max_seconds if you have them, or use a smaller V or L")
    F, G = verifier.tables(P, Q, L)
    F = np.asarray(F, dtype=np.float64)
    G = np.asarray(G, dtype=np.float64)
    checks.acceptance_tables(F, P.shape[0])
    checks.resampling_tables(G, F)
    return F, G


def exact_tv_bytes(S: int, V: int, L: int) -> int:
    """Estimated peak memory (bytes) of the exact-TV programme (T7) for S start states: the last
    step holds d, the two products summed into the new d and then a (S V^L float64 each), and the
    final |a + d| adds two more: about 4 arrays of S V^L float64 (measured within 20%, see
    tests/test_bad_input.py), plus the (L, V, V) tables."""
    S, V, L = (checks.integer(f"exact_tv_bytes: {k}", x, lo=1) for k, x in (("S", S), ("V", V), ("L", L)))
    return 8 * (4 * S * V ** L + 6 * L * V * V)


def _check_max_sequences(max_sequences):
    if max_sequences is not None:
        checks.integer("max_sequences", max_sequences, lo=1)
    return max_sequences


def _prefix_masses(P, Q, F, G, states, max_sequences, max_bytes=checks.MAX_BYTES):
    """prefix_masses_xp (the T7 programme) after refusing problems above max_sequences / max_bytes."""
    L, V = F.shape[0], P.shape[0]
    n_seq = len(states) * V ** (L + 1)
    need = exact_tv_bytes(len(states), V, L)
    if max_sequences is not None and n_seq > max_sequences:
        raise ValueError(f"max_sequences: exact TV needs {len(states)} start state(s) x V^(L+1) = {len(states)} x "
                         f"{V}^{L + 1} = {checks.fmt_count(n_seq)} sequences, above max_sequences={max_sequences:.3g}; pass a "
                         f"larger max_sequences (or None) if you have about {checks.fmt_bytes(need)} of memory")
    checks.check_memory(f"exact TV over {checks.fmt_count(n_seq)} sequences", need, max_bytes,
                        "pass a larger max_bytes (or None) if you have the memory")
    return prefix_masses_xp(P, Q, F, G, states)


def prefix_masses_xp(P, Q, F, G, states):
    """The dynamic programme of T7, array API without checks (traceable by JAX; theory.markov.objectives and gstar
    differentiates it). P, Q (V, V); F, G (L, V, V); states (S,) int start states, a numpy array (static
    under tracing). Returns (a, d), each (S, V^(L-1), V) over length-L prefixes x_{1:L} (flattened, last
    token last): a = Pr(all L drafts accepted and equal x_{1:L}), d = (mass of Phat that left the round by
    x_{1:L}) - P(x_{1:L}). Then Phat(x_{1:L+1}) - P(x_{1:L+1}) = (d + a) P(x_{L+1} | x_L), so the TV given
    s is 1/2 sum |a + d| (T7). Affine in G."""
    xp = namespace(P, Q, F, G)
    L, V = F.shape[0], P.shape[0]
    A = Q * F                                           # (L, V, V)
    R = (1 - xp.sum(A, axis=-1, keepdims=True)) * G     # (L, V, V): reject at i, then draw from G_i
    idx = xp.asarray(np.asarray(states, dtype=np.int64))
    a = xp.take(A[0], idx, axis=0)[:, None, :]          # (S, 1, V)
    d = xp.take(R[0] - P, idx, axis=0)[:, None, :]
    for i in range(1, L):  # loop over positions; each step is one broadcast product over all prefixes
        S, N, _ = a.shape
        d = xp.reshape(d[..., None] * P + a[..., None] * R[i], (S, N * V, V))
        a = xp.reshape(a[..., None] * A[i], (S, N * V, V))
    return a, d


def exact_tv_per_state(P, Q, F, G, init, max_sequences: int | None = DEFAULT_MAX_SEQUENCES,
                       max_bytes: float | None = checks.MAX_BYTES):
    """TV(Phat(.|s), P(.|s)) over all V^(L+1) continuations, for each start state s with mu_0(s) > 0
    (T7). Returns (states, tvs). ``max_sequences`` / ``max_bytes``: refuse larger problems before
    allocating (None: no limit); the estimate is ``exact_tv_bytes``."""
    _, _, states, a, d = _checked_prefix_masses(P, Q, F, G, init, max_sequences, max_bytes)
    return states, 0.5 * np.abs(a + d).sum(axis=(1, 2))


def _checked_prefix_masses(P, Q, F, G, init, max_sequences, max_bytes=checks.MAX_BYTES):
    """Inputs checked, then the T7 prefix masses from every start state with mu_0(s) > 0:
    (P, F, states, a, d) as ``_prefix_masses``."""
    _check_max_sequences(max_sequences)
    P, Q, F, G, mu = _validated(P, Q, F, G, init)
    states = np.flatnonzero(mu > 0)
    a, d = _prefix_masses(P, Q, F, G, states, max_sequences, max_bytes)
    return P, F, states, a, d


def exact_tv(P, Q, F, G, init, max_sequences: int | None = DEFAULT_MAX_SEQUENCES,
             max_bytes: float | None = checks.MAX_BYTES) -> float:
    """Exact TV(Phat, P) over all V^(L+1) sequences x_{1:L+1} (T7), by dynamic programming over
    positions. With a start distribution, the TV given the start state is averaged over mu_0
    (the prefix is known to the decoder), which is what B bounds."""
    states, tvs = exact_tv_per_state(P, Q, F, G, init, max_sequences, max_bytes)
    mu = init_distribution(init, np.asarray(P).shape[0])
    return float(mu[states] @ tvs)


def sequence_laws(P, Q, F, G, init, max_sequences: int | None = 10**7) -> tuple[np.ndarray, np.ndarray]:
    """The laws of x_{1:L+1} (shape (V,)*(L+1)) under relaxed SD (Phat, T7) and under the target,
    mixed over the start distribution (what a simulator that draws s ~ mu_0 observes)."""
    P, F, states, a, d = _checked_prefix_masses(P, Q, F, G, init, max_sequences)
    mu = init_distribution(init, P.shape[0])
    L, V = F.shape[0], P.shape[0]
    ptrue = P[states][:, None, :]
    for _ in range(1, L):
        S, N, _ = ptrue.shape
        ptrue = (ptrue[..., None] * P).reshape(S, N * V, V)
    phat = (a + d + ptrue)[..., None] * P     # (S, V^(L-1), V, V)
    pt = ptrue[..., None] * P
    shape = (V,) * (L + 1)
    return (np.tensordot(mu[states], phat, axes=1).reshape(shape),
            np.tensordot(mu[states], pt, axes=1).reshape(shape))


def context_free_vanilla(p, q, L: int) -> float:
    """Closed form for i.i.d. (context-free) P, Q under vanilla SD (section 4):
    E[tau] = alpha (1 - alpha^L) / (1 - alpha), alpha = 1 - TV(p, q)."""
    L = checks.integer("context_free_vanilla: L", L, lo=1)
    p = checks.float_array("context_free_vanilla: p", p, ndim=1)[0]
    q = checks.float_array("context_free_vanilla: q", q, ndim=1)[0]
    checks.stochastic("context_free_vanilla: p", p)
    checks.stochastic("context_free_vanilla: q", q)
    alpha = float(np.minimum(p, q).sum())
    if math.isclose(alpha, 1.0):
        return float(L)
    return alpha * (1 - alpha**L) / (1 - alpha)
