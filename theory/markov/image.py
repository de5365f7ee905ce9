"""Whole-image predictions for a time-homogeneous order-1 chain (docs/theory.md section 7).

An image is T tokens produced by successive rounds. Convention (shared with ``sim`` and ``real``):
with n tokens generated so far, a round drafts L' = min(L, T - n - 1) tokens with the rule's first L'
positions (F_1..F_L', G_1..G_L'); when L' = 0 (one token left) the round is a single target step that
draws one token from P. Each round starts from the last generated token (the first from ``init``).

Round kernels: from state s, with A_i = Q * F_i and R_i[s, :] = (1 - beta_i(s)) G_i(.|s),
  K_j = A_1 ... A_{j-1} R_j        (exactly j tokens: j - 1 accepted drafts, rejection at j), j <= L'
  K_{L'+1} = A_1 ... A_{L'} P      (all L' drafts accepted, bonus token from P)
K_j[s, s'] = Pr(the round yields j tokens and ends in s'). The round's state law is *not* the chain's
marginal: it is the law of the relaxed process at a round boundary, carried by the recursion
  pi_0 = mu_0,   pi_{n+j} += pi_n K_j^{(L'(n))}     over n = 0..T-1,
where pi_n[s] = Pr(a round boundary falls after n tokens and token n is s). Then
  E[target calls] = sum_{n<T} |pi_n|,   accumulated bound = sum_{n<T} pi_n . b^{(L'(n))},
b^{(l)}[s] = sum_{i<=l} (A_1..A_{i-1} d_i)[s] the per-round TV bound (T4, T9) of a round of l drafts
from s (0 for a single target step). By a hybrid argument (swap one round at a time for the target),
the accumulated bound bounds the TV between the whole-image law and the target's.

Cost: a sequential loop over n with O(L V^2) work per step (one (V,) @ (V, (L+1) V) product with the
stacked kernels of a full-length round, formed once in O(L V^3) when V <= 2 T), plus O(L^2 V^2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core import checks
from ..rules.discrepancy import discrepancy
from . import tables as markov

__all__ = ["ImagePrediction", "image_prediction", "predict_image", "round_kernels", "round_bounds",
           "round_speedup", "draft_lengths", "image_bytes", "expected_batch_rounds", "batch_speedup"]


def _check_costs(cost_ratio, verify_cost, verify_per_token) -> tuple[float, float, float]:
    return (checks.real("cost_ratio", cost_ratio, 0), checks.real("verify_cost", verify_cost, 0, lo_open=True),
            checks.real("verify_per_token", verify_per_token, 0))


def draft_lengths(T: int, L: int) -> np.ndarray:
    """L'(n) = min(L, T - n - 1) for n = 0..T-1 (tokens already generated)."""
    T = checks.integer("T", T, lo=1)
    L = checks.integer("L", L, lo=1)
    return np.minimum(L, T - 1 - np.arange(T))


def round_kernels(P, Q, F, G, ell: int) -> np.ndarray:
    """K (ell + 1, V, V): K[j-1, s, s'] = Pr(a round of ell drafts from s yields j tokens, the last s').
    Rows of K summed over j and s' are 1. Uses positions 1..ell of F, G. O(ell V^3)."""
    P, Q = markov.check_chain(P, Q)
    F = checks.acceptance_tables(F, P.shape[0])
    G = checks.resampling_tables(G, F)
    ell = checks.integer("ell", ell, lo=0)
    if ell > F.shape[0]:
        raise ValueError(f"ell={ell} drafts need {ell} positions of F, G; they have {F.shape[0]}")
    A = Q * F
    R = (1 - A.sum(-1, keepdims=True)) * G
    return _kernels(A, R, P, ell)


def _kernels(A, R, P, ell: int) -> np.ndarray:
    V = P.shape[0]
    out = np.empty((ell + 1, V, V))
    M = np.eye(V)
    for j in range(ell):  # loop over draft positions
        out[j] = M @ R[j]
        M = M @ A[j]
    out[ell] = M @ P
    return out


def round_bounds(P, Q, F, G) -> np.ndarray:
    """b (L + 1, V): b[l, s] = the TV bound (T4, T9) of a round of l drafts from state s (b[0] = 0)."""
    P, Q = markov.check_chain(P, Q)
    F = checks.acceptance_tables(F, P.shape[0])
    G = checks.resampling_tables(G, F)
    return _round_bounds(P, Q, F, G)


