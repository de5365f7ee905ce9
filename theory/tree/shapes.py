"""Draft-tree shapes (section 9 of docs/theory.md): static trees given as paths of child ranks, as in EAGLE's
"choices" lists (``(0,)`` the first candidate after the root, ``(0, 1)`` the second candidate after that one; node 0
is the root, the last accepted token; nodes 1..N are the paths sorted by (depth, path)), the EAGLE-1 / LANTERN
shapes, per-round trees of dynamic drafting (``RowTrees``), and their parsing and truncation.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import array_api_compat
import numpy as np

from ..core.xp import Array, namespace

__all__ = ["Tree", "RowTrees", "row_trees", "parse_tree", "truncate_tree", "chain_tree", "EAGLE_25", "EAGLE_57"]

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

def parse_tree(spec: str, L: int) -> "Tree":
    """A tree spec (the CLI's ``--tree``) -> ``Tree``: eagle25, eagle57, chain (``chain_tree(L)``) or a JSON list of
    paths such as '[[0],[1],[0,0]]'."""
    import json

    if not isinstance(spec, str):
        raise TypeError(f"tree spec must be a str (eagle25, eagle57, chain or a JSON list of paths), got "
                        f"{type(spec).__name__}")
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
    from ..core import checks

    checks.instance("truncate_tree: tree", tree, Tree, "a theory.tree.Tree")
    depth = checks.integer("truncate_tree: depth", depth)
    if depth < 1:
        return None
    if depth >= tree.depth:
        return tree
    return Tree(tuple(p for p in tree.paths if len(p) <= depth))

