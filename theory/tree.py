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

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import array_api_compat
import numpy as np

from ._xp import Array, gather, gather_rows, namespace, normalize, sample_categorical

__all__ = ["Tree", "RowTrees", "row_trees", "TreeVerdict", "verify_tree", "draft_without_replacement", "EAGLE_25",
           "EAGLE_57", "tree_round", "chain_tree", "DRAFT_LAWS"]

# How a node's candidates were drafted (section 10): "without_replacement" = a sequential draw without replacement
# from the node's draft row q (the walk's q_j = Norm(q with c_1..c_{j-1} removed)); "point" = deterministic
# candidates (the draft's top-k, as the EAGLE-2 / LANTERN releases), whose conditional draft law is the point
# mass at c_j (q_j = one-hot(c_j): vanilla then accepts with p_j(c_j), the release's ``qx = 1``).
DRAFT_LAWS = ("without_replacement", "point")

# Tree shapes used by the EAGLE-1 / LANTERN releases: 25 nodes of depth 5 and 57 nodes of depth 5.
EAGLE_25 = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
            (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
            (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1))
EAGLE_57 = ((0,), (1,), (2,), (3,), (4,),
            (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (4, 0),
            (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1),
            (0, 2, 2), (0, 3, 0), (0, 3, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0),
            (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 1, 2),
            (0, 0, 2, 0), (0, 0, 2, 1), (0, 0, 3, 0), (0, 1, 0, 0), (0, 1, 0, 1), (0, 1, 1, 0), (0, 2, 0, 0),
            (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1), (0, 0, 1, 0, 0),
            (0, 0, 1, 0, 1), (0, 0, 1, 1, 0), (0, 0, 2, 0, 0))


def chain_tree(L: int) -> "Tree":
    """The chain of L drafts as a tree (section 9) (one candidate per node): chain SD is a special case."""
    return Tree(tuple((0,) * d for d in range(1, L + 1)))


@dataclass(frozen=True)
class Tree:
    """A static draft tree (section 9). Arrays (numpy, int64) index nodes 0..N with 0 the root."""
    paths: tuple

    def __post_init__(self):
        paths = tuple(sorted({tuple(int(r) for r in p) for p in self.paths}, key=lambda p: (len(p), p)))
        if not paths:
            raise ValueError("a tree needs at least one path")
        if len(paths) != len(self.paths):
            raise ValueError("duplicate paths in the tree")
        known = set(paths)
        for p in paths:
            if len(p) == 0 or min(p) < 0:
                raise ValueError(f"tree path {p}: paths are non-empty tuples of non-negative ranks")
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(f"tree path {p}: its parent {p[:-1]} is missing")
            if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in known:
                raise ValueError(f"tree path {p}: rank {p[-1]} without rank {p[-1] - 1} before it")
        object.__setattr__(self, "paths", paths)

    @property
    def n_nodes(self) -> int:
        """N: drafted nodes (the root excluded)."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @cached_property
    def _index(self) -> dict:
        return {(): 0, **{p: i + 1 for i, p in enumerate(self.paths)}}

    @cached_property
    def parent(self) -> np.ndarray:
        """(N+1,) parent node of each node (-1 for the root)."""
        return np.array([-1] + [self._index[p[:-1]] for p in self.paths], dtype=np.int64)

    @cached_property
    def node_depth(self) -> np.ndarray:
        """(N+1,) depth of each node (0 for the root)."""
        return np.array([0] + [len(p) for p in self.paths], dtype=np.int64)

    @cached_property
    def children(self) -> np.ndarray:
        """(N+1, K) children of each node by rank, -1 padded; K = the largest number of children."""
        kids: dict[int, list[int]] = {}
        for p in self.paths:
            kids.setdefault(self._index[p[:-1]], []).append(self._index[p])
        K = max(len(v) for v in kids.values())
        out = np.full((self.n_nodes + 1, K), -1, dtype=np.int64)
        for n, v in kids.items():
            out[n, : len(v)] = v  # paths are sorted, so children come in rank order
        return out

    @cached_property
    def attention_mask(self) -> np.ndarray:
        """(N+1, N+1) bool: node a attends to node b iff b is a or an ancestor of a (tree attention)."""
        M = np.eye(self.n_nodes + 1, dtype=bool)
        for a in range(1, self.n_nodes + 1):
            b = self.parent[a]
            while b >= 0:
                M[a, b] = True
                b = self.parent[b]
        return M

    def position_ids(self, start: int) -> np.ndarray:
        """(N+1,) positions of the root (at ``start``) and the drafted nodes (start + depth)."""
        return start + self.node_depth

    def path_to(self, node: int) -> list[int]:
        """Nodes from the first level down to ``node`` (root excluded)."""
        out = []
        while node > 0:
            out.append(int(node))
            node = int(self.parent[node])
        return out[::-1]


@dataclass(frozen=True)
class RowTrees:
    """Draft trees that differ per round (dynamic trees, section 10), batched: ``children`` (..., N+1, K) int64
    child nodes by rank, -1 padded; ``node_depth`` (..., N+1) int64 (root 0); ``depth`` the largest node depth
    (an int: the walk's static bound). Every round has N drafted nodes numbered so that a parent comes before its
    children. Arrays of any array-API namespace (numpy on the host, torch on the model device)."""
    children: Array
    node_depth: Array
    depth: int

    @property
    def n_nodes(self) -> int:
        """N: drafted nodes per round (the root excluded)."""
        return int(self.children.shape[-2]) - 1


def row_trees(parent: Array, K: int, depth: int | None = None, node_depth: Array | None = None) -> RowTrees:
    """``RowTrees`` from per-round parent pointers ``parent`` (..., N+1) int (entry 0: -1, the root; parent[a] < a),
    children ranked by node index (K: most children a node may have; a node's children past the K-th are dropped).
    ``depth``: the walk's bound (default: the largest node depth). Node depths by pointer jumping (a loop over the
    tree's levels); children by a stable sort of the nodes by parent:
    node p's children are the ``counts[p]`` nodes from its group's start. Array API only (no scatter).
    ``node_depth`` (..., N+1): the depths when the caller built the tree level by level and knows them (no pointer
    jumping)."""
    xp = namespace(parent)
    dev = array_api_compat.device(parent)
    parent = xp.astype(parent, xp.int64)
    N1 = parent.shape[-1]
    lead = parent.shape[:-1]
    ar = xp.arange(N1, device=dev)
    if node_depth is not None:
        if tuple(node_depth.shape) != tuple(parent.shape):
            raise ValueError(f"row_trees: node_depth must have the shape of parent {tuple(parent.shape)}, "
                             f"got {tuple(node_depth.shape)}")
        node_depth = xp.astype(node_depth, xp.int64)
    else:
        node_depth = xp.zeros_like(parent)
        cur = parent
        for _ in range(N1):  # pointer jumping: one step per tree level (at most N)
            live = cur >= 0
            if not bool(xp.any(live)):
                break
            node_depth = node_depth + xp.astype(live, xp.int64)
            cur = _parent_of(parent, cur, xp)
    ar_K = xp.arange(K, device=dev)
    par = parent[..., 1:]                                                        # (..., N) the drafted nodes' parents
    counts = xp.sum(xp.astype(par[..., None, :] == ar[:, None], xp.int64), axis=-1)     # (..., N+1) children per node
    if N1 == 1:
        children = xp.full((*lead, 1, K), -1, dtype=xp.int64, device=dev)
    else:
        order = xp.astype(xp.argsort(par, axis=-1, stable=True), xp.int64) + 1   # nodes grouped by parent, by index
        idx = (xp.cumulative_sum(counts, axis=-1) - counts)[..., :, None] + ar_K  # (..., N+1, K) slots in `order`
        valid = ar_K < counts[..., :, None]
        idx = xp.where(valid, idx, xp.zeros_like(idx))
        kid = xp.reshape(xp.take_along_axis(order, xp.reshape(idx, (*lead, N1 * K)), axis=-1), (*lead, N1, K))
        children = xp.where(valid, kid, xp.full_like(kid, -1))
    D = int(xp.max(node_depth)) if depth is None else int(depth)
    return RowTrees(children, node_depth, D)


def _parent_of(parent: Array, node: Array, xp) -> Array:
    """parent[..., node[..., j]] for every j (-1 where node = -1): parent, node (..., N+1)."""
    safe = xp.where(node >= 0, node, xp.zeros_like(node))
    return xp.where(node >= 0, xp.take_along_axis(parent, safe, axis=-1), node)


class TreeVerdict(NamedTuple):
    accepted: Array    # (...,) int64: accepted drafts (depth reached)
    path: Array        # (..., D) int64: accepted nodes by depth, -1 after the last
    next_token: Array  # (...,) int64: resampled token, or the bonus token after a leaf
    last_node: Array   # (...,) int64: the last accepted node (0 = root)


def parse_tree(spec: str, L: int) -> "Tree":
    """A tree spec (the CLI's ``--tree``) -> ``Tree``: eagle25, eagle57, chain (``chain_tree(L)``) or a JSON list of
    paths such as '[[0],[1],[0,0]]'."""
    import json

    named = {"eagle25": EAGLE_25, "eagle57": EAGLE_57}
    key = spec.strip().lower()
    if key in named:
        return Tree(named[key])
    if key == "chain":
        return chain_tree(L)
    try:
        paths = json.loads(spec)
        if not isinstance(paths, list) or not all(isinstance(p, list) and all(isinstance(r, int) for r in p) for p in paths):
            raise TypeError
    except (ValueError, TypeError):
        raise ValueError(f"--tree must be eagle25, eagle57, chain or a JSON list of paths like '[[0],[1],[0,0]]', "
                         f"got {spec!r}") from None
    return Tree(tuple(tuple(p) for p in paths))


def truncate_tree(tree: "Tree", depth: int) -> "Tree | None":
    """The tree without its nodes deeper than ``depth`` (None when depth < 1): still a valid tree,
    since a node's parent and lower-ranked siblings are never deeper than the node."""
    if depth < 1:
        return None
    if depth >= tree.depth:
        return tree
    return Tree(tuple(p for p in tree.paths if len(p) <= depth))


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
    return xp.astype(xp.argsort(keys, axis=-1, descending=True, stable=True)[..., :m], xp.int64)


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
        f_row = verifier.accept(p_res, q_j, xp.minimum(depth + 1, xp.full_like(depth, tree.depth)))
        valid = has & (gather(q_j, c, xp) > 0)                                    # impossible candidates are skipped
        acc = valid & (gather(u_accept, kid_safe, xp) < gather(f_row, c, xp))
        rej = valid & ~acc
        G = verifier.resample(p_res, q_j, f_row, c)
        # advance the state of every round at once
        p_res = xp.where(acc[..., None], gather_rows(p, kid_safe, xp), xp.where(rej[..., None], G, p_res))
        removed = xp.where(acc[..., None], xp.zeros_like(removed), removed | (rej[..., None] & (ar_V == c[..., None])))
        path = xp.where(acc[..., None] & (ar_depth == depth[..., None]), kid_safe[..., None], path)
        node = xp.where(acc, kid_safe, node)
        depth = depth + xp.astype(acc, xp.int64)
        rank = xp.where(acc, zero_i, rank + xp.astype(has & ~acc, xp.int64))
        active = active & has  # a round stops when its current node has no untried candidate left
        if early_exit:         # ... which is known now: the round need not come back for an empty step
            active = active & untried(node, rank, depth)
    return TreeVerdict(depth, path, sample_categorical(p_res, u_sample, xp), node)


# ----------------------------------------------------------------------------- exact theory (small chains)

class TreeRound(NamedTuple):
    expected_accepted: float   # E[accepted drafts] in one tree round
    law: np.ndarray            # law of the next D+1 tokens (virtually extended by P), shape (V,)*(D+1)
    target_law: np.ndarray     # the target's law of D+1 tokens
    tv: float                  # TV(law, target_law)


def tree_round(P, Q, tree: Tree, verifier, s: int, max_states: int = 10**6) -> TreeRound:
    """Exact E[accepted] (T2 for trees) and output law (T7 for trees) of one tree round on Markov chains P, Q from start state s,
    by enumerating every ordered candidate tuple at every node (memoised on (node, last token)).
    Cost grows like N V^(K+D+1); meant for small V (it refuses above ``max_states`` array entries)."""
    P = np.asarray(P, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    V, D = P.shape[0], tree.depth
    if V ** (D + 1) * tree.children.shape[1] > max_states:
        raise ValueError(f"tree_round: V^(D+1) x K = {V}^{D + 1} x {tree.children.shape[1]} exceeds max_states={max_states}")

    def extend(row, remaining):
        """law over `remaining` tokens: the first from `row`, the rest from P."""
        law = row
        for _ in range(remaining - 1):
            law = _chain_extend(law, P)
        return law

    memo: dict = {}

    def at(node, s_last, d):
        """(E[accepted below], law of the next D+1-d tokens) on entering `node` after token s_last."""
        key = (node, s_last)
        if key not in memo:
            kids = [int(k) for k in tree.children[node] if k >= 0]
            p0 = P[s_last]
            if not kids:
                memo[key] = (0.0, extend(p0, D + 1 - d))
            else:
                memo[key] = try_candidates(kids, 0, p0, Q[s_last], d)
        return memo[key]

    def try_candidates(kids, j, pj, qj, d):
        """Candidates j, j+1, ... at a node, given the residual pj and the remaining draft row qj."""
        rem = D + 1 - d
        if j == len(kids) or qj.sum() == 0:   # all tried (or the draft's support exhausted)
            return 0.0, extend(pj, rem)
        f = np.asarray(verifier.accept(pj, qj, d + 1))
        e, law = 0.0, np.zeros((V,) * rem)
        for c in np.flatnonzero(qj > 0):       # candidate j is c with probability qj[c]
            if f[c] > 0:
                e_c, law_c = at(kids[j], int(c), d + 1)
                e += qj[c] * f[c] * (1 + e_c)
                law[c] += qj[c] * f[c] * law_c
            if f[c] < 1:
                G = np.asarray(verifier.resample(pj, qj, f, np.int64(c)))
                q_next = qj.copy()
                q_next[c] = 0.0
                tot = q_next.sum()
                e_r, law_r = try_candidates(kids, j + 1, G, q_next / tot if tot > 0 else q_next, d)
                e += qj[c] * (1 - f[c]) * e_r
                law += qj[c] * (1 - f[c]) * law_r
        return e, law

    e, law = at(0, int(s), 0)
    target = extend(P[int(s)], D + 1)
    return TreeRound(e, law, target, 0.5 * float(np.abs(law - target).sum()))


def _chain_extend(law, P):
    """law over k tokens -> law over k+1 tokens, the new token from P given the last one."""
    return law[..., None] * P.reshape((1,) * (law.ndim - 1) + P.shape)
