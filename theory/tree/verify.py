"""Static draft trees (EAGLE-1 / LANTERN++ setting) and multi-candidate verification.

A tree is given as a list of paths of child ranks, as in EAGLE's "choices" lists: ``(0,)`` is the
first candidate after the root, ``(0, 1)`` the second candidate after that one, and so on. Node 0 is the
root (the last accepted token); nodes 1..N are the paths sorted by (depth, path).

Multi-candidate verification at a node (docs/theory.md section 9): the node's candidates c_1..c_m were
drafted from its draft row q *without replacement* (q_1 = q, q_{j+1} = Norm(q_j with c_j removed)).
They are tried in rank order: c_j is accepted with probability f(c_j) computed by the acceptance rule
from the current residual target row p_j and the current draft row q_j; on rejection the residual
becomes the resampling rule applied to (p_j, q_j, f, rejected=c_j) -- Norm([p_j - q_j f]_+) for G*
(T5 applied recursively), LANTERN's own update for the LANTERN baseline. If all candidates are rejected
the next token is drawn from the final residual; after accepting a leaf, the bonus token comes from the
leaf's target row. With vanilla f this is recursive rejection sampling and is lossless.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat
import numpy as np

from ..core import checks
from ..core.xp import Array, gather, gather_rows, namespace, normalize, sample_categorical, take_last, top_m
from ..rules.acceptance import accept_at, reads_f
from ..rules.chain import verify_chain
from ..rules.walks import follow_chosen, host_walk
from .shapes import RowTrees, Tree

__all__ = ["DRAFT_LAWS", "TreeVerdict", "verify_tree", "verify_tree_nodes", "verify_round", "draft_without_replacement"]


# How a node's candidates were drafted (section 10): "without_replacement" = a sequential draw without replacement
# from the node's draft row q (the walk's q_j = Norm(q with c_1..c_{j-1} removed)); "point" = deterministic
# candidates (the draft's top-k, as the EAGLE-2 / LANTERN releases), whose conditional draft law is the point
# mass at c_j (q_j = one-hot(c_j): vanilla then accepts with p_j(c_j), the release's ``qx = 1``).
DRAFT_LAWS = ("without_replacement", "point")



class TreeVerdict(NamedTuple):
    accepted: Array    # (...,) int64: accepted drafts (depth reached)
    path: Array        # (..., D) int64: accepted nodes by depth, -1 after the last
    next_token: Array  # (...,) int64: resampled token, or the bonus token after a leaf
    last_node: Array   # (...,) int64: the last accepted node (0 = root)




def draft_without_replacement(q: Array, m: int, gumbel: Array | None = None, *,
                              exponential: Array | None = None) -> Array:
    """The first m candidates of a node (section 9): a sequential draw without replacement from rows q (..., V). Give
    either Gumbel(0, 1) noise ``gumbel`` (..., V) (Gumbel-top-k: the m largest log q + g) or Exp(1) noise
    ``exponential`` (..., V) (the exponential race: the m largest q / e, the same order as gumbel = -log e, in
    one division instead of two logarithms). Returns (..., m) int64 in draw order. Tokens with q = 0 come last
    (keys -inf, or 0); callers must not ask for more than the support size."""
    if (gumbel is None) == (exponential is None):
        raise ValueError("give exactly one of gumbel= and exponential= noise")
    xp = namespace(q, gumbel if exponential is None else exponential)
    if exponential is not None:
        keys = q / exponential      # e > 0 (e = inf gives key 0: drawn last, as q = 0)
    else:
        pos = q > 0
        keys = xp.where(pos, xp.log(xp.where(pos, q, xp.ones_like(q))) + gumbel, xp.full_like(q, -float("inf")))
    topk = getattr(keys, "topk", None)
    if topk is not None:    # torch: the m largest keys, sorted (distinct with probability 1), without a full sort
        return topk(m, dim=-1, largest=True, sorted=True).indices
    return top_m(keys, m, xp)


def _residual(verifier, p: Array, q: Array, pos, c: Array, rej: Array, xp, f_c: Array | None = None) -> Array:
    """The residual target rows after a step of the walk (..., V): ``verifier.resample(p, q, f, rejected=c)`` where
    ``rej`` (...,), p elsewhere. The full acceptance row f only for a resampler that reads it (``reads_f``: G*). On
    numpy rows (the host path) the law is built for the rejecting rows only; on others (the device path) for every
    row, with no data-dependent shape, at O(V + k) per row for LANTERN's laws. ``f_c`` (...,): the acceptance at c
    under the point law (q = one-hot(c)), where the resampler's own ``point(p, c, f_c)`` law serves (the same bits,
    without the acceptance row or the one-hot's arithmetic)."""
    if isinstance(p, np.ndarray):
        if not rej.any():
            return p
        r = np.nonzero(rej)
        pr, qr, cr = p[r], q[r], c[r]
        pr_pos = pos[r] if getattr(pos, "ndim", 0) else pos
        f = verifier.accept(pr, qr, pr_pos) if reads_f(verifier.resample) else None
        out = p.copy()
        out[r] = verifier.resample(pr, qr, f, cr)
        return out
    at_point = None if f_c is None else getattr(verifier.resample, "point", None)
    g = None if at_point is None else at_point(p, c, f_c)
    if g is None:
        f = verifier.accept(p, q, pos) if reads_f(verifier.resample) else None
        g = verifier.resample(p, q, f, c)
    return xp.where(rej[..., None], g, p)


