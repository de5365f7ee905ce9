"""The exact output law of SJD-PAC (release and ours) by enumeration: the algorithm of real.decode.sjd_pac's docstring
transcribed as plain loops over every outcome of every random draw (independently of the engine's code), for a
target given as a function of the committed prefix (a small Markov chain, or a tiny model's rows).

``pac_law(target, V, T, W, K, D, release)`` -> {sequence: probability} over the V^T sequences. Vanilla verification
at temperature > 0. ``release``: True (the release), False (sjd-pac-p), or a set of the release's departures from
sjd-pac-p to switch on one by one (``DEFECTS``): "verdict" (the longest accepted path, a candidate of no draft mass
passing iff p > 0), "bonus" (a uniform token after the full main branch), "residual" (a failed continued token
replaced from the residual of ALL its level's siblings), "siblings" (a continued level's other candidates drawn
from the row that drew the first, [p - q]_+, not from p without the first). Round 0 samples token 0 from target(()); every window level starts fresh (K distinct uniform
tokens, the uniform draft row).
"""
from __future__ import annotations

import itertools
from functools import lru_cache


def _norm(w):
    s = sum(w)
    return [x / s for x in w] if s > 0 else None


def _residual(p, q):
    """Norm([p - q]_+), p where it has no mass (theory.rules.Residual)."""
    r = _norm([max(a - b, 0.0) for a, b in zip(p, q)])
    return list(p) if r is None else r


def ordered_draws(w, k, V):
    """Every ordered k-tuple of distinct tokens drawn without replacement from weights w (proportional), past the
    tokens of positive weight uniformly among zero-weight ones, with its probability: [(tuple, prob)]."""
    out = []

    def rec(prefix, prob, left):
        if len(prefix) == k:
            out.append((tuple(prefix), prob))
            return
        mass = sum(left[t] for t in range(V) if t not in prefix)
        cands = [t for t in range(V) if t not in prefix]
        for t in cands:   # the next draw
            pt = left[t] / mass if mass > 0 else 1.0 / len(cands)
            if pt > 0:
                rec(prefix + [t], prob * pt, left)
    rec([], 1.0, list(w))
    return out


def tree_paths(W, K, D):
    """The release's layout: all rank paths up to depth D - 1, then the first branch to depth M - 1 (sorted)."""
    nodes = D if K == 1 else (K ** D - 1) // (K - 1)
    M = D + W - nodes
    paths = []
    for d in range(1, D):
        paths += list(itertools.product(range(K), repeat=d))
    paths += [(0,) * d for d in range(D, M)]
    return sorted(set(paths), key=lambda p: (len(p), p)), M


DEFECTS = ("verdict", "bonus", "residual", "siblings")


