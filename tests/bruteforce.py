"""Independent brute-force references for the tests: plain Python loops that follow the algorithm
of docs/theory.md section 1 step by step. Nothing here imports the package under test."""
from __future__ import annotations

import itertools
import math

import numpy as np


class TableRule:
    """f_i(x | prev) = F[i-1, prev, x]; G_i(. | prev) = G[i-1, prev] (ignores the rejected token)."""

    def __init__(self, F, G):
        self.F, self.G = np.asarray(F), np.asarray(G)

    def f(self, i, prev, x, P, Q):
        return float(self.F[i - 1, prev, x])

    def g(self, i, prev, rejected, P, Q):
        return [float(v) for v in self.G[i - 1, prev]]


def algorithm_law(P, Q, rule, L, s):
    """Exact law of x_{1:L+1} (dict tuple -> prob) and E[tau] when the round starts after token s,
    by enumerating drafts, accept/reject outcomes and resampled tokens (virtual extension by P)."""
    V = len(P)
    law: dict[tuple, float] = {}
    e_tau = 0.0

    def extend(prefix, prob):
        # virtually extend to L+1 tokens with the target
        if len(prefix) == L + 1:
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        for y in range(V):
            if P[prefix[-1]][y] > 0:
                extend(prefix + (y,), prob * P[prefix[-1]][y])

    def step(prefix, prev, prob, i):
        nonlocal e_tau
        if i == L + 1:  # all drafts accepted: bonus token from P
            e_tau += prob * L
            for y in range(V):
                if P[prev][y] > 0:
                    extend(prefix + (y,), prob * P[prev][y])
            return
        for x in range(V):
            qx = Q[prev][x]
            if qx == 0:
                continue
            fx = rule.f(i, prev, x, P, Q)
            if fx > 0:
                step(prefix + (x,), x, prob * qx * fx, i + 1)
            if fx < 1:
                e_tau += prob * qx * (1 - fx) * (i - 1)
                g = rule.g(i, prev, x, P, Q)
                for y in range(V):
                    if g[y] > 0:
                        extend(prefix + (y,), prob * qx * (1 - fx) * g[y])

    step((), s, 1.0, 1)
    return law, e_tau


def target_law(P, L, s):
    V = len(P)
    out = {}
    for seq in itertools.product(range(V), repeat=L + 1):
        pr, prev = 1.0, s
        for x in seq:
            pr *= P[prev][x]
            prev = x
        if pr > 0:
            out[seq] = pr
    return out


def tv(law_a: dict, law_b: dict) -> float:
    keys = set(law_a) | set(law_b)
    return 0.5 * sum(abs(law_a.get(k, 0.0) - law_b.get(k, 0.0)) for k in keys)


def effective_g(rule, i, prev, P, Q):
    """Law of the resampled token given a rejection at position i (docs/theory.md section 6)."""
    V = len(P)
    w = [Q[prev][x] * (1 - rule.f(i, prev, x, P, Q)) for x in range(V)]
    tot = sum(w)
    if tot == 0:
        return list(P[prev])
    out = [0.0] * V
    for x in range(V):
        if w[x] > 0:
            g = rule.g(i, prev, x, P, Q)
            for y in range(V):
                out[y] += w[x] * g[y] / tot
    return out


def bound(P, Q, rule, L, s):
    """B by enumerating draft prefixes (T4, written as a sum over x~_{1:i-1})."""
    V = len(P)
    total = 0.0
    for i in range(1, L + 1):
        for drafts in itertools.product(range(V), repeat=i - 1):
            pr, prev = 1.0, s
            for j, x in enumerate(drafts, start=1):
                pr *= Q[prev][x] * rule.f(j, prev, x, P, Q)
                prev = x
            if pr == 0:
                continue
            f = [rule.f(i, prev, x, P, Q) for x in range(V)]
            beta = sum(Q[prev][x] * f[x] for x in range(V))
            g = effective_g(rule, i, prev, P, Q)
            D = 0.5 * sum(abs(Q[prev][x] * f[x] + (1 - beta) * g[x] - P[prev][x]) for x in range(V))
            total += pr * D
    return total