def _check_round_args(tree, verifier, who: str, tree_needed: bool = False) -> None:
    """The verifier and the tree of a round (cheap: type checks only): one-line TypeError naming ``who``."""
    checks.verifier(verifier, f"{who}: verifier")
    if (tree is not None or tree_needed) and not hasattr(tree, "children"):
        raise TypeError(f"{who}: tree must be a theory.tree.Tree or RowTrees{'' if tree_needed else ' (None: a chain)'}, "
                        f"got {type(tree).__name__}")


def verify_tree(p: Array, q: Array, tokens: Array, u_accept: Array, u_sample: Array, tree: "Tree | RowTrees", verifier, *,
                early_exit: bool = False, max_depth: Array | None = None,
                draft_law: str = "without_replacement") -> TreeVerdict:
    """Multi-candidate verification of one static-tree round (section 9; T5 applied recursively), batched over leading dims.

    Shapes (N = tree.n_nodes, node 0 = root):
      p        (..., N+1, V)  target rows after each node's path (node 0: after the accepted prefix)
      q        (..., N+1, V)  draft rows each node's children were drawn from (unused for leaves)
      tokens   (..., N+1)     drafted token at each node (entry 0 ignored)
      u_accept (..., N+1)     one uniform per node: candidate n is accepted iff u_accept[n] < f(token[n])
      u_sample (...,)         uniform for the final token
      max_depth (...,)        optional int: the walk of that round stops at this depth (its tree truncated
                              there, as ``real.decode.engine`` does at the end of an image in a ragged batch);
                              default: the whole tree
    ``tree``: a static ``Tree`` shared by every round, or ``RowTrees`` (children (..., N+1, K)), one tree per
    round (dynamic trees, section 10). ``draft_law`` (``DRAFT_LAWS``): "point" for deterministic candidates (q_j =
    one-hot(c_j); q unused).
    The walk loops over at most N + depth steps (a static bound, not over batch elements); every step
    tries one candidate for every unfinished round. ``early_exit=True`` stops as soon as every round has
    finished (same result: finished rounds no longer change; one host sync per step, so not for JAX
    tracing); the real-model engine uses it, a round typically needing far fewer steps than the bound.
    """
    if draft_law not in DRAFT_LAWS:
        raise ValueError(f"draft_law must be one of {DRAFT_LAWS}, got {draft_law!r}")
    _check_round_args(tree, verifier, "verify_tree", tree_needed=True)
    point = draft_law == "point"
    xp = namespace(p, q)
    dev = array_api_compat.device(p)
    V = p.shape[-1]
    batch = tuple(tokens.shape[:-1])
    per_row = isinstance(tree, RowTrees)
    children = xp.asarray(tree.children, device=dev)                             # (N+1, K) or (*batch, N+1, K)
    n_kids = xp.sum(xp.astype(children >= 0, xp.int64), axis=-1)                 # (N+1,) or (*batch, N+1)
    K = children.shape[-1]
    tokens = xp.astype(tokens, xp.int64)
    zero_i = xp.zeros(batch, dtype=xp.int64, device=dev)
    node, rank, depth = zero_i, zero_i, zero_i
    active = xp.ones(batch, dtype=xp.bool, device=dev)
    cap = (xp.full(batch, tree.depth, dtype=xp.int64, device=dev) if max_depth is None
           else xp.astype(xp.asarray(max_depth, device=dev), xp.int64))
    p_res = p[..., 0, :]
    removed = xp.zeros((*batch, V), dtype=xp.bool, device=dev)
    path = xp.full((*batch, tree.depth), -1, dtype=xp.int64, device=dev)
    ar_depth = xp.arange(tree.depth, device=dev)
    ar_V = xp.arange(V, device=dev)

    def kids_of(node):
        """(..., K) the children of each round's current node, and (...,) how many it has."""
        if per_row:
            return gather_rows(children, node, xp), gather(n_kids, node, xp)
        flat = xp.reshape(node, (-1,))
        return (xp.reshape(xp.take(children, flat, axis=0), (*batch, K)),
                xp.reshape(xp.take(n_kids, flat, axis=0), batch))

    def untried(node, rank, depth):
        """(...,) bool: the round's current node has a candidate left to try, within its depth cap."""
        return (rank < kids_of(node)[1]) & (depth < cap)

    for _ in range(tree.n_nodes + tree.depth + 1):
        if early_exit and not bool(xp.any(active)):
            break
        kid_row, n_here = kids_of(node)
        kid = gather(kid_row, xp.minimum(rank, xp.full_like(rank, K - 1)), xp)
        has = active & (rank < n_here) & (depth < cap)
        kid_safe = xp.where(has, kid, zero_i)
        c = gather(tokens, kid_safe, xp)
        if point:        # deterministic candidates: the draft's conditional law is the point mass at c_j
            q_j = xp.astype(ar_V == c[..., None], p.dtype)
        else:
            q_node = gather_rows(q, node, xp)
            q_left = xp.where(removed, xp.zeros_like(q_node), q_node)
            q_j = normalize(q_left, q_left, xp)                                   # all zero once exhausted
        # rounds at a leaf (depth = D) have no candidate (has = False): their f is unused, so the position is
        # clamped to D (schedules defined on positions 1..D only, e.g. Explicit weights, accept it)
        pos = xp.minimum(depth + 1, xp.full_like(depth, tree.depth))
        valid = has & (gather(q_j, c, xp) > 0)                                    # impossible candidates are skipped
        acc = valid & (gather(u_accept, kid_safe, xp) < accept_at(verifier.accept, p_res, q_j, pos, c))
        rej = valid & ~acc
        # advance the state of every round at once (the residual built for the rounds that rejected only)
        p_res = xp.where(acc[..., None], gather_rows(p, kid_safe, xp), _residual(verifier, p_res, q_j, pos, c, rej, xp))
        removed = xp.where(acc[..., None], xp.zeros_like(removed), removed | (rej[..., None] & (ar_V == c[..., None])))
        path = xp.where(acc[..., None] & (ar_depth == depth[..., None]), kid_safe[..., None], path)
        node = xp.where(acc, kid_safe, node)
        depth = depth + xp.astype(acc, xp.int64)
        rank = xp.where(acc, zero_i, rank + xp.astype(has & ~acc, xp.int64))
        active = active & has  # a round stops when its current node has no untried candidate left
        if early_exit:         # ... which is known now: the round need not come back for an empty step
            active = active & untried(node, rank, depth)
    return TreeVerdict(depth, path, sample_categorical(p_res, u_sample, xp), node)



