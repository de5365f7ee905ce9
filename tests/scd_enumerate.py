"""The exact output law of SJD and of SCD's couplings by enumeration: the process of real.decode.jacobi's docstring
(one image, random initialisation, vanilla verification) transcribed as plain loops over every outcome of every
random draw, independently of the engine's code, for a target given as a function of the committed prefix.

``jacobi_law(target, V, T, W, coupling)`` -> {sequence: probability} over the V^T sequences; ``coupling`` one of
"none" (SJD), "scd-mc" (the release's maximal coupling: the old row kept as q where the old draft was kept),
"scd-mc-p" (ours: the current row as q everywhere). Round 0 samples token 0 from target(()); every new window slot
holds a uniform token with a one-hot q row. Gumbel coupling is not enumerated (its noise is continuous).
"""
from __future__ import annotations

import itertools
from functools import lru_cache


def _residual(p, q):
    """Norm([p - q]_+), p where it has no mass (theory.rules.Residual)."""
    w = [max(a - b, 0.0) for a, b in zip(p, q)]
    s = sum(w)
    return tuple(p) if s <= 0 else tuple(x / s for x in w)


def _hot(t, V):
    return tuple(1.0 if v == t else 0.0 for v in range(V))


def jacobi_law(target, V: int, T: int, W: int, coupling: str = "none") -> dict:
    if coupling not in ("none", "scd-mc", "scd-mc-p"):
        raise ValueError(f"coupling must be none, scd-mc or scd-mc-p, got {coupling!r}")
    S = W - 1
    out: dict = {}

    def inits(carried):
        """Every way the slots past ``carried`` (a tuple of (token, q)) are initialised: [(window, prob)]."""
        m = S - len(carried)
        return [(carried + tuple((t, _hot(t, V)) for t in toks), (1.0 / V) ** m)
                for toks in itertools.product(range(V), repeat=m)]

    def redrafts(P, xs, tau, Lb):
        """Every carried window after a rejection at tau: drafts for k = tau+1..Lb, [(carried, prob)]."""
        opts = []
        for k in range(tau + 1, Lb + 1):   # each position's outcomes: (token, q', prob)
            Pk = P[k]
            if coupling == "none" or k == Lb:          # a fresh draw from the current row (the last row always)
                opts.append([(y, Pk, Pk[y]) for y in range(V) if Pk[y] > 0])
                continue
            x, q = xs[k]
            keep = min(1.0, Pk[x] / q[x])
            res = _residual(Pk, q)
            o = [(x, q if coupling == "scd-mc" else Pk, keep)] if keep > 0 else []
            o += [(y, Pk, (1 - keep) * res[y]) for y in range(V) if (1 - keep) * res[y] > 0]
            opts.append(o)
        outs = []
        for combo in itertools.product(*opts):
            pr = 1.0
            for _, _, pk in combo:
                pr *= pk
            outs.append((tuple((y, q) for y, q, _ in combo), pr))
        return outs

    @lru_cache(maxsize=None)
    def law(prefix, window):
        """{sequence: prob} from committed ``prefix`` with ``window`` (S (token, q) slots)."""
        n = len(prefix)
        if n == T:
            return {prefix: 1.0}
        Lb = max(0, min(S, T - n - 1))
        xs = window[:Lb]
        P = [tuple(target(prefix + tuple(x for x, _ in xs[:k]))) for k in range(Lb + 1)]
        res: dict = {}

        def add(d, w):
            for s, pr in d.items():
                res[s] = res.get(s, 0.0) + w * pr

        reach = 1.0                                    # probability that drafts 0..tau-1 were accepted
        for tau in range(Lb + 1):
            acc = prefix + tuple(x for x, _ in xs[:tau])
            if tau == Lb:                              # every draft accepted: the bonus token from P_Lb
                for z in range(V):
                    if P[Lb][z] > 0:
                        for win, pw in inits(()):
                            add(law(acc + (z,), win), reach * P[Lb][z] * pw)
                break
            x, q = xs[tau]
            a = min(1.0, P[tau][x] / q[x])
            if a < 1:
                r = _residual(P[tau], q)
                for z in range(V):
                    if r[z] > 0:
                        for car, pc in redrafts(P, xs, tau, Lb):
                            for win, pw in inits(car):
                                add(law(acc + (z,), win), reach * (1 - a) * r[z] * pc * pw)
            reach *= a
            if reach == 0:
                break
        return res

    p0 = target(())
    for z in range(V):
        if p0[z] > 0:
            for win, pw in inits(()):
                for s, pr in law((z,), win).items():
                    out[s] = out.get(s, 0.0) + p0[z] * pw * pr
    return out