# ----------------------------------------------------------------------------- scalar rule references

def scaled_f(w, p, q):
    return [1.0 if q[x] == 0 else min(1.0, w * p[x] / q[x]) for x in range(len(p))]


def lantern_ptilde(p, neighbors, k, delta=None, lam=None):
    out = []
    for x in range(len(p)):
        thr = delta if delta is not None else (lam - 1) * p[x]
        mass, c = 0.0, 0.0
        for y in neighbors[x][:k]:
            c += p[y]
            if c <= thr:
                mass = c
            else:
                break
        out.append(p[x] + mass)
    return out


def lantern_g(p, q, neighbors, k, rejected, variant):
    V = len(p)
    S = {rejected, *[int(y) for y in neighbors[rejected][: k + 1]]}
    if variant == "p":
        w = [0.0 if y in S else p[y] for y in range(V)]
        t = sum(w)
        return [v / t for v in w] if t > 0 else [1.0 / V] * V
    qz = [0.0 if y in S else q[y] for y in range(V)]
    tq = sum(qz)
    qn = [v / tq for v in qz] if tq > 0 else [0.0] * V
    r = [max(p[y] - qn[y], 0.0) for y in range(V)]
    t = sum(r)
    return [v / t for v in r] if t > 0 else list(p)


def lantern_admitted(p, neighbors, x, delta=None, lam=None):
    """The release's test: the nearest neighbour's mass alone is within the threshold."""
    thr = delta if delta is not None else (lam - 1) * p[x]
    return p[int(neighbors[x][0])] <= thr


def lantern_g_released(p, q, neighbors, k, rejected, variant, delta=None, lam=None):
    """The release's law after rejecting `rejected`: N = k+1 nearest neighbours, removed only if admitted."""
    V = len(p)
    N = {int(y) for y in neighbors[rejected][: k + 1]} if lantern_admitted(p, neighbors, rejected, delta, lam) else set()
    if variant == "p":
        w = [0.0 if (y == rejected or y in N) else p[y] for y in range(V)]
    else:
        w = [max(p[y] - (0.0 if y in N else q[y]), 0.0) for y in range(V)]
    t = sum(w)
    return [v / t for v in w] if t > 0 else [1.0 / V] * V


def typical_f(p, eps, alpha, entropy="exact"):
    if entropy == "exact":
        H = -sum(v * math.log(v) for v in p if v > 0)
    else:  # vLLM / Medusa: log(p + 1e-5)
        H = -sum(v * math.log(v + 1e-5) for v in p)
    thr = min(eps, alpha * math.exp(-H))
    return [1.0 if v > thr else 0.0 for v in p]


def argmax_g(p):
    j = max(range(len(p)), key=lambda x: (p[x], -x))   # first maximiser
    return [1.0 if x == j else 0.0 for x in range(len(p))]


class RowRule:
    """A rule defined by scalar functions of the rows: f(i, p_row, q_row) -> list, g(p, q, f, rejected) -> list."""

    def __init__(self, f_rows, g_rows):
        self.f_rows, self.g_rows = f_rows, g_rows

    def f(self, i, prev, x, P, Q):
        return self.f_rows(i, list(P[prev]), list(Q[prev]))[x]

    def g(self, i, prev, rejected, P, Q):
        p, q = list(P[prev]), list(Q[prev])
        return self.g_rows(p, q, self.f_rows(i, p, q), rejected)


def optimal_g_rows(p, q, f, rejected=None):
    r = [max(p[x] - q[x] * f[x], 0.0) for x in range(len(p))]
    t = sum(r)
    return [v / t for v in r] if t > 0 else list(p)


def residual_g_rows(p, q, f=None, rejected=None):
    """The vanilla residual Norm([p - q]_+), p where it is empty."""
    r = [max(p[x] - q[x], 0.0) for x in range(len(p))]
    t = sum(r)
    return [v / t for v in r] if t > 0 else list(p)