def verify_tree_nodes(p: Array, q: Array, tokens: Array, u_accept: Array, u_sample: Array, tree: "Tree | RowTrees",
                      verifier, *, max_depth: Array | None = None,
                      draft_law: str = "without_replacement") -> TreeVerdict:
    """``verify_tree``'s verdict in a fixed number of array operations, with no read-back (the engine's device path).

    Arguments and shapes as ``verify_tree``. The walk's state at a node depends only on the node: arriving there
    (by accepting it) sets the residual to p[n] and forgets the rejected siblings, so the k-th candidate of node n
    meets the same residual p_k and draft row q_k whatever path led to n. Hence every node's candidates are tried
    at once, rank by rank (K steps over (..., N+1, V) rows, K the most children a node has): node n's chosen child
    is its first candidate accepted under p_k, q_k (T5 applied recursively), and the residual it keeps when none is.
    The walk then only follows chosen children from the root (D gathers). Same uniforms, same operations per row
    as ``verify_tree``: the same verdict (tests/test_tree_nodes.py checks it against ``verify_tree`` on random
    trees, rules and caps). Costs K (N+1) rows where the walk touches one per candidate tried: for devices, where
    launches and read-backs cost more than rows."""
    if draft_law not in DRAFT_LAWS:
        raise ValueError(f"draft_law must be one of {DRAFT_LAWS}, got {draft_law!r}")
    point = draft_law == "point"
    xp = namespace(p, q)
    dev = array_api_compat.device(p)
    V, N1, D = p.shape[-1], tokens.shape[-1], int(tree.depth)
    batch = tuple(tokens.shape[:-1])
    children = xp.asarray(tree.children, device=dev)
    K = children.shape[-1]
    children = xp.broadcast_to(children, (*batch, N1, K))                       # (..., N+1, K)
    node_depth = xp.broadcast_to(xp.asarray(tree.node_depth, device=dev), (*batch, N1))
    tokens = xp.astype(tokens, xp.int64)
    cap = (xp.full(batch, D, dtype=xp.int64, device=dev) if max_depth is None
           else xp.astype(xp.asarray(max_depth, device=dev), xp.int64))
    open_ = node_depth < cap[..., None]                                          # (..., N+1) tries its candidates
    pos = xp.minimum(node_depth + 1, xp.full_like(node_depth, D))                # its candidates' 1-based position
    flat = (*batch, N1)
    p_res = p
    q_left = q                                      # q with each node's rejected candidates zeroed (not for "point")
    chosen = xp.full(flat, -1, dtype=xp.int64, device=dev)                      # (..., N+1) accepted child, or -1
    decide = None if point else getattr(verifier.accept, "decide_at", None)     # (LANTERN's: ``Lantern.decide_at``)
    ar_V = xp.arange(V, device=dev)
    for j in range(K):   # a loop over candidate ranks (K <= a handful), every node of every round at once
        kid = children[..., j]
        has = (kid >= 0) & open_ & (chosen < 0)
        kid_safe = xp.where(has, kid, xp.zeros_like(kid))
        c = take_last(tokens, kid_safe, xp)                                         # (..., N+1) candidate tokens
        hit = ar_V == c[..., None]                                                  # (..., N+1, V) one-hot of c
        if point:
            q_j = xp.astype(hit, p.dtype)
        else:
            q_j = normalize(q_left, q_left, xp)                                     # all zero once exhausted
        valid = has & (gather(q_j, c, xp) > 0)                                      # impossible candidates skipped
        u_c = take_last(u_accept, kid_safe, xp)
        if decide is not None:   # (f itself is read by no residual here: decided from the rule's bounds where they do)
            acc = decide(p_res, q_j, pos, c, u_c, want=valid)[0]
        else:
            f_c = accept_at(verifier.accept, p_res, q_j, pos, c)
            acc = valid & (u_c < f_c)
        rej = valid & ~acc
        p_res = _residual(verifier, p_res, q_j, pos, c, rej, xp, f_c if point else None)
        if not point:    # (the same values as q with every rejected candidate's entry zeroed, in one pass)
            q_left = xp.where(rej[..., None] & hit, xp.zeros((), dtype=q.dtype, device=dev), q_left)
        chosen = xp.where(acc, kid, chosen)
    lead = int(np.prod(batch, dtype=np.int64))                                  # the chosen children followed
    path, depth, node = follow_chosen(xp.reshape(chosen, (lead, N1)), D, None, xp)   # (caps: in ``open_``)
    path, depth, node = xp.reshape(path, (*batch, D)), xp.reshape(depth, batch), xp.reshape(node, batch)
    return TreeVerdict(depth, path, sample_categorical(gather_rows(p_res, node, xp), u_sample, xp), node)