def _round_bounds(P, Q, F, G) -> np.ndarray:
    L, V = F.shape[0], P.shape[0]
    d = discrepancy(P, Q, F, G)           # (L, V): D_i(s), T3
    A = Q * F
    b = np.zeros((L + 1, V))
    for i in range(1, L + 1):                    # u = A_1 ... A_{i-1} d_i, applied right to left
        u = d[i - 1]
        for k in range(i - 2, -1, -1):
            u = A[k] @ u
        b[i] = b[i - 1] + u
    return b


@dataclass
class ImagePrediction:
    """Whole-image expectations for T tokens (section 7).

    expected_rounds: E[number of target forward calls] (rounds, including single target steps);
    expected_draft_steps: E[number of drafted tokens]; expected_single_steps: E[rounds with L' = 0];
    accumulated_bound: E[sum over rounds of the round's TV bound] (bounds the whole-image TV; may exceed 1);
    tokens_per_call: T / expected_rounds; boundary_mass: (T + 1,) Pr(a round boundary after n tokens)."""
    T: int
    L: int
    expected_rounds: float
    expected_draft_steps: float
    expected_single_steps: float
    accumulated_bound: float
    tokens_per_call: float
    boundary_mass: np.ndarray

    def speedup(self, cost_ratio: float, verify_cost: float = 1.0, verify_per_token: float = 0.0) -> float:
        """Predicted wall-clock speed-up over plain AR decoding (T target steps of cost 1):
        T / E[time], time = sum over rounds of L' c + verify_cost + verify_per_token (L' + 1) for a
        drafted round and 1 for a single target step. c = cost_ratio = draft step / target step."""
        c, v, k = _check_costs(cost_ratio, verify_cost, verify_per_token)
        drafted_rounds = self.expected_rounds - self.expected_single_steps
        time = (self.expected_draft_steps * (c + k) + drafted_rounds * (v + k) + self.expected_single_steps)
        return self.T / time

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.pop("boundary_mass")
        return d


CHUNK = 4096    # state laws per window of image_prediction (memory CHUNK x V floats; output independent)


def image_prediction(P, Q, F, G, T: int, init, max_bytes: float | None = checks.MAX_BYTES) -> ImagePrediction:
    """Exact expected target calls, draft steps and accumulated TV bound for a T-token image
    (section 7), by the recursion over (tokens generated, last state) in the module docstring.
    F, G (L, V, V): the rule's per-position tables (markov.rule_tables); init: start state or law.

    Streaming: the state laws pi_n are kept in a sliding window of CHUNK + L + 2 rows (the recursion
    only adds to pi_{n+1} .. pi_{n+L+1}), so memory is O(L V^2 + T) (the T + 1 floats of ``boundary_mass``) whatever T;
    time is O(T L V^2). ``max_bytes`` refuses larger problems before allocating (None: no limit)."""
    P, Q = markov.check_chain(P, Q)
    F = checks.acceptance_tables(F, P.shape[0])
    G = checks.resampling_tables(G, F)
    T = checks.integer("T", T, lo=1)
    mu = markov.init_distribution(init, P.shape[0])
    L, V = F.shape[0], P.shape[0]
    use_kcat = V <= 2 * T
    checks.check_memory(f"image_prediction (T={T}, V={V}, L={L})", image_bytes(T, V, L, use_kcat), max_bytes,
                        "pass a larger max_bytes if you have the memory")
    A = Q * F
    R = (1 - A.sum(-1, keepdims=True)) * G
    b = _round_bounds(P, Q, F, G)
    # full-length rounds (all but the last L values of n) apply the stacked kernels K^(L) (V, (L+1) V)
    # in one product; forming them costs O(L V^3), worth it unless V is large compared with T
    Kcat = _kernels(A, R, P, L).transpose(1, 0, 2).reshape(V, (L + 1) * V) if use_kcat else None
    C = min(T, CHUNK)                            # window: pi_m for m in [base, base + C + L + 1]
    buf = np.zeros((C + L + 2, V))
    buf[0] = mu
    mass = np.zeros(T + 1)
    bound = 0.0
    base = 0
    for n in range(T):  # sequential recursion over tokens generated; each step is O(L V^2)
        k = n - base
        if k == C:                               # slide the window: keep the L + 1 laws still open
            buf[:L + 1] = buf[C:C + L + 1]
            buf[L + 1:] = 0.0
            base, k = n, 0
        ell = min(L, T - 1 - n)
        v = buf[k]
        mass[n] = v.sum()
        bound += float(v @ b[ell])
        if Kcat is not None and ell == L:
            buf[k + 1:k + L + 2] += (v @ Kcat).reshape(L + 1, V)
            continue
        for j in range(ell):
            buf[k + j + 1] += v @ R[j]
            v = v @ A[j]
        buf[k + ell + 1] += v @ P
    mass[T] = buf[T - base].sum()
    ells = draft_lengths(T, L)
    rounds = float(mass[:T].sum())
    return ImagePrediction(T, L, rounds, float(mass[:T] @ ells), float(mass[:T] @ (ells == 0)), bound,
                           T / rounds, mass)