def gsd_f(p, q, emb, window=7, p_thr=0.15, d_thr=0.5):
    """GSD's acceptance replayed token by token as the release's loop does it (junhyukso/GSD, the grouped
    test of SpeculativeSampler): rank the vocabulary by ascending logit (log p; ties by token id), take the
    Python slice [r - window : r + window] of that ranking around the draft's rank r, keep the tokens within
    p_thr in probability and within d_thr in squared embedding distance (d_thr None: no distance test),
    accept with min(1, sum p / sum q) over the kept ones; an empty slice falls back to min(1, p(x)/q(x)).
    q(x) = 0 (never drafted) gives 1 by the package's convention."""
    V = len(p)
    logit = [math.log(v) if v > 0 else -math.inf for v in p]
    order = sorted(range(V), key=lambda y: (logit[y], y))
    out = []
    for x in range(V):
        if q[x] == 0:
            out.append(1.0)
            continue
        r = order.index(x)
        cand = order[r - window: r + window]
        if not cand:
            out.append(min(1.0, p[x] / q[x]))
            continue
        num = den = 0.0
        for y in cand:
            d2 = sum((a - b) ** 2 for a, b in zip(emb[x], emb[y])) if d_thr is not None else 0.0
            if abs(p[y] - p[x]) < p_thr and (d_thr is None or d2 < d_thr):
                num += p[y]
                den += q[y]
        if den > 0:
            out.append(min(1.0, num / den))
        else:                          # the release's num / 0: inf (accepted) or NaN (rejected)
            out.append(1.0 if num > 0 else 0.0)
    return out


def theory_by_enumeration(P, Q, rule, L, init):
    """(E[tau], B, exact TV) averaged over the start law ``init`` (an int or a distribution), by enumeration."""
    V = len(P)
    if isinstance(init, (int, np.integer)):
        mu = np.zeros(V)
        mu[init] = 1.0
    else:
        mu = np.asarray(init, dtype=float)
    e = b = t = 0.0
    for s in np.flatnonzero(mu > 0):
        law, e_s = algorithm_law(P, Q, rule, L, s)
        e += mu[s] * e_s
        b += mu[s] * bound(P, Q, rule, L, s)
        t += mu[s] * tv(law, target_law(P, L, s))
    return e, b, t


# ----------------------------------------------------------------------------- whole sequences (T tokens, many rounds)

def sequence_law(prow, qrow, f_rule, g_rule, L, T, convention="theory"):
    """Law of the T tokens chain SD emits (dict tuple -> prob), by enumerating whole rounds: every draft, accept /
    reject outcome, replacement and target token (docs/theory.md sections 1 and 7). prow(prefix) -> the target row,
    qrow(prefix, i) -> the draft row of the i-th draft, f_rule(i, p, q) -> f (list), g_rule(p, q, f, rejected) -> G
    (list). A round starting with n tokens drafts min(L, T - n - 1) (none at n = 0 under "eagle")."""
    law: dict[tuple, float] = {}
    V = len(prow(()))

    def rounds(prefix, prob):
        n = len(prefix)
        if n >= T:
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        Lp = 0 if (convention == "eagle" and n == 0) else min(L, T - n - 1)
        drafts(prefix, prob, 0, Lp)

    def drafts(cur, prob, i, Lp):
        if prob == 0:
            return
        p = list(prow(cur))
        if i == Lp:
            for x in range(V):
                if p[x] > 0:
                    rounds(cur + (x,), prob * p[x])
            return
        q = list(qrow(cur, i + 1))
        f = f_rule(i + 1, p, q)
        for y in range(V):
            if q[y] == 0:
                continue
            drafts(cur + (y,), prob * q[y] * f[y], i + 1, Lp)
            if f[y] < 1:
                g = g_rule(p, q, f, y)
                for x in range(V):
                    if g[x] > 0:
                        rounds(cur + (x,), prob * q[y] * (1 - f[y]) * g[x])

    rounds((), 1.0)
    return law


def entropy(p):
    """-sum p log p over p > 0 (nats)."""
    return -sum(v * math.log(v) for v in p if v > 0)