def pac_law(target, V, T, W, K, D, release, key_digits=12):
    """{sequence: probability} of SJD-PAC with vanilla verification (module docstring)."""
    flags = set(DEFECTS) if release is True else set() if release is False else set(release)
    longest = "verdict" in flags
    paths, M = tree_paths(W, K, D)
    S = M - 1
    uniform = tuple([1.0 / V] * V)

    def width(d):           # candidates that are ever read at depth d: K on the tree levels, the first on the chain
        return K if d <= D - 1 else 1

    def fresh(d):
        return [((c, uniform), pr) for c, pr in ordered_draws(uniform, width(d), V)]

    def key(window):
        return tuple((c, tuple(round(x, key_digits) for x in q)) for c, q in window)

    memo = {}

    def law(prefix, window):
        k = (prefix, key(window))
        if k in memo:
            return memo[k]
        n = len(prefix)
        out = {}
        if n == T:
            out[()] = 1.0
            memo[k] = out
            return out
        cap = min(S, T - n - 1)
        if cap == 0:                      # the last token: a plain step
            for x, px in enumerate(target(prefix)):
                if px > 0:
                    out[(x,)] = out.get((x,), 0.0) + px
            memo[k] = out
            return out
        nodes = [()] + [p for p in paths if len(p) <= cap]
        nodeset = set(nodes)

        def tok(path):
            return window[len(path) - 1][0][path[-1]]

        def ctx(path):
            return prefix + tuple(tok(path[:i + 1]) for i in range(len(path)))

        P = {p: target(ctx(p)) for p in nodes}
        f, after = {}, {}
        for par in nodes:   # siblings' tests: f from the residual rows of the siblings before them
            kids = [par + (j,) for j in range(K) if par + (j,) in nodeset]
            p_j = list(P[par])
            if kids:
                q_left = list(window[len(par)][1])
                for kid in kids:
                    c = tok(kid)
                    q_j = _norm(q_left) or q_left
                    if q_j[c] > 0:
                        f[kid] = min(1.0, p_j[c] / q_j[c])
                    else:        # the release passes a candidate of no draft mass iff p > 0; the walk skips it
                        f[kid] = (1.0 if p_j[c] > 0 else 0.0) if longest else 0.0
                    if longest or q_j[c] > 0:      # the walk leaves the row alone past a skipped candidate
                        p_j = _residual(p_j, q_j)
                    q_left[c] = 0.0
            after[par] = p_j
        drafted = nodes[1:]
        for bits in itertools.product((0, 1), repeat=len(drafted)):   # every pass / fail pattern of the nodes
            pr = 1.0
            passed = {}
            for node, b in zip(drafted, bits):
                pr *= f[node] if b else 1.0 - f[node]
                passed[node] = b
            if pr == 0:
                continue
            if longest:    # the deepest node whose path passes, first in path order
                ok = {(): True}
                for node in drafted:
                    ok[node] = ok[node[:-1]] and passed[node]
                best = max(len(p) for p in nodes if ok[p])
                a = min((p for p in nodes if ok[p] and len(p) == best))
            else:          # recursive rejection sampling: the first passing sibling, level by level
                a = ()
                while True:
                    kids = [a + (j,) for j in range(K) if a + (j,) in nodeset]
                    nxt = next((c for c in kids if passed[c]), None)
                    if nxt is None:
                        break
                    a = nxt
            tau = len(a)
            row = list(uniform) if ("bonus" in flags and tau == S) else after[a]
            committed = tuple(tok(a[:i + 1]) for i in range(tau))
            for y, py in enumerate(row):
                if py == 0:
                    continue
                new_prefix = prefix + committed + (y,)
                levels = []
                for dn in range(1, S + 1):   # the next window's levels
                    e = tau + 1 + dn
                    pp = None
                    if e <= S:
                        pp = a + (0,) * (e - 1 - tau) if e - 1 < D else (0,) * (e - 1)
                        if pp not in nodeset:
                            pp = None
                    if pp is None:
                        levels.append(fresh(dn))
                        continue
                    Pp, qo = P[pp], window[e - 1][1]
                    xp = pp + (0,)
                    has_x = xp in nodeset
                    x = tok(xp) if has_x else None
                    keep = (min(1.0, Pp[x] / qo[x]) if qo[x] > 0 else 1.0) if has_x else 0.0
                    res = _norm([max(a_ - b_, 0.0) for a_, b_ in zip(Pp, qo)]) or list(Pp)
                    rej = list(Pp) if not has_x else (after[pp] if ("residual" in flags and e <= D - 1) else res)
                    opts = {}
                    w = width(dn)
                    if "siblings" in flags:   # one draw of the level's candidates from the row of the first
                        for c, pc in ordered_draws(rej, w, V):
                            opts[c] = opts.get(c, 0.0) + (1 - keep) * pc
                        if keep > 0:
                            for c, pc in ordered_draws(res, max(w - 1, 0), V):
                                cc = (x,) + c
                                opts[cc] = opts.get(cc, 0.0) + keep * pc
                    else:                     # the first candidate, then the others from p without it
                        firsts = {}
                        if keep > 0:
                            firsts[x] = keep
                        for (c,), pc in ordered_draws(rej, 1, V):
                            firsts[c] = firsts.get(c, 0.0) + (1 - keep) * pc
                        for y0, p0 in firsts.items():
                            rest = list(Pp)
                            rest[y0] = 0.0
                            for c, pc in ordered_draws(rest, w - 1, V):
                                cc = (y0,) + c
                                opts[cc] = opts.get(cc, 0.0) + p0 * pc
                    levels.append([((c, tuple(Pp)), pc) for c, pc in opts.items() if pc > 0])
                for combo in itertools.product(*levels):
                    pw = 1.0
                    for _, pl in combo:
                        pw *= pl
                    tail = law(new_prefix, tuple(lv for lv, _ in combo))
                    for s, ps in tail.items():
                        seq = committed + (y,) + s
                        out[seq] = out.get(seq, 0.0) + pr * py * pw * ps
        memo[k] = out
        return out

    first = target(())
    total = {}
    start = None
    for combo in itertools.product(*[fresh(d) for d in range(1, S + 1)]):
        pw = 1.0
        for _, pl in combo:
            pw *= pl
        win = tuple(lv for lv, _ in combo)
        for x0, px in enumerate(first):
            if px == 0:
                continue
            for s, ps in law((x0,), win).items():
                seq = (x0,) + s
                total[seq] = total.get(seq, 0.0) + px * pw * ps
    return total


def markov_target(init, M):
    """target(prefix) of a first-order Markov chain: init row, then row M[last token] (lists of lists)."""
    @lru_cache(maxsize=None)
    def target(prefix):
        return tuple(init) if not prefix else tuple(M[prefix[-1]])
    return target


def markov_law(init, M, T):
    V = len(init)
    out = {}
    for seq in itertools.product(range(V), repeat=T):
        pr = init[seq[0]]
        for a, b in zip(seq, seq[1:]):
            pr *= M[a][b]
        out[seq] = pr
    return out


def tv(a, b):
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
