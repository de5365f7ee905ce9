"""Monte Carlo likelihoods: sampled static trees at any vocabulary (docs/theory.md section 11c, T14) and lossless
dynamic trees from sampled trees (section 11d, T15: ``dynamic_log_likelihood_mc``, documented there).

API (array API: numpy, torch; float64):

* ``tree_log_likelihood_mc(p, q, tokens, verifier, tree, *, samples=MC_SAMPLES, groups=MC_GROUPS, seed=0,
  convention="eagle")`` (with ``row_trees=``, ``node_tokens=``, ``weights=`` and no ``tree``: the lossless dynamic
  trees' estimate, ``dynamic_log_likelihood_mc``) -> dict of (...,) float64 arrays:
    "log_p_hat"   the jackknife estimate of log P^(tokens) (bias O(1 / (groups samples)^2), section 11c);
    "log_p_hat_pooled"  log of the pooled unbiased estimate P^_hat (its bias is O(1 / (groups samples)));
    "se"          the jackknife standard error of "log_p_hat" over the groups (Monte Carlo error only);
  plus "samples", "groups" (ints). Inputs as ``theory.likelihood.tree_log_likelihood`` with ``candidates="sampled"``
  (a node's K children drawn without replacement from its draft row, verified with draft_law="without_replacement"):
    p (..., T, V), q (..., T, V) or (..., T, D, V) indexed by round start, tokens (..., T) ints, tree a static Tree.

Where the exact sum over the rejected siblings' identities (V^(K-1) histories per row, ``check_sampled_cost``)
does not fit, each (round start, depth) row's emissions are estimated by sequential importance sampling: the
rejected candidates c_1, c_2, ... are drawn from the rejection law rej_j(c) / beta_j (rej_j = q_j (1 - f_j), beta_j
= sum rej_j, q_j the draft row without the earlier draws, renormalised), the weight W_j = beta_1 ... beta_j, and the
last step of every quantity is summed exactly (Rao-Blackwellised; and a first rejection law with at most
``samples`` tokens is enumerated within each group, ``_Walk.enumerate_first``):
    a_j_hat = W_{j-1} q_j(x) f_j(x),    r_j_hat = W_{j-1} beta_j G_j(x) / sum G_j   (+ exhausted histories' bonus)
with G_j the rule's effective residual law (``resample(p_j, q_j, f_j)``, rejected=None; LANTERN's released laws:
``effective_at``, G_j(x) without the (V, V) mask, relative error below 1e-8). a_1, r_1 are exact. Each
estimate is unbiased for its row's a_j, r_j; a path through the forward recursion reads each row at most once and
rows draw independently, so the forward sum of the estimates is unbiased for P^(x) (multilinear). ``samples`` draws
per group, ``groups`` groups per row: P^_hat uses the pooled rows (groups x samples draws), and the delete-a-group
jackknife over the groups corrects the bias of its logarithm and gives the standard error (section 11c).

Cost: O(groups samples V) per row and candidate rank (x the rule's width), chunked so a chunk's arrays stay within
``MC_CHUNK_ELEMENTS``; no loop over rows or samples (a loop over chunks, ranks and tree levels).
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ..core import checks
from ..core.xp import Array, gather, namespace, normalize, take_last
from ..rules.resampling import Argmax, Optimal, Residual, Target
from ..tree.shapes import RowTrees
from . import tree as _tree
from .tree_walks import path_emissions

__all__ = ["MC_SAMPLES", "MC_GROUPS", "tree_log_likelihood_mc", "dynamic_log_likelihood_mc", "jackknife"]

MC_SAMPLES = 8            # draws per group and row
MC_GROUPS = 8             # groups per row (the jackknife's replicates); 64 draws per row in all
MC_CHUNK_ELEMENTS = 1 << 21   # rows x draws x V per chunk (16 MiB float64 temporaries)
_WHO = "tree_log_likelihood_mc"
_REJECTED_FREE = (Residual, Optimal, Target, Argmax)   # resamplers that ignore ``rejected``


class _Walk:
    """The Monte Carlo node walk (module docstring), with its own generator (``seed``): called on a chunk of rows as
    ``theory.likelihood.tree._static`` calls its walks; returns acc, res (r, K, groups) per-group means."""

    def __init__(self, samples: int, groups: int, rng: np.random.Generator):
        self.M, self.G, self.rng = samples, groups, rng

    def chunk_rows(self, V: int, K: int, width: int) -> int:
        return max(1, MC_CHUNK_ELEMENTS // (self.M * self.G * V * width))

    def enumerate_first(self, rej, beta, c, w, xp):
        """The first rejection's identity summed exactly where its support fits a group: for a row whose rejection
        law rej (r, V) (mass beta (r, 1)) has m <= M tokens, a group's M histories take its support tokens in turn (token i of the
        support gets n_i = ceil or floor of M / m histories) with weight rej(c) M / (beta n_c); other rows keep
        their draws c, w (r, S). Each group's mean then holds the first rejection's sum exactly (section 11c)."""
        S, M = c.shape[1], self.M
        on = rej > 0
        m = xp.sum(xp.astype(on, xp.int64), axis=-1)                            # (r,) support sizes
        small = (m >= 1) & (m <= M)
        if not bool(xp.any(small)):
            return c, w
        dev = array_api_compat.device(rej)
        m1 = xp.maximum(m, xp.ones_like(m))[:, None]                             # (r, 1); rows with m = 0 not used
        slot = xp.arange(S, device=dev) % M                                      # a history's index in its group
        i = slot[None, :] % m1                                                   # (r, S): its support token's rank
        order = xp.argsort(xp.astype(~on, xp.int64), axis=-1, stable=True)       # (r, V): support tokens first
        ce = take_last(order, i, xp)                                             # (r, S) the enumerated tokens
        n = M // m1 + xp.astype(i < (M % m1), xp.int64)                          # histories per support token
        beta = xp.where(beta > 0, beta, xp.ones_like(beta))                      # (rows with m = 0 not used)
        we = take_last(rej, ce, xp) * M / (xp.astype(n, rej.dtype) * beta)
        return xp.where(small[:, None], ce, c), xp.where(small[:, None], we, w)

    def __call__(self, p, q, x, pos, K, verifier, xp):
        r, V = p.shape
        S = self.M * self.G
        dev = array_api_compat.device(p)
        ar = xp.arange(V, device=dev)
        u = xp.asarray(self.rng.random((r, S, max(K - 1, 1))), device=dev)       # the draws' uniforms, float64
        W = xp.ones((r, 1), dtype=p.dtype, device=dev)                           # prod of the betas so far
        ex = xp.zeros((r, 1), dtype=p.dtype, device=dev)                         # exhausted histories' bonus
        P, left, pos = p[:, None, :], q[:, None, :], pos[:, None]
        acc, res = [], []
        for j in range(K):   # a loop over candidate ranks; histories: 1 before the first draw, S after
            H = P.shape[1]
            xb = xp.broadcast_to(x[:, None], (r, H))
            Q = normalize(left, left, xp)                                        # q_j; all zero once exhausted
            live = xp.sum(left, axis=-1) > 0
            f = verifier.accept(P, Q, pos)
            zero = xp.zeros_like(W)
            acc.append(xp.broadcast_to(W * gather(Q * f, xb, xp), (r, S)))
            ex = ex + xp.where(live, zero, W * gather(P, xb, xp) / xp.sum(P, axis=-1))
            rej = Q * (1 - f)                                                    # (r, H, V)
            beta = xp.sum(rej, axis=-1)
            free = isinstance(verifier.resample, _REJECTED_FREE)
            eff = getattr(verifier.resample, "effective_at", None)
            g = None if free or eff is None else eff(P, Q, f, xb)                # LANTERN's released laws: O(V (k+1))
            if g is None:                                                        # the effective law after a rejection
                G = verifier.resample(P, Q, f)
                g = gather(G, xb, xp) / xp.sum(G, axis=-1)
            res.append(xp.broadcast_to(W * xp.where(beta > 0, beta * g, zero) + ex, (r, S)))
            if j == K - 1:
                break
            cdf = xp.cumulative_sum(rej, axis=-1)                                # draw c ~ rej / beta
            c = xp.sum(xp.astype(cdf <= (u[:, :, j] * cdf[:, :, -1])[:, :, None], xp.int64), axis=-1)
            c = xp.minimum(c, xp.full_like(c, V - 1))                            # (r, S); beta = 0: W becomes 0
            w = xp.ones_like(u[:, :, 0])                                         # rej(c) / (beta pi(c)), (r, S)
            if j == 0:                                                           # small supports: enumerated
                c, w = self.enumerate_first(rej[:, 0, :], beta, c, w, xp)
            shape = (r, S, V)
            if free:
                P = xp.broadcast_to(G, shape)
            else:                                                                # LANTERN's laws: G(. | c)
                P = verifier.resample(*(xp.broadcast_to(a, shape) for a in (P, Q, f)), c)
            left = xp.where(ar == c[:, :, None], xp.zeros(shape, dtype=q.dtype, device=dev),
                            xp.broadcast_to(left, shape))
            W = xp.broadcast_to(W * beta, (r, S)) * w
            ex = xp.broadcast_to(ex, (r, S))
        mean = lambda a: xp.mean(xp.reshape(xp.stack(a, axis=1), (r, K, self.G, self.M)), axis=-1)  # noqa: E731
        return mean(acc), mean(res)


def tree_log_likelihood_mc(p: Array, q: Array, tokens: Array, verifier, tree=None, *, samples: int = MC_SAMPLES,
                           groups: int = MC_GROUPS, seed: int = 0, convention: str = "eagle",
                           row_trees: RowTrees | None = None, node_tokens: Array | None = None,
                           weights: Array | None = None) -> dict:
    """Monte Carlo log P^ with its jackknife standard error, the one estimate of either tree kind, as
    ``theory.likelihood.tree_log_likelihood`` is the one exact likelihood: a sampled static ``tree`` (T14, module
    docstring: ``samples`` draws per group, seeded by ``seed``), or with ``row_trees`` (``tree`` None) the lossless
    dynamic trees sampled at every round start, ``node_tokens`` and their importance ``weights``
    (``dynamic_log_likelihood_mc``, T15: the trees are the samples, ``samples`` and ``seed`` are not read)."""
    if row_trees is not None:
        if tree is not None:
            raise ValueError(f"{_WHO}: give tree (a static Tree) or row_trees (dynamic trees), not both")
        return dynamic_log_likelihood_mc(p, q, tokens, verifier, row_trees, node_tokens, groups=groups,
                                         convention=convention, weights=weights)
    for nm, a in (("p", p), ("q", q), ("tokens", tokens)):
        if not array_api_compat.is_array_api_obj(a):
            raise TypeError(f"{_WHO}: {nm} must be an array (numpy, torch or JAX), got {type(a).__name__}")
    M = checks.integer(f"{_WHO}: samples", samples, lo=1)
    G = checks.integer(f"{_WHO}: groups", groups, lo=2)
    seed = checks.integer(f"{_WHO}: seed", seed, lo=0)
    xp = namespace(p, q, tokens)
    T, V, Dp, per_depth = _tree._validate(p, q, tokens, verifier, tree, "sampled", convention, None, None, None, xp)
    dev = array_api_compat.device(p)
    batch = tuple(p.shape[:-2])
    out = {"samples": M, "groups": G}
    B, pf, x, pt, qf = _tree.flat_rows(p, q, tokens, tree.depth, per_depth, xp)
    if B == 0:
        return _empty(out, batch, xp, dev)
    walk = _Walk(M, G, np.random.default_rng(seed))
    Eacc, R, par, dep = _tree._static(pf, qf, x, pt, verifier, tree, "sampled", Dp, per_depth, xp, walk=walk,
                                      extra=(G,))
    # [pooled, leave-group-g-out for g = 1..G] emissions, as one batch of (G + 1) B forward recursions
    pool_e, pool_r = xp.mean(Eacc, axis=-1), xp.mean(R, axis=-1)

    def loo(a, m):   # (B, T, S, G) -> (G, B, T, S) the means without group g (>= 0: rounding)
        a = xp.permute_dims(a, (3, 0, 1, 2))
        return xp.clip((G * m[None] - a) / (G - 1), 0.0, None)
    E = xp.concat([pool_e[None], loo(Eacc, pool_e)], axis=0)
    Rr = xp.concat([pool_r[None], loo(R, pool_r)], axis=0)
    S = E.shape[-1]
    lp = xp.reshape(_tree._forward(xp.reshape(E, ((G + 1) * B, T, S)), xp.reshape(Rr, ((G + 1) * B, T, S)), par, dep,
                                   xp), (G + 1, B))
    jack, se = jackknife(lp[0], lp[1:], xp)
    return {**out, "log_p_hat": xp.reshape(jack, batch), "log_p_hat_pooled": xp.reshape(lp[0], batch),
            "se": xp.reshape(se, batch)}


def _empty(out: dict, batch: tuple, xp, dev) -> dict:
    """The result for no images."""
    z = xp.zeros(batch, dtype=xp.float64, device=dev)
    return {**out, "log_p_hat": z, "log_p_hat_pooled": z, "se": z}


def dynamic_log_likelihood_mc(p: Array, q: Array, tokens: Array, verifier, row_trees: RowTrees, node_tokens: Array, *,
                              groups: int = MC_GROUPS, convention: str = "eagle", weights: Array | None = None) -> dict:
    """Monte Carlo log P^ of lossless dynamic trees (stochastic-beam keys, candidates verified with their draft law
    without replacement; docs/theory/likelihood.md section 11d, T15) from M trees sampled independently at every
    round start, with its jackknife standard error:
        p           (..., T, V)            target rows (as ``tree_log_likelihood``);
        q           (..., T, D, V)         by round start: q[n, d] the drafter's row at the path's depth-d node (the
                    or (..., T, V)         row its children were drawn from); or by position (an independent draft);
        tokens      (..., T)               ints in [0, V);
        row_trees   RowTrees(children (..., T, M, N+1, K), node_depth (..., T, M, N+1), D): tree m of round start n,
                    children ranked in draw order (rows not used, D'(n) = 0, are not read);
        node_tokens (..., T, M, N+1)       their tokens (siblings distinct: a draw without replacement).
        weights     (..., T, M) or None    importance weights of the trees (None: 1; trees drawn from another law
                                           than the construction's, e.g. ``theory.tree.guided_children``: the
                                           likelihood ratio, so that E[weight f(tree)] = E[f(tree)]).
    The M trees of a round start split into ``groups`` equal groups (M divisible by it, >= 2 groups). Returns a dict
    of (...,) float64 arrays as ``tree_log_likelihood_mc``: "log_p_hat" (jackknife), "log_p_hat_pooled" (the log of
    the unbiased pooled estimate), "se" (jackknife SE, Monte Carlo error only), "samples" (trees per group), "groups".

    Given its tree, a round's emissions are exact (``tree_walks.walk_drawn`` along the sequence's path); the state
    space is (depth, tree) so that one round's emissions multiply within one tree, and the round's law is their mean
    over the trees: the forward sum is then unbiased for P^(x) (section 11d)."""
    who = "dynamic_log_likelihood_mc"
    for nm, a in (("p", p), ("q", q), ("tokens", tokens)):
        if not array_api_compat.is_array_api_obj(a):
            raise TypeError(f"{who}: {nm} must be an array (numpy, torch or JAX), got {type(a).__name__}")
    # the scalar checks first, then the arrays' (the tree's checks in one run, the rows' last)
    G = checks.integer(f"{who}: groups", groups, lo=2)
    if not isinstance(row_trees, RowTrees):
        raise ValueError(f"{who}: row_trees must be a theory.tree.RowTrees, got {type(row_trees).__name__}")
    D = checks.integer(f"{who}: row_trees.depth", row_trees.depth, lo=1)
    xp = namespace(p, q, tokens)
    T, V, batch = _tree.check_common(p, tokens, verifier, convention, xp, who)
    Dp = _tree.depth_caps(T, D, convention)
    dev = array_api_compat.device(p)
    M = _tree.check_row_trees(row_trees, node_tokens, batch, T, V, Dp, xp, dev, who, sampled=True)
    if M % G:
        raise ValueError(f"{who}: the {M} trees per round start must split into groups = {G} equal groups")
    per_depth = _tree.check_q(q, p, D, Dp, xp, who, "(the rows the candidates were drawn from)")
    checks.check_rows_xp(f"{who}: p", p, xp)
    if weights is not None:
        if not hasattr(weights, "shape") or tuple(weights.shape) != (*batch, T, M):
            raise ValueError(f"{who}: weights must be (..., T, M) = {(*batch, T, M)}, got "
                             f"{tuple(getattr(weights, 'shape', ()))}")
        wt = xp.astype(xp.asarray(weights, device=dev), xp.float64)
        if not bool(xp.all(xp.isfinite(wt) & (wt >= 0))):
            raise ValueError(f"{who}: weights must be finite and >= 0")
    out = {"samples": M // G, "groups": G}
    B, pf, x, pt, qf = _tree.flat_rows(p, q, tokens, D, per_depth, xp)
    if B == 0:
        return _empty(out, batch, xp, dev)
    N1, K = int(row_trees.children.shape[-2]), int(row_trees.children.shape[-1])
    ch = xp.reshape(xp.astype(xp.asarray(row_trees.children, device=dev), xp.int64), (B, T, M, N1, K))
    ch = xp.where(xp.asarray(Dp >= 1, device=dev)[:, None, None, None], ch, xp.full_like(ch, -1))   # unused rows
    nt = xp.reshape(xp.astype(xp.asarray(node_tokens, device=dev), xp.int64), (B, T, M, N1))
    Eacc, R = path_emissions(pf, x, pt, verifier, ch, nt, D, Dp, xp, q=qf, per_depth=per_depth)   # (B, T, M, D+1)
    # replica weights (G + 1, M): the pooled mean, then the means without group g (the jackknife's replicates),
    # times each tree's importance weight: (G + 1, B, T, M), read where a round enters its tree
    grp = np.arange(M) // (M // G)
    w = np.concatenate([np.full((1, M), 1.0 / M), np.where(grp[None, :] == np.arange(G)[:, None], 0.0,
                                                           1.0 / (M - M // G))])
    w = xp.asarray(w, device=dev)[:, None, None, :]                                            # (G+1, 1, 1, M)
    if weights is not None:
        w = w * xp.reshape(wt, (B, T, M))[None]
    lead = (G + 1, B, T)
    first = Eacc[None, ..., 1] * w                                                            # entering depth 1
    E = xp.concat([first[..., None], xp.broadcast_to(Eacc[None, ..., 2:], (*lead, M, D - 1))], axis=-1)
    root = xp.sum(R[None, ..., 0] * w, axis=-1)                                               # (G+1, B, T)
    Rs = xp.broadcast_to(R[None, ..., 1:], (*lead, M, D))
    E = xp.concat([xp.zeros((*lead, 1), dtype=xp.float64, device=dev), xp.reshape(E, (*lead, M * D))], axis=-1)
    Rs = xp.concat([root[..., None], xp.reshape(Rs, (*lead, M * D))], axis=-1)
    # states: the root, then (tree m, depth d) = 1 + m D + d - 1; a tree's depth-1 state hangs off the root
    dep = np.concatenate([[0], np.tile(np.arange(1, D + 1), M)]).astype(np.int64)
    par = np.arange(-1, M * D, dtype=np.int64)
    par[1::D] = 0
    S = 1 + M * D
    lp = xp.reshape(_tree._forward(xp.reshape(E, ((G + 1) * B, T, S)), xp.reshape(Rs, ((G + 1) * B, T, S)), par, dep,
                                   xp), (G + 1, B))
    jack, se = jackknife(lp[0], lp[1:], xp)
    return {**out, "log_p_hat": xp.reshape(jack, batch), "log_p_hat_pooled": xp.reshape(lp[0], batch),
            "se": xp.reshape(se, batch)}


def jackknife(theta, th, xp):
    """Delete-a-group jackknife (section 11c): theta (n,) the pooled log estimate, th (G, n) the logs without group g
    -> (theta_J, SE_J) (n,). An impossible sequence (theta = -inf) stays -inf with SE 0; where removing a group
    empties a needed row the pooled value is kept with an infinite SE (the jackknife does not apply)."""
    G = th.shape[0]
    ok = xp.all(xp.isfinite(th), axis=0) & xp.isfinite(theta)
    th0 = xp.where(ok[None], th, xp.zeros_like(th))
    mbar = xp.mean(th0, axis=0)
    jack = xp.where(ok, G * theta - (G - 1) * mbar, theta)
    se = xp.sqrt((G - 1) / G * xp.sum((th0 - mbar[None]) ** 2, axis=0))
    se = xp.where(ok, se, xp.where(xp.isfinite(theta), xp.full_like(se, math.inf), xp.zeros_like(se)))
    return jack, se
