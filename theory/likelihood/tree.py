"""Exact likelihood of a tree-drafted relaxed-SD sequence (docs/theory.md section 11b, T13).

API (array API: numpy, torch; everything computed in float64):

* ``tree_log_likelihood(p, q, tokens, verifier, tree, *, candidates="topk", convention="eagle")`` -> (...,) float64
  log P^(tokens), the log-probability that static-tree speculative decoding (section 9: multi-candidate
  verification, candidates tried in rank order, T5 applied recursively) emits ``tokens``, from teacher-forced rows:
    p       (..., T, V)     target rows, p[t] = P(. | x_<t) (processed as the sampler's rows);
    q       (..., T, D, V)  q[n, d] = the drafter's row at the path node of depth d (d = 0..D-1; the root is depth 0)
                            of a round that starts with n tokens committed, i.e. the row that predicts token n + d
                            (indexed by the ROUND START, unlike ``log_likelihood``'s per-offset q, which is indexed by
                            the token: tree q[n, d] = chain q[n + d, d]); or
            (..., T, V)     q[t] = Q(. | x_<t) for a draft whose row ignores the round (independent drafts);
                            entries no round reads (d >= D'(n), below) are not read and may hold anything;
    tokens  (..., T)        ints in [0, V);
    tree    ``theory.tree.Tree`` (D = tree.depth).
  ``candidates``: how a node's m children are made (section 11b):
    "topk" (default; prefix-fixed candidates, EAGLE-1 / LANTERN++ static trees as released): the top-m tokens of the
            node's draft row (ties to the lower token id, as ``real.decode.tree_steps.top_m``), verified with the
            point-mass draft law (``verify_tree(..., draft_law="point")``: q_j = one-hot(c_j));
    "sampled" (our lossless static tree, ``real.decode.tree_steps`` at temperature > 0): a draw without replacement
            from the node's row, verified with draft_law="without_replacement" (q_{j+1} = Norm(q_j without c_j)).
            Exact by summing over the rejected siblings' identities: V^(K-1) histories of V-rows per (round start,
            depth) for K children. Cost per row V^K x width (width: LANTERN's k + 1 neighbour columns, GSD's 2w
            window, else 1; x V more for LANTERN++'s "renormalised" law), refused (NotImplementedError) above
            ``sampled_limit`` (None: no limit; ``SAMPLED_LIMIT`` = 2^22: K = 2 children up to V = 2048 at width 1,
            V = 512 up to LANTERN k = 15 or GSD; K = 3 up to V = 161; K = 4 up to V = 45). Measured at V = 512,
            K = 2 (one shared CPU core): 7-25 ms per row for scaled rules and typical, 0.1-0.25 s for LANTERN k = 7
            and GSD, i.e. 10 s to 4 min for a 256-token image and a depth-4 tree. "topk" costs about K chain steps.
  ``convention``: "eagle" (default, the engine's trees: round 0 is the target's prefill, so token 0 comes from p[0],
  and the first tree round starts at n = 1) or "theory" (the first round drafts from n = 0, the simulator's). A round
  that starts with n tokens uses the tree cut at depth D'(n) = min(D, T - n - 1) (``truncate_tree``; 0 at n = 0 under
  "eagle"): ``depth_caps``.
* dynamic trees (the release's dynamic mode: prefix-fixed top-k candidates, the tree's shape decided per round from
  the drafter's scores): ``tree_log_likelihood(p, None, tokens, verifier, None, candidates="topk",
  row_trees=RowTrees(children (..., T, N+1, K), node_depth (..., T, N+1), depth), node_tokens=(..., T, N+1))``:
  the tree the engine would grow at every round start n (entry n; rounds that never start there, D'(n) = 0, are
  not read), its node tokens (entry 0, the root, not read), verified with the point law (no q). Siblings must carry
  distinct tokens (top-k candidates do), so the node a round has reached is the one whose path spells the sequence.
  ``candidates="sampled"`` with ``row_trees`` (the lossless stochastic-beam trees) has no exact likelihood here:
  NotImplementedError (an unbiased estimate from sampled trees: ``tree_mc.dynamic_log_likelihood_mc``, T15).

The recursion (T13). Per round start n and node v at depth d, the walk at v (residual p_1 = p[n+d], candidates
c_1..c_m, f_j = accept(p_j, q_j, d+1), p_{j+1} = resample(p_j, q_j, f_j, rejected=c_j)) emits token x = x_{n+d}
  as the accepted j-th child:   a_j = E[ prod_{i<j} (1 - f_i(c_i)) f_j(c_j) 1{c_j = x} ]     (state -> that child)
  from the final residual:     r_m = E[ prod_{i<=m} (1 - f_i(c_i)) p_{m+1}(x) / sum p_{m+1} ]  (state -> root)
  as the bonus (m = 0: a leaf, or depth D'(n)):  p[n+d](x) / sum p[n+d]                       (state -> root)
(topk: c_j fixed, one term; sampled: E over the draws, c_j ~ q_j). The hidden state is the node the walk has reached;
with alpha_t(s) = P(x_<t, at node s) (its round started at t - depth(s)), alpha_0 = root and
    alpha_{t+1}(child) = alpha_t(parent) a(child),   alpha_{t+1}(root) = sum_s alpha_t(s) r(s),   P^(x) = alpha_T(root).
Static trees: states = the tree's nodes; a node's walk depends on (n, depth, its number of children) only, so the
emissions are computed per (round start, depth) row for the largest child count of the depth and read off per node.
Dynamic trees: states = depths 0..D along the sequence's own path (the node at depth d of round n is a function of
the sequence). Emissions: a loop over tree levels and candidate ranks, vectorised over (images, round starts), in
chunks of rows; the recursion: a loop over the T positions on (images, states) arrays, rescaled as
``theory.likelihood.chain`` (alpha normalised each step, log-scale accumulated; -inf exactly for an impossible
sequence).
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ..core import checks
from ..core.xp import Array, gather, namespace, normalize, top_m
from ..rules.resampling import Argmax, Optimal, Residual, Target
from ..tree.shapes import RowTrees, Tree
from .chain import CONVENTIONS, check_chain_rule
from .tree_walks import CHUNK_ELEMENTS, chunked, path_emissions, place, rows_at, walk_point

__all__ = ["CANDIDATES", "SAMPLED_LIMIT", "depth_caps", "tree_log_likelihood", "check_sampled_cost"]

CANDIDATES = ("topk", "sampled")
SAMPLED_CHUNK_ELEMENTS = 1 << 24   # elements per chunk of the sampled walks' histories (V^K x width per row)
SAMPLED_LIMIT = 1 << 22    # "sampled": elements per (round start, depth) row, V^K x rule width (module docstring)
_WHO = "tree_log_likelihood"
_REJECTED_FREE = (Residual, Optimal, Target, Argmax)   # resamplers that ignore ``rejected``


def depth_caps(T: int, D: int, convention: str = "eagle") -> np.ndarray:
    """numpy int64 (T,): D'(n) = min(D, T - n - 1), the depth of the tree a round uses when it starts with n tokens
    committed (``truncate_tree``; 0: a plain target step); 0 at n = 0 under "eagle" (round 0 is the prefill)."""
    Dp = np.minimum(D, T - 1 - np.arange(T)).astype(np.int64)
    if convention == "eagle" and T:
        Dp[0] = 0
    return Dp


def _width(verifier) -> int:
    """How many V-sized temporaries per row the rule forms: LANTERN's k+1 neighbour columns, GSD's 2w window."""
    acc = verifier.accept
    k, w = getattr(acc, "k", None), getattr(acc, "window", None)
    if isinstance(k, int) and k > 0:
        return 1 + k
    return 2 * w if isinstance(w, int) and w > 0 else 1


def check_common(p, tokens, verifier, convention, xp, who: str):
    """The checks every tree likelihood makes first (one-line ValueErrors): a chain-rule verifier, the convention, p
    (..., T, V) real floating, tokens (..., T) in [0, V). Returns (T, V, batch)."""
    check_chain_rule(verifier, who)
    if convention not in CONVENTIONS:
        raise ValueError(f"{who}: convention must be one of {CONVENTIONS}, got {convention!r}")
    if not xp.isdtype(p.dtype, "real floating"):
        raise ValueError(f"{who}: p must be a real floating array, got dtype {p.dtype}")
    if p.ndim < 2 or p.shape[-2] < 1 or p.shape[-1] < 1:
        raise ValueError(f"{who}: p must be (..., T, V) with T, V >= 1, got shape {tuple(p.shape)}")
    if tuple(tokens.shape) != tuple(p.shape[:-1]):
        raise ValueError(f"{who}: tokens must be (..., T) = {tuple(p.shape[:-1])}, got {tuple(tokens.shape)}")
    checks.check_tokens_xp(f"{who}: tokens", tokens, p.shape[-1], xp)
    return p.shape[-2], p.shape[-1], tuple(p.shape[:-2])


def check_q(q, p, D: int, Dp: np.ndarray, xp, who: str, what: str) -> bool:
    """Draft rows q (..., T, V) by position or (..., T, D, V) by round start (returns ``per_depth``): a real floating
    array whose rows that are read (depth d < D'(n)) are distributions; one-line ValueError otherwise."""
    *batch, T, V = p.shape
    if q is None or not hasattr(q, "dtype") or not xp.isdtype(q.dtype, "real floating"):
        raise ValueError(f"{who}: q must be a real floating array {what}, got {getattr(q, 'dtype', type(q).__name__)}")
    if tuple(q.shape) == tuple(p.shape):
        per_depth = False
    elif tuple(q.shape) == (*batch, T, D, V):
        per_depth = True
    else:
        raise ValueError(f"{who}: q must be (..., T, V) = {tuple(p.shape)} or (..., T, D, V) = {(*batch, T, D, V)} "
                         f"(D = the tree's depth), got {tuple(q.shape)}")
    used = np.arange(D)[None, :] < Dp[:, None]                                   # (T, D): q[n, d] is read
    if not per_depth:                                                             # q[t] = q[n, t - n] for every n
        n = np.arange(T)[:, None] - np.arange(D)[None, :]                          # (t, d) -> n = t - d
        used = ((n >= 0) & (np.arange(D)[None, :] < Dp[np.maximum(n, 0)])).any(axis=1)
    tol = checks.rows_tol_xp(q)
    ok = xp.all(q >= 0, axis=-1) & (xp.abs(xp.sum(q, axis=-1) - 1) <= tol)        # NaN fails both
    if not bool(xp.all(ok | ~xp.asarray(used, device=array_api_compat.device(q)))):
        raise ValueError(f"{who}: q rows that are read must be distributions (finite, >= 0, summing to 1 within "
                         f"{tol:g}); found one that is not")
    return per_depth


def _validate(p, q, tokens, verifier, tree, candidates, convention, row_trees, node_tokens, limit, xp):
    """Every check (one-line ValueErrors, NotImplementedError for a construction without an exact likelihood), before
    any work. Returns (T, V, D'(n) (T,), per_depth)."""
    if candidates not in CANDIDATES:
        raise ValueError(f"{_WHO}: candidates must be one of {CANDIDATES}, got {candidates!r}")
    T, V, batch = check_common(p, tokens, verifier, convention, xp, _WHO)
    if row_trees is not None:
        if tree is not None:
            raise ValueError(f"{_WHO}: give tree (a static Tree) or row_trees (dynamic trees), not both")
        if not isinstance(row_trees, RowTrees):
            raise ValueError(f"{_WHO}: row_trees must be a theory.tree.RowTrees, got {type(row_trees).__name__}")
        if candidates == "sampled":
            raise NotImplementedError(
                f"{_WHO}: candidates='sampled' with row_trees (the lossless stochastic-beam dynamic trees) has no "
                "exact likelihood here: the tree's shape depends on the Gumbel keys of every node, off-path nodes "
                "included, whose rows are not functions of the sequence; exact: static trees with "
                "candidates='sampled', or dynamic trees with candidates='topk' (the release's prefix-fixed "
                "construction); estimated: theory.likelihood.tree_mc.dynamic_log_likelihood_mc (T15, sampled trees)")
        if q is not None:
            raise ValueError(f"{_WHO}: q must be None with row_trees (the point law reads no draft rows; the "
                             "candidates are node_tokens)")
        D = checks.integer(f"{_WHO}: row_trees.depth", row_trees.depth, lo=1)
        Dp = depth_caps(T, D, convention)
        check_row_trees(row_trees, node_tokens, batch, T, V, Dp, xp, array_api_compat.device(p))
        checks.check_rows_xp(f"{_WHO}: p", p, xp)
        return T, V, Dp, False
    if node_tokens is not None:
        raise ValueError(f"{_WHO}: node_tokens go with row_trees (dynamic trees); a static tree's candidates come "
                         "from q")
    if not isinstance(tree, Tree):
        raise ValueError(f"{_WHO}: tree must be a theory.tree.Tree (or give row_trees=), got {type(tree).__name__}")
    D, K = tree.depth, int(tree.children.shape[1])
    if K > V:
        raise ValueError(f"{_WHO}: the tree has a node with {K} children but V = {V} (m candidates need m tokens)")
    checks.check_rows_xp(f"{_WHO}: p", p, xp)
    Dp = depth_caps(T, D, convention)
    per_depth = check_q(q, p, D, Dp, xp, _WHO, "for a static tree")
    if candidates == "sampled":
        check_sampled_cost(tree, V, verifier, limit)
    return T, V, Dp, per_depth


def check_sampled_cost(tree: Tree, V: int, verifier, limit: int | None = SAMPLED_LIMIT) -> None:
    """NotImplementedError when ``candidates="sampled"`` on ``tree`` at vocabulary V with ``verifier`` exceeds the cost
    guard ``limit`` (None: no limit; module docstring): what ``tree_log_likelihood`` refuses, checkable before any
    rows are computed."""
    nk = (tree.children >= 0).sum(1)
    for d in range(tree.depth):   # a loop over tree levels
        Kd = int(nk[tree.node_depth == d].max())
        cost = V ** Kd * _width(verifier) * (V if getattr(verifier.resample, "dense_effective_law", False) else 1)
        if limit is not None and cost > limit:
            raise NotImplementedError(
                f"{_WHO}: candidates='sampled' with {Kd} children at depth {d} and V = {V} sums over the rejected "
                f"siblings' identities: V^{Kd} x width = {cost:.3g} elements per (round start, depth) row, above "
                f"sampled_limit = {limit:.3g} (fits at width 1: 2 children up to V = 2048, 3 up to V = 161, 4 up "
                "to V = 45); candidates='topk' (prefix-fixed candidates) is exact at the chain's cost")


def check_row_trees(rt, node_tokens, batch, T, V, Dp, xp, dev, who: str = _WHO, sampled: bool = False) -> int:
    """Shapes, dtypes and tree structure of the per-round-start trees, at the round starts that are used (D'(n) >= 1):
    children ints in [-1, N], -1 only as padding after the valid ranks, every child after its parent (a higher index)
    one level deeper, root depth 0, node tokens in [0, V), distinct tokens among siblings. ``sampled``: M trees per
    round start, children (..., T, M, N+1, K) (T15). Returns M (1 when not ``sampled``)."""
    ch, nd, nt = rt.children, rt.node_depth, node_tokens
    if nt is None:
        raise ValueError(f"{who}: row_trees needs node_tokens (..., T, N+1): the token at every node of every "
                         "round's tree")
    if not all(hasattr(a, "shape") and hasattr(a, "dtype") for a in (ch, nd, nt)):
        raise ValueError(f"{who}: row_trees.children, row_trees.node_depth and node_tokens must be integer arrays")
    ch, nd, nt = (xp.asarray(a, device=dev) for a in (ch, nd, nt))
    if not all(xp.isdtype(a.dtype, "integral") for a in (ch, nd, nt)):
        raise ValueError(f"{who}: row_trees.children, row_trees.node_depth and node_tokens must be integer arrays")
    lead = (*batch, T, *ch.shape[len(batch) + 1:len(batch) + 2]) if sampled else (*batch, T)
    form = "(..., T, M, N+1, K)" if sampled else "(..., T, N+1, K)"
    if (ch.ndim != len(lead) + 2 or tuple(ch.shape[:-2]) != lead or ch.shape[-2] < 1 or ch.shape[-1] < 1
            or (sampled and ch.shape[len(batch) + 1] < 1)):
        raise ValueError(f"{who}: row_trees.children must be {form} with (..., T) = {(*batch, T)}, got "
                         f"{tuple(ch.shape)}")
    N1, K = int(ch.shape[-2]), int(ch.shape[-1])
    for name, a in (("row_trees.node_depth", nd), ("node_tokens", nt)):
        if tuple(a.shape) != (*lead, N1):
            raise ValueError(f"{who}: {name} must be {form[:-4]}) = {(*lead, N1)}, got {tuple(a.shape)}")
    ch, nd, nt = (xp.astype(a, xp.int64) for a in (ch, nd, nt))
    used = xp.reshape(xp.asarray(Dp >= 1, device=array_api_compat.device(ch)), (T, *(1,) * (len(lead) - len(batch))))
    valid = ch >= 0
    safe = xp.where(valid & (ch < N1), ch, xp.zeros_like(ch))
    flat = xp.reshape(safe, (*ch.shape[:-2], N1 * K))
    kid_depth = xp.reshape(xp.take_along_axis(nd, flat, axis=-1), ch.shape)
    kid_tok = xp.reshape(xp.take_along_axis(nt, flat, axis=-1), ch.shape)
    idx = xp.arange(N1, device=array_api_compat.device(ch))[:, None]
    struct = (xp.all((ch >= -1) & (ch < N1), axis=-1)
              & xp.all(~valid[..., 1:] | valid[..., :-1], axis=-1)                 # padding only at the end
              & xp.all(~valid | ((ch > idx) & (kid_depth == nd[..., None] + 1)), axis=-1))
    pair = valid[..., :, None] & valid[..., None, :] & (kid_tok[..., :, None] == kid_tok[..., None, :])
    distinct = xp.sum(xp.astype(pair, xp.int64), axis=(-1, -2)) == xp.sum(xp.astype(valid, xp.int64), axis=-1)
    tok_ok = xp.all((nt[..., 1:] >= 0) & (nt[..., 1:] < V), axis=-1) & (nd[..., 0] == 0)
    if not bool(xp.all(struct | ~used)) or not bool(xp.all(tok_ok | ~used[..., 0])):
        raise ValueError(f"{who}: row_trees must hold trees at every used round start: children in [-1, N] (-1 only "
                         f"after the valid ranks), each child after its parent and one level deeper, root depth 0, "
                         f"node tokens in [0, V={V})")
    if not bool(xp.all(distinct | ~used)):
        raise ValueError(f"{who}: siblings must carry distinct tokens (top-k candidates do)")
    return int(ch.shape[len(batch) + 1]) if sampled else 1


def tree_log_likelihood(p: Array, q: Array | None, tokens: Array, verifier, tree: Tree | None = None, *,
                        candidates: str = "topk", convention: str = "eagle", row_trees: RowTrees | None = None,
                        node_tokens: Array | None = None, sampled_limit: int = SAMPLED_LIMIT) -> Array:
    """log P^(tokens) (...,) float64 of tree relaxed SD with ``verifier`` (module docstring, T13): static ``tree`` with
    rows q, or dynamic trees (``row_trees``, ``node_tokens``, q = None). Zeros are exact: a sequence the sampler cannot
    emit gets -inf. Bad input: one-line ValueError; no exact likelihood for the construction: NotImplementedError."""
    for nm, a in (("p", p), ("tokens", tokens)) + ((("q", q),) if q is not None else ()):
        if not array_api_compat.is_array_api_obj(a):
            raise TypeError(f"{_WHO}: {nm} must be an array (numpy, torch or JAX), got {type(a).__name__}")
    xp = namespace(p, tokens) if q is None else namespace(p, q, tokens)
    T, V, Dp, per_depth = _validate(p, q, tokens, verifier, tree, candidates, convention, row_trees, node_tokens,
                                    sampled_limit, xp)
    dev = array_api_compat.device(p)
    batch = tuple(p.shape[:-2])
    B, pf, x, pt, qf = flat_rows(p, q, tokens, None if tree is None else tree.depth, per_depth, xp)
    if B == 0:
        return xp.zeros(batch, dtype=xp.float64, device=dev)
    if row_trees is None:
        Eacc, R, par, dep = _static(pf, qf, x, pt, verifier, tree, candidates, Dp, per_depth, xp)
    else:
        N1, K = int(row_trees.children.shape[-2]), int(row_trees.children.shape[-1])
        ch = xp.reshape(xp.astype(xp.asarray(row_trees.children, device=dev), xp.int64), (B, T, N1, K))
        ch = xp.where(xp.asarray(Dp >= 1, device=dev)[:, None, None], ch, xp.full_like(ch, -1))  # unused: not read
        nt = xp.reshape(xp.astype(xp.asarray(node_tokens, device=dev), xp.int64), (B, T, N1))
        D = int(row_trees.depth)
        Eacc, R = (a[:, :, 0] for a in path_emissions(pf, x, pt, verifier, ch[:, :, None], nt[:, :, None], D, Dp, xp))
        par, dep = np.arange(-1, D, dtype=np.int64), np.arange(D + 1, dtype=np.int64)
    return xp.reshape(_forward(Eacc, R, par, dep, xp), batch)


def flat_rows(p, q, tokens, D: int | None, per_depth: bool, xp):
    """Checked inputs as flat float64 rows: B, p (B, T, V), tokens (B, T) int64, the target's token probability
    (B, T) (its row normalised, as drawn), q (B, T, D, V) (``per_depth``) or (B, T, V), None without q; B = 0: no
    images, (0, None, None, None, None)."""
    T, V = p.shape[-2], p.shape[-1]
    B = math.prod(p.shape[:-2])
    if B == 0:
        return 0, None, None, None, None
    pf = xp.astype(xp.reshape(p, (B, T, V)), xp.float64)
    x = xp.astype(xp.reshape(tokens, (B, T)), xp.int64)
    qf = None if q is None else xp.astype(xp.reshape(q, (B, T, D, V) if per_depth else (B, T, V)), xp.float64)
    return B, pf, x, gather(pf, x, xp) / xp.sum(pf, axis=-1), qf


# --------------------------------------------------------------------------- emissions

def _walk_topk(p, q, x, pos, K, verifier, xp):
    """``walk_point`` with the top-K tokens of the rows q (r, V) as candidates (ties to the lower token id)."""
    cand = top_m(q, K, xp)
    return walk_point(p, cand, x, pos, verifier, xp)


def _walk_sampled(p, q, x, pos, K, verifier, xp):
    """The walk at one node per row with K candidates drawn without replacement from q (r, V) (as given: the draws
    normalise it), summed over the identities of the rejected ones: level j holds the V^j ordered histories
    (c_1..c_j) with weight prod_i q_i(c_i)(1 - f_i(c_i)) (0 for a repeated token), their residual p_{j+1} and draft
    row (q with c_1..c_j removed). A history whose draft row is exhausted skips its remaining candidates (verify_tree's
    ``valid``) and emits from its residual for every larger child count. -> acc (r, K), res (r, K) as ``walk_point``.

    The last rejection enters through the verifier's effective law ``resample(P, Q, f)`` (rejected=None), which is
    sum_c Q(c)(1 - f(c)) G(. | c) / (1 - beta): the actual last candidate's law summed over it. For LANTERN's released
    laws that is the dense (V, V)-mask form (sums of non-negative terms, exact to rounding), not ``effective_at``,
    whose Z(y) = sum(p) - p(y) - p(N(y)) loses up to ~1e-10 relative where the kept mass is small."""
    r, V = p.shape
    dev = array_api_compat.device(p)
    ar = xp.arange(V, device=dev)
    w = xp.ones((r, 1), dtype=p.dtype, device=dev)
    P, left = p[:, None, :], q[:, None, :]
    ex = xp.zeros((r,), dtype=p.dtype, device=dev)       # exhausted histories' residual emissions
    pos = pos[:, None]
    acc, res = [], []
    for j in range(K):   # a loop over candidate ranks; histories grow by a factor V per rank
        H = P.shape[1]
        xb = xp.broadcast_to(x[:, None], (r, H))
        Q = normalize(left, left, xp)                     # q_{j+1}; all zero once exhausted
        live = xp.sum(left, axis=-1) > 0
        f = verifier.accept(P, Q, pos)
        acc.append(xp.sum(w * gather(Q * f, xb, xp), axis=1))
        ex = ex + xp.sum(xp.where(live, xp.zeros_like(w), w * gather(P, xb, xp) / xp.sum(P, axis=-1)), axis=1)
        rej = Q * (1 - f)                                 # (r, H, V): rejecting candidate c
        if j == K - 1:
            G = verifier.resample(P, Q, f)
            g = gather(G, xb, xp) / xp.sum(G, axis=-1)
            res.append(xp.sum(w * xp.sum(rej, axis=-1) * g, axis=1) + ex)
            break
        shape = (r, H, V, V)                              # [history, rejected c, token]
        if isinstance(verifier.resample, _REJECTED_FREE):  # G does not read the rejected token: once per history
            Pn = xp.broadcast_to(verifier.resample(P, Q, f)[:, :, None, :], shape)
        else:                                             # LANTERN's laws, unknown rules: G(. | c) for every c
            Pn = verifier.resample(xp.broadcast_to(P[:, :, None, :], shape), xp.broadcast_to(Q[:, :, None, :], shape),
                                   xp.broadcast_to(f[:, :, None, :], shape), xp.broadcast_to(ar, (r, H, V)))
        gone = ar[:, None] == ar[None, :]                 # (c, token): token c removed
        left = xp.reshape(xp.where(gone, xp.zeros_like(Pn), xp.broadcast_to(left[:, :, None, :], shape)), (r, H * V, V))
        w = xp.reshape(w[:, :, None] * rej, (r, H * V))
        P = xp.reshape(Pn, (r, H * V, V))
        xb = xp.broadcast_to(x[:, None], (r, H * V))
        res.append(xp.sum(w * gather(P, xb, xp) / xp.sum(P, axis=-1), axis=1) + ex)
    return xp.stack(acc, axis=1), xp.stack(res, axis=1)


def _static(p, q, x, pt, verifier, tree, candidates, Dp, per_depth, xp, walk=None, extra: tuple = ()):
    """Node emissions of a static tree indexed by round start: Eacc (B, T, N+1, *extra) (entering node s, which emits
    token n + depth(s) - 1), R (B, T, N+1, *extra) (leaving s for the root with token n + depth(s)); parents and
    depths (numpy). ``walk`` (with ``extra``): another node walk, called as ``walk(p, q, x, pos, K, verifier, xp)``
    on a chunk of rows and returning acc, res (rows, K, *extra) (``theory.likelihood.tree_mc``: per-group Monte
    Carlo estimates, chunked by ``walk.chunk_rows(V, K, width)``)."""
    B, T, V = p.shape
    D, dev = tree.depth, array_api_compat.device(p)
    kids, dep, par = tree.children, tree.node_depth, tree.parent
    nk = (kids >= 0).sum(1)
    Kd = [int(nk[dep == d].max()) for d in range(D)]
    Km = max(Kd)
    sampled = candidates == "sampled"
    width = _width(verifier)
    accs, ress = [], []
    for d in range(D):   # a loop over tree levels: rows = (image, round start n) with D'(n) > d
        ns = np.flatnonzero(Dp > d)
        zero = xp.zeros((B, T, Km, *extra), dtype=xp.float64, device=dev)
        if len(ns) == 0:
            accs.append(zero)
            ress.append(zero)
            continue
        lo, hi = int(ns[0]), int(ns[-1]) + 1                  # contiguous: D'(n) is non-increasing past n = 1
        rp, rx = rows_at(p, lo + d, hi + d, xp), rows_at(x, lo + d, hi + d, xp)
        rq = rows_at(q[:, :, d] if per_depth else q, lo if per_depth else lo + d, hi if per_depth else hi + d, xp)
        pos = xp.full((rp.shape[0],), d + 1, dtype=xp.int64, device=dev)
        step = SAMPLED_CHUNK_ELEMENTS // (V ** Kd[d] * width) if sampled else CHUNK_ELEMENTS // V
        fn = walk or (_walk_sampled if sampled else _walk_topk)
        step = walk.chunk_rows(V, Kd[d], width) if walk is not None else step
        a, r = chunked(lambda *arr: fn(*arr, Kd[d], verifier, xp), (rp, rq, rx, pos), max(1, step), xp)
        pad = xp.zeros((a.shape[0], Km - Kd[d], *extra), dtype=xp.float64, device=dev)
        accs.append(place(xp.concat([a, pad], axis=1), B, T, lo, xp))
        ress.append(place(xp.concat([r, pad], axis=1), B, T, lo, xp))
    acc = xp.reshape(xp.stack(accs, axis=2), (B, T, D * Km, *extra))
    res = xp.reshape(xp.stack(ress, axis=2), (B, T, D * Km, *extra))
    ex = (None,) * len(extra)                                                     # masks broadcast over ``extra``
    s = np.arange(1, len(dep))
    rank = np.argmax(kids[par[1:]] == s[:, None], axis=1)
    e = xp.take(acc, xp.asarray((dep[1:] - 1) * Km + rank, device=dev), axis=2)
    Eacc = xp.concat([xp.zeros((B, T, 1, *extra), dtype=xp.float64, device=dev), e], axis=2)
    live = dep[None, :] <= Dp[:, None]                                            # (T, N+1): node in round n's tree
    has = (nk[None, :] > 0) & (dep[None, :] < Dp[:, None])                        # ... with children there
    Rw = xp.take(res, xp.asarray(np.minimum(dep, D - 1) * Km + np.maximum(nk - 1, 0), device=dev), axis=2)
    tb = np.minimum(np.arange(T)[:, None] + dep[None, :], T - 1)                   # the bonus token n + depth
    Rb = xp.reshape(xp.take(pt, xp.asarray(tb.ravel(), device=dev), axis=1), (B, T, len(dep), *(1,) * len(extra)))
    zero = xp.zeros_like(Rw)
    has, live = xp.asarray(has[(..., *ex)], device=dev), xp.asarray(live[(..., *ex)], device=dev)
    R = xp.where(has, Rw, xp.where(live, Rb, zero))
    return xp.where(live, Eacc, zero), R, par, dep


# --------------------------------------------------------------------------- the recursion

def _forward(Eacc, R, par, dep, xp):
    """Scaled forward recursion (module docstring) on emissions indexed by round start, Eacc, R (B, T, S), over states
    with parents ``par`` and depths ``dep`` (S,) numpy -> (B,) log P^. State s at position t belongs to the round
    started at n = t - dep[s]; entering s at t emits token t from the round started at t + 1 - dep[s]."""
    B, T, S = R.shape
    dev = array_api_compat.device(R)
    f64 = xp.float64
    t = np.arange(T)[:, None]
    ne, nr = t + 1 - dep[None, :], t - dep[None, :]

    def take(a, n):   # a[:, n[t, s], s]
        return xp.take_along_axis(a, xp.broadcast_to(xp.asarray(np.clip(n, 0, T - 1), device=dev), (B, T, S)), axis=1)
    Ed = xp.where(xp.asarray((ne >= 0) & (dep[None, :] >= 1), device=dev), take(Eacc, ne), xp.zeros_like(Eacc))
    Rd = xp.where(xp.asarray(nr >= 0, device=dev), take(R, nr), xp.zeros_like(R))
    pidx = xp.asarray(par[1:], device=dev)
    alpha = xp.concat([xp.ones((B, 1), dtype=f64, device=dev), xp.zeros((B, S - 1), dtype=f64, device=dev)], axis=-1)
    logz = xp.zeros((B,), dtype=f64, device=dev)
    for i in range(T):   # a loop over the T positions, each step O(S) vectorised over images and states
        new = xp.concat([xp.sum(alpha * Rd[:, i], axis=-1, keepdims=True), xp.take(alpha, pidx, axis=1) * Ed[:, i, 1:]],
                        axis=-1)
        c = xp.sum(new, axis=-1)
        pos = c > 0
        logz = xp.where(pos, logz + xp.log(xp.where(pos, c, xp.ones_like(c))), xp.full_like(logz, -math.inf))
        alpha = xp.where(pos[:, None], new / xp.where(pos, c, xp.ones_like(c))[:, None], xp.zeros_like(new))
    # a round never runs past T (D'(n) <= T - n - 1), so alpha_T lives on the root: the scales' product is P^
    return logz