def image_bytes(T: int, V: int, L: int, kcat: bool = True) -> int:
    """Estimated peak memory (bytes) of ``image_prediction``: the (T + 1,) boundary masses with the
    (T,) draft lengths and their products at the end (about 3 T floats), the (L, V, V) tables A, R,
    F, G and their temporaries, and the stacked kernels (L + 1) V^2 twice while they are formed."""
    window = (min(T, CHUNK) + L + 2) * V
    return 8 * (3 * (T + 1) + window + (6 * L + 4) * V * V + (2 * (L + 1) * V * V if kcat else 0))


def predict_image(P, Q, verifier, L: int, T: int, init, max_bytes: float | None = checks.MAX_BYTES) -> ImagePrediction:
    """image_prediction (section 7) for a verifier (theory.rules) with draft length L. T is checked
    (and the memory estimated) before the tables are built."""
    T = checks.integer("T", T, lo=1)
    P, Q = markov.check_chain(P, Q)
    checks.check_memory(f"image_prediction (T={T}, V={P.shape[0]}, L={L})",
                        image_bytes(T, P.shape[0], checks.integer("L", L, lo=1)), max_bytes,
                        "pass a larger max_bytes if you have the memory")
    F, G = markov.rule_tables(P, Q, L, verifier, max_bytes)
    return image_prediction(P, Q, F, G, T, init, max_bytes)


def round_speedup(tokens_per_round: float, L: int, cost_ratio: float, verify_cost: float = 1.0,
                  verify_per_token: float = 0.0) -> float:
    """Per-round speed-up model (section 7, Leviathan et al.): E[tau + 1] / (L c + verify_cost
    + verify_per_token (L + 1)). tokens_per_round = E[tau + 1] (not E[tau]) lies in [1, L + 1]."""
    L = checks.integer("L", L, lo=1)
    c, v, k = _check_costs(cost_ratio, verify_cost, verify_per_token)
    t = checks.real("tokens_per_round", tokens_per_round)
    if not (1.0 <= t <= L + 1):
        raise ValueError(f"tokens_per_round = E[tau + 1] must lie in [1, L + 1] = [1, {L + 1}], got "
                         f"{tokens_per_round!r} (pass E[tau] + 1, not E[tau])")
    return t / (L * (c + k) + v + k)


def expected_batch_rounds(rounds, B: int) -> float:
    """Rounds a batch of B images runs: every image waits for the slowest, so E[max of B independent draws]
    from the empirical law of the per-image round counts ``rounds`` (n,) (measured, or from
    ``image_prediction`` samples). Exact order statistic of the empirical distribution F:
    sum_x x (F(x)^B - F(x^-)^B)."""
    B = checks.integer("B", B, lo=1)
    r = np.asarray(rounds, dtype=np.float64).reshape(-1)
    if r.size == 0 or not np.isfinite(r).all() or (r < 1).any():
        raise ValueError("rounds must be a non-empty array of per-image round counts >= 1")
    x, counts = np.unique(r, return_counts=True)
    F = np.cumsum(counts) / r.size
    F_before = np.concatenate([[0.0], F[:-1]])
    return float(x @ (F ** B - F_before ** B))


def batch_speedup(rounds, B: int, T: int, ar_step: float, round_cost: float) -> float:
    """Predicted wall-clock speed-up of speculative decoding over plain AR decoding, both batched over B
    images (section 7's unit-cost model at batch size B): T a(B) / (E[max_B rounds] r(B)), with a(B) the
    time of one AR step of the whole batch and r(B) the time of one speculative round of the whole batch
    (its draft steps, target pass and verifier), both measured at batch size B. As B grows a forward
    turns from memory-bound to compute-bound, r(B) / a(B) grows towards the tokens a round processes, and
    the speed-up falls below 1."""
    T = checks.integer("T", T, lo=1)
    a, c = float(ar_step), float(round_cost)
    if not (a > 0 and c > 0 and math.isfinite(a) and math.isfinite(c)):
        raise ValueError(f"ar_step and round_cost must be positive finite times, got {ar_step!r}, {round_cost!r}")
    return T * a / (expected_batch_rounds(rounds, B) * c)
