"""Static draft trees (docs/theory.md section 9) as a drafting mode (``real.protocol.Drafting``): the per-tree drafting
plan (``tree_plan``, built once per (tree, depth)), level-by-level drafting (``draft_tree``: one draft forward per
level) and the ``StaticTree`` mode. Index conventions as in ``real.decode.round``.

``StaticTree(tree, candidates)``: a node's children are drawn WITHOUT replacement from its processed draft row
(``candidates="sampled"``, the default: lossless under vanilla, law "without_replacement"), or are its top-m tokens
(``candidates="topk"``, as the EAGLE-1 / LANTERN++ releases draft them: law "point", the release's qx = 1; lossless
under vanilla too). At temperature 0 (greedy) the children are the top-m tokens by guided logits, law "point".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from theory.tree import Tree, draft_without_replacement, truncate_tree
from real.nn.devpath import to_device
from real.protocol import Proposal

from . import rng as R
from .candidates import top_m
from .drafting import ModelDrafting, feed_draft, static_depth

__all__ = ["StaticTree", "TreePlan", "tree_plan", "draft_tree", "top_m", "CANDIDATES"]

CANDIDATES = ("sampled", "topk")


@dataclass(frozen=True)
class StaticTree(ModelDrafting):
    """Static-tree drafting of ``tree`` (a ``theory.tree.Tree``) with ``candidates`` in ``CANDIDATES`` (module
    docstring)."""
    tree: Tree
    candidates: str = "sampled"
    scored_as = "static-tree"
    trees = True

    def __post_init__(self):
        if not isinstance(self.tree, Tree):
            raise ValueError(f"tree must be a theory.tree.Tree, got {type(self.tree).__name__}")
        if self.candidates not in CANDIDATES:
            raise ValueError(f"candidates must be one of {CANDIDATES}, got {self.candidates!r}")

    @property
    def max_depth(self) -> int:
        return int(self.tree.depth)

    def check(self, target, draft, num_tokens, verifier, processing, batch_size) -> None:
        """A draft model is needed, and no node may have more candidates than the vocabulary has tokens."""
        super().check(target, draft, num_tokens, verifier, processing, batch_size)
        if self.tree.children.shape[1] > int(target.vocab_size):
            raise ValueError(f"the tree has a node with {self.tree.children.shape[1]} candidates but V = "
                             f"{target.vocab_size}")

    def start(self, run) -> dict:
        """The batch's plans, one per truncation depth (built on first use)."""
        return {}

    def propose(self, run, depth: np.ndarray) -> Proposal:
        """Feed the draft, draft the tree truncated to the batch's deepest D'_b level by level (on the device path the
        whole tree every round: ``real.decode.drafting.static_depth``)."""
        Dr = static_depth(run, int(depth.max()), self.max_depth, self.tree.n_nodes + 1)
        if Dr not in run.state:
            run.state[Dr] = tree_plan(truncate_tree(self.tree, Dr), run.dev)
        plan = run.state[Dr]
        point = run.proc.greedy or self.candidates == "topk"
        tokens, q, fwd = draft_tree(run, plan, with_q=run.record or not point, topk=self.candidates == "topk")
        dev = run.n_dev is not None                 # the device path: node depths and children already there
        return Proposal(tokens, q, "point" if point else "without_replacement", plan.on_device if dev else plan.tree,
                        plan.depth_t if dev else plan.depth, plan.mask, fwd)

    def advance(self, run, prop, verdict, p, n0) -> None:
        """Drop the tree levels the draft appended (every row the same count)."""
        n_fed = run.state[int(prop.tree.depth)].n_fed
        if n_fed:
            run.draft.rollback(n_fed)

    def params(self) -> dict:
        return {"tree_nodes": self.tree.n_nodes, "tree_depth": self.tree.depth, "tree_candidates": self.candidates}


@dataclass
class _Level:
    """Drafting step d of a tree: the inner nodes at depth d (``parents``, whose rows are computed at this
    step) and their children. Tensors on the model device."""
    parents: torch.Tensor       # (k,) nodes at depth d with children, in node order
    parent_of: torch.Tensor     # (k,) their parents (feature rows for EAGLE drafters)
    kids: torch.Tensor          # (m,) child nodes, row-major over (parent, rank)
    draw: torch.Tensor          # (m,) their entries in the flattened (k, K) draws (K = most children here)
    K: int
    mask: torch.Tensor | None   # (k, F + k) bool over the F tree entries already in the draft cache + the block
    offset: int                 # d: position of the level relative to the root


@dataclass
class TreePlan:
    """Everything a tree round needs that depends only on the tree: built once per (tree, depth)."""
    tree: Tree
    levels: list
    mask: torch.Tensor          # (N+1, N+1) bool tree attention (target)
    depth: np.ndarray           # (N+1,) node depths (target positions = root position + depth)
    n_fed: int                  # draft cache entries written by levels 1..D-1 (rolled back after the round)
    child_mask: torch.Tensor    # (N+1, N+1) bool: [node, child] (greedy drafting's draft rows)
    depth_t: torch.Tensor | None = None   # (N+1,) the node depths on the device (the device path's positions)
    on_device: object = None    # the tree with its children (N+1, K) on the device (the device path's walk)


class _DeviceTree:
    """A static ``Tree`` whose ``children`` (N+1, K) and ``node_depth`` (N+1,) are device tensors, for the verifier's
    walk on the device path (its ``xp.asarray`` of them then copies nothing); every other attribute is the tree's."""

    def __init__(self, tree: Tree, children: torch.Tensor, node_depth: torch.Tensor):
        self.tree, self.children, self.node_depth = tree, children, node_depth

    def __getattr__(self, name):
        return getattr(self.__dict__["tree"], name)