def verify_round(p: Array, q: Array | None, tokens: Array, u_accept: Array, u_sample: Array, tree, verifier, *,
                 law: str = "without_replacement", max_depth: Array | None = None) -> TreeVerdict:
    """One round's verification, chains and trees alike: the engine's one entry (``real.decode.round``).

    Shapes (N drafted nodes, node 0 the root, the last committed token; any leading batch dims ``...``):
      p         (..., N+1, V)  target rows at every node (node 0: after the committed prefix)
      q         (..., N+1, V)  draft rows each node's candidates were drawn from (chains: (..., N, V), draft k drawn
                               from row k - 1); None only with ``law="point"`` (deterministic candidates)
      tokens    (..., N+1)     node tokens (entry 0, the root, is not read)
      u_accept  (..., N+1)     acceptance uniforms: a tree's node k reads column k; a chain's draft k reads column
                               k - 1, as ``verify_chain`` (so both read the streams the engine always drew)
      u_sample  (...,)         the final token's uniform
      max_depth (...,)         each round's depth cap (a chain: its drafts L'; a tree: the truncation at the image end)
    ``tree``: None for a chain (node k's only child is k + 1), a ``Tree`` or per-round ``RowTrees``. ``law``: how the
    candidates were drawn (``real.protocol.LAWS``: "sampled" (one candidate per node, a chain), "without_replacement",
    "point"). A chain is verified by the verifier's own chain verdict when it has one (``Verifier.chain``: greedy's),
    else by ``verify_chain`` (vectorised, no walk); a tree by the verifier's own walk when it supplies one that
    applies (``Verifier.walk``: vanilla's and greedy's), else by ``verify_tree`` with early exit on numpy rows and by
    ``verify_tree_nodes`` (no read-back) on others. Returns a ``TreeVerdict`` (accepted (...,), path (..., D) accepted nodes by depth, -1 past them,
    next_token, last_node)."""
    _check_round_args(tree, verifier, "verify_round")
    xp = namespace(p)
    if tree is None:
        N = tokens.shape[-1] - 1
        own = getattr(verifier, "chain", None)       # the rule's own chain verdict (greedy's: argmaxes only)
        if own is not None:
            v = own(p, None if q is None else q[..., :N, :], tokens[..., 1:], u_accept[..., :N], u_sample, max_depth)
        else:
            if q is None:             # deterministic drafts (the point law): q is the one-hot row of each draft
                q = xp.astype(xp.arange(p.shape[-1], device=array_api_compat.device(p)) == tokens[..., 1:, None],
                              p.dtype)
            v = verify_chain(p, q[..., :N, :], tokens[..., 1:], u_accept[..., :N], u_sample, verifier,
                             n_drafted=max_depth, check=False, lazy=True)
        ar = xp.arange(1, N + 1, device=array_api_compat.device(p))
        path = xp.where(ar < v.accepted[..., None] + 1, ar, xp.full_like(tokens[..., 1:], -1))
        return TreeVerdict(v.accepted, path, v.next_token, v.accepted)
    host = isinstance(p, np.ndarray)
    walk = (getattr(verifier, "walk", None) or {}).get(law if host else "device")
    if walk is not None:
        out = walk(p, q, tokens, u_accept, u_sample, tree.children, int(tree.depth), max_depth, law)
        if out is not None:
            return TreeVerdict(*out)
    if host:                               # the host path: the walk at the rule's point cost, until every round stops
        out = host_walk(verifier.accept, verifier.resample, p, p if q is None else q, tokens, u_accept, u_sample,
                        tree.children, int(tree.depth), max_depth, law)
        return TreeVerdict(*out)
    # elsewhere (device arrays): a fixed count of operations and no read-back
    return verify_tree_nodes(p, p if q is None else q, tokens, u_accept, u_sample, tree, verifier,
                             max_depth=max_depth, draft_law=law)