def tree_plan(tree: Tree, device) -> TreePlan:
    """The per-level drafting plan and verification tensors of a static ``tree`` on ``device``: one ``_Level`` per
    depth d < D (parent nodes (k,), their parents (k,), children (m,), their draw slots (m,), mask (k, F + k)
    bool), the target's tree attention mask (N+1, N+1) bool, node depths (N+1,) int64, the draft entries fed
    (n_fed) and the parent-child mask (N+1, N+1) bool. Built once per (tree, depth); loops over levels only."""
    ch, dep, par_of = tree.children, tree.node_depth, tree.parent
    inner = (ch >= 0).any(1)
    levels, fed = [], []
    for d in range(tree.depth):  # a loop over tree levels (at most D), at plan time only
        par = np.flatnonzero((dep == d) & inner)
        valid = ch[par] >= 0
        K = int(valid.sum(1).max())
        valid = valid[:, :K]
        mask = None if d == 0 else to_device(tree.attention_mask[np.ix_(par, fed + list(par))], device)
        levels.append(_Level(to_device(par, device),
                             to_device(np.maximum(par_of[par], 0), device),
                             to_device(ch[par, :K][valid], device),
                             to_device(np.flatnonzero(valid), device), K, mask, d))
        if d > 0:
            fed += list(par)
    cm = np.zeros((tree.n_nodes + 1,) * 2, dtype=bool)
    cm[par_of[1:], np.arange(1, tree.n_nodes + 1)] = True
    depth_t = to_device(dep, device, torch.long)
    return TreePlan(tree, levels, to_device(tree.attention_mask, device), dep.astype(np.int64),
                    len(fed), to_device(cm, device), depth_t, _DeviceTree(tree, to_device(ch, device), depth_t))


def _exponential(run, level: int, shape: tuple) -> torch.Tensor:
    """Exp(1) noise (B, *shape) -log U from the images' float64 uniforms in [0, 1) for tree level ``level``: always
    > 0 (U = 0, probability 2^-53, gives inf: that token is simply drawn last, no NaN)."""
    return run.rng.uniform(run.n, R.TREE + level, shape).log_().neg_()


def draft_tree(run, plan: TreePlan, with_q: bool = True, topk: bool = False):
    """Feed the draft, then draft the tree level by level (one draft forward per level below the root).
    A node's children: a draw without replacement from its processed row (temperature > 0, lossless), its top-m tokens
    by processed probability (``topk``, as the EAGLE-1 / LANTERN++ releases draft static trees; ties to the lower id),
    or its top-m tokens by guided logits (temperature 0, as EAGLE), the draft row then being uniform over them.
    Returns node tokens (B, N+1) (root at 0), draft rows q (B, N+1, V) (uniform at leaves: never read; None without
    ``with_q``: point-law candidates need none), draft forwards done."""
    logits, hid0 = feed_draft(run)
    dev, B, N = run.dev, run.B, plan.tree.n_nodes
    V = logits.shape[-1]
    greedy = run.proc.greedy
    tokens = torch.empty(B, N + 1, dtype=torch.long, device=dev)
    tokens[:, 0] = run.last_tokens()[:, 0]
    q = None if not with_q else torch.full((B, N + 1, V), 1.0 / V, dtype=run.proc.dtype, device=dev)
    hid = hid0.new_empty((hid0.shape[0], N + 1, hid0.shape[-1])) if run.feat else None
    cap = run.d_off + run.T - 1
    root = run.rows(run.d_off + run.n - 1)          # (R,) the root's draft element (its position)
    fwd = 1
    for lv in plan.levels:  # one draft forward per level (a loop over at most D levels)
        if lv.offset == 0:
            lg = logits[:, None]
            if run.feat:
                hid[:, 0] = hid0
        else:
            pos = run.dev_positions(run.d_off - 1 + lv.offset, cap, lv.parents.numel())
            pos = np.repeat(np.minimum(root + lv.offset, cap)[:, None], lv.parents.numel(), 1) if pos is None else pos
            x = run.rows(tokens[:, lv.parents])
            if run.feat:
                o = run.draft.forward(x, features=hid[:, lv.parent_of], position_ids=pos, attn_mask=lv.mask)
                hid[:, lv.parents] = o.hidden
            else:
                o = run.draft.forward(x, position_ids=pos, attn_mask=lv.mask)
            lg = o.logits
            fwd += 1
        if greedy:
            draws = top_m(run.proc.rows(lg, combined=True), lv.K)
        else:
            rows = run.proc.rows(lg)
            if q is not None:
                q[:, lv.parents] = rows
            draws = top_m(rows, lv.K) if topk else \
                draft_without_replacement(rows, lv.K, exponential=_exponential(run, lv.offset, rows.shape[1:]))  # (B, k, K)
        tokens[:, lv.kids] = draws.reshape(B, -1)[:, lv.draw]          # index gathers only: no device sync
    if greedy and with_q:   # draft rows uniform over each node's drafted children (q only marks the candidates)
        ind = torch.zeros((B, N + 1, V), dtype=run.proc.dtype, device=dev)
        par = torch.as_tensor(plan.tree.parent[1:], device=dev)[None, :].expand(B, -1)
        ind[torch.arange(B, device=dev)[:, None], par, tokens[:, 1:]] = 1.0
        cnt = ind.sum(-1, keepdim=True)
        q = torch.where(cnt > 0, ind / cnt.clamp(min=1), q)
    return tokens, q, fwd
