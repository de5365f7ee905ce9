"""Dynamic draft trees (EAGLE-2; the LANTERN release's default mode), docs/theory.md section 10, as a step of
``real.decode.engine.generate``: every round grows its own tree per image from the drafter's rows
(``grow_tree``: one draft forward per level over the k frontier nodes of every image, per-row tree masks), the
target scores the ``total`` nodes (root included) in one forward under a per-row ancestor mask with per-row
positions, ``theory.tree.verify_tree`` walks each image's own tree (``theory.tree.RowTrees``) and the KV caches
are compacted to the accepted path.

``DynamicTree(total, depth, topk, sampling)``: the release's parameters (``total_token`` nodes in the target's
block, root included; ``depth`` draft forwards after the first, so nodes reach depth ``depth + 1``; ``top_k``
children per expanded node and beam width), defaults those of the LANTERN release (59, 4, 10). ``sampling``:

* ``"lossless"`` (default): stochastic beam search keys (``theory.tree.dynamic.child_keys``): each node's children are
  a draw without replacement from its processed draft row and the tree is decided by the keys alone, so the
  walk is recursive rejection sampling (vanilla: the target's law exactly; section 10);
* ``"release"``: the release's construction, the top-k children ranked by cumulative draft log-probability,
  verified with the point-mass draft law (``draft_law="point"``, the release's ``qx = 1``).

Greedy (temperature 0): the top-k children by the guided draft logits (log-softmax at temperature 1, as the
release), any candidates being verified exactly by the greedy rule. Index conventions as ``real.decode.steps``.
"""
from __future__ import annotations

from dataclasses import dataclass

import array_api_compat
import numpy as np
import torch

from theory.core import checks
from theory.core.xp import namespace
from theory.tree import KEYS, row_trees, select_nodes
from real.nn.devpath import to_device
from real.protocol import Proposal

from . import rng as R
from .candidates import expand, top_m
from .drafting import ModelDrafting, feed_draft

__all__ = ["DynamicTree", "grow_tree"]


@dataclass(frozen=True)
class DynamicTree(ModelDrafting):
    """A dynamic tree's parameters (module docstring): ``total`` nodes per round in the target's block (root
    included: ``total - 1`` drafted), ``depth`` expansion levels (nodes reach depth ``depth + 1``), ``topk``
    children per expanded node (and frontier width), ``sampling`` in ``theory.tree.dynamic.KEYS``."""
    total: int = 59
    depth: int = 4
    topk: int = 10
    sampling: str = "lossless"
    trees = True
    scored_as = "grown-tree"

    def __post_init__(self):
        checks.integer("total", self.total, lo=2)       # the root and at least one drafted node
        checks.integer("depth", self.depth, lo=1)
        checks.integer("topk", self.topk, lo=1)
        if self.sampling not in KEYS:
            raise ValueError(f"sampling must be one of {KEYS}, got {self.sampling!r}")
        if self.total - 1 > self.pool:
            raise ValueError(f"total = {self.total} exceeds the {self.pool + 1} nodes a tree of depth {self.depth} "
                             f"and topk {self.topk} can hold (topk + depth topk^2 drafted, plus the root)")

    @property
    def n_nodes(self) -> int:
        """N: drafted nodes per round."""
        return self.total - 1

    @property
    def max_depth(self) -> int:
        """The deepest a node can be (the walk's depth bound)."""
        return self.depth + 1

    @property
    def pool(self) -> int:
        """Nodes proposed per round before the selection: topk + depth topk^2."""
        return self.topk + self.depth * self.topk ** 2

    @property
    def draft_law(self) -> str:
        """``verify_tree``'s draft law for this construction."""
        return "point" if self.sampling == "release" else "without_replacement"

    def check(self, target, draft, num_tokens, verifier, processing, batch_size) -> None:
        """ValueError before any work when the models cannot run this tree: topk > V, a block larger than a model's
        spare cache slots (``extra_slots``: the target holds ``total`` tree entries, the drafter ``depth * topk``
        frontier entries on top of the committed ones), or per-image trees (batch > 1) for a model whose forward
        takes no per-row attention masks (``row_masks``)."""
        super().check(target, draft, num_tokens, verifier, processing, batch_size)
        V = int(target.vocab_size)
        if self.topk > V:
            raise ValueError(f"tree topk = {self.topk} exceeds the vocabulary size V = {V}")
        for name, m, need in (("target", target, self.total), ("draft", draft, self.depth * self.topk + 1)):
            room = m.extra_slots
            if room is not None and need > int(room) + 1:
                raise ValueError(f"tree total {self.total} / depth {self.depth} / topk {self.topk} needs {need} cache "
                                 f"entries past the image in the {name}, which has room for {int(room) + 1} "
                                 f"({type(m).__name__} extra_slots = {room})")
            if batch_size > 1 and not m.row_masks:
                raise ValueError(f"--tree dynamic at batch size {batch_size} needs per-row tree masks, which the "
                                 f"{name} ({type(m).__name__}) cannot take: use batch size 1")

    def propose(self, run, depth: np.ndarray) -> Proposal:
        """Grow every image's tree (depth max_b D'_b): node tokens, per-image trees, masks, positions and the rows."""
        Dr = int(depth.max())
        tokens, parent, q, fwd, node_depth = grow_tree(run, self, Dr - 1, with_q=run.record, caps=np.maximum(depth, 1))
        trees = row_trees(parent, self.topk, depth=Dr, node_depth=node_depth)   # children (numpy on the host)
        mask = _ancestors(parent, Dr)
        if run.host:
            mask = torch.from_numpy(mask)
        law = "point" if q is None else self.draft_law
        # the device path keeps the parents on the device: the round reads them back with its verdict (settle)
        return Proposal(tokens, q, law, trees, trees.node_depth, mask, fwd, parent)

    def params(self) -> dict:
        """The four settings (for records)."""
        return {"tree": "dynamic", "tree_total": self.total, "tree_depth": self.depth, "tree_topk": self.topk,
                "tree_sampling": self.sampling}


def _gumbel(run, shape, level: int) -> torch.Tensor:
    """Gumbel(0, 1) noise (B, *shape) float64 for the candidate draws of tree level ``level`` from the images' own
    streams (``rng.TREE + level``): -log(-log U) (U = 0, probability 2^-53, gives -inf: that token is drawn last)."""
    return run.rng.uniform(run.n, R.TREE + level, tuple(shape)).log_().neg_().log_().neg_()


def _children(run, spec: DynamicTree, lg: torch.Tensor, key: torch.Tensor, logp: torch.Tensor, level: int):
    """Children of nodes with draft logits lg (R, ..., V) (R model rows), keys and path log-probabilities (B, ...)
    float64 -> tokens (B, ..., k), keys (B, ..., k), log-probabilities (B, ..., k), processed rows q (B, ..., V).
    Greedy and release keys are the path log-probabilities: given one tensor for both, one tensor is returned."""
    k = spec.topk
    if run.proc.greedy:            # greedy: log-softmax of the guided logits (the release's scores)
        ls = torch.log_softmax(run.proc.rows(lg, combined=True).double(), -1)
        tok = top_m(ls, k)
        val = ls.gather(-1, tok)
        kv = key[..., None] + val
        return tok, kv, kv if logp is key else logp[..., None] + val, None
    q = run.proc.rows(lg)
    return (*expand(spec, q, key, logp, None if spec.sampling == "release" else _gumbel(run, q.shape[1:], level)), q)


def grow_tree(run, spec: DynamicTree, levels: int, with_q: bool = True, caps: np.ndarray | None = None):
    """Feed the draft, then grow every image's tree: the root's children, then ``levels`` expansions of the k
    frontier nodes (one draft forward each, per-row masks over the level's own ancestors), then the best
    ``n = min(N, pool)`` nodes (``theory.tree.dynamic.select_nodes``). ``caps`` (B,): each image's own depth D'_b;
    nodes deeper than it are ranked last (key -inf), so an image selects the tree it selects at batch size 1
    (where only its own levels are grown) whatever the batch's deepest image, and any node chosen past them lies
    below its depth cap, where the walk never goes. Returns node tokens (B, n+1) (root at 0),
    parents (B, n+1) int64 (-1 at the root; numpy with ``run.host``), draft rows q (B, n+1, V) (the row a node's
    children were drawn from; uniform where it has none; None when greedy, or for the point law when not
    ``with_q``: it never reads them), the draft forwards done and node depths (B, n+1) int64 (as ``parent``)."""
    logits, hid0 = feed_draft(run)
    dev, B, k = run.dev, run.B, spec.topk
    zeros = torch.zeros(B, dtype=torch.float64, device=dev)
    root_tok = run.last_tokens()                                                      # (B, 1)
    tok, key, logp, q0 = _children(run, spec, logits, zeros, zeros, 0)               # (B, k)
    toks, keys, qrows = [tok], [key], [q0]
    want_q = not (run.proc.greedy or (spec.draft_law == "point" and not with_q))
    qslot = [torch.arange(k, device=dev).expand(B, -1) if levels else  # draft row of each pool node (-1: none)
             torch.full((B, k), -1, dtype=torch.long, device=dev)]
    front = torch.arange(k, device=dev).expand(B, -1)           # (B, k) pool indices of the frontier
    fronts = []                                                 # the expanded frontiers (their k children each)
    fhid = hid0[:, None].expand(-1, k, -1) if run.feat else None
    anc = torch.zeros((B, k, 0), dtype=torch.bool, device=dev)  # the frontier's ancestors among fed entries
    eye = torch.eye(k, dtype=torch.bool, device=dev)
    eyes = eye.expand(B, -1, -1)
    cap = run.d_off + run.T - 1
    root_pos = run.rows(run.d_off + run.n - 1)
    fwd, size = 1, k
    for i in range(levels):  # one draft forward per level (a loop over at most `depth` levels)
        pos = run.dev_positions(run.d_off + i, cap, k)        # the device path: from n on the device
        pos = np.repeat(np.minimum(root_pos + 1 + i, cap)[:, None], k, 1) if pos is None else pos
        mask = torch.cat([anc, eyes], -1)                                         # (B, k, F + k)
        mask = mask[0] if B == 1 else run.rows(mask)           # one image: the (S, K) mask every model takes
        x = run.rows(tok)
        if run.feat:
            o = run.draft.forward(x, features=fhid, position_ids=pos, attn_mask=mask)
        else:
            o = run.draft.forward(x, position_ids=pos, attn_mask=mask)
        fwd += 1
        ctok, ckey, clogp, q = _children(run, spec, o.logits, key, logp, i + 1)      # (B, k, k)
        base = size
        fronts.append(front)
        same = clogp is ckey                                    # greedy / release: keys = log-probabilities
        ctok, ckey = ctok.reshape(B, -1), ckey.reshape(B, -1)
        toks.append(ctok)
        keys.append(ckey)
        if want_q:
            qslot.append(torch.full((B, k * k), -1, dtype=torch.long, device=dev))
            qrows.append(q)
        size += k * k
        if i + 1 < levels:                                      # the next frontier: the k best of the k^2
            best = top_m(ckey, k)                                                   # (B, k)
            out = best // k                                                         # their parents' frontier slot
            tok, key = ctok.gather(1, best), ckey.gather(1, best)
            logp = key if same else clogp.reshape(B, -1).gather(1, best)
            front = base + best
            if want_q:
                qslot[-1].scatter_(1, best, (1 + i) * k + torch.arange(k, device=dev).expand(B, -1))
            if run.feat:
                fhid = o.hidden.gather(1, run.rows(out)[..., None].expand(-1, -1, o.hidden.shape[-1]))
            prev = anc.gather(1, out[..., None].expand(-1, -1, anc.shape[-1]))
            anc = torch.cat([prev, eye[out]], -1)
    if levels:
        run.draft.rollback(levels * k)
    n = min(spec.n_nodes, size)
    pool_keys = torch.cat(keys, 1)
    pool_parents = torch.cat([torch.full((B, k), -1, dtype=torch.long, device=dev)]
                             + [f.repeat_interleave(k, dim=1) for f in fronts], 1)    # each child's parent
    pool_depth = torch.cat([torch.ones(k, dtype=torch.long, device=dev)]                # level i's nodes: i + 2
                           + [torch.full((k * k,), 2 + i, dtype=torch.long, device=dev) for i in range(len(fronts))])
    if caps is not None and int(np.min(caps)) < levels + 1:     # an image with fewer levels than the batch grew
        deep = pool_depth[None, :] > to_device(caps, dev)[:, None]              # (the device path: no sync)
        pool_keys = pool_keys.masked_fill(deep, -float("inf"))
    if run.host:       # the tree's shape on the host: a few dozen entries, where numpy's calls cost least
        sel, parent = select_nodes(pool_keys.numpy(), pool_parents.numpy(), n)             # (B, n), (B, n+1)
        depth = np.concatenate([np.zeros((B, 1), np.int64), pool_depth.numpy()[sel]], 1)
        sel = torch.from_numpy(sel)
    else:
        sel, parent = select_nodes(pool_keys, pool_parents, n)
        depth = torch.cat([torch.zeros((B, 1), dtype=torch.long, device=dev), pool_depth[sel]], 1)
    tokens = torch.cat([root_tok, torch.cat(toks, 1).gather(1, sel)], 1)
    if not want_q:
        return tokens, parent, None, fwd, depth   # greedy, or the point law (which never reads q) unrecorded
    V = q0.shape[-1]
    allq = torch.cat([q0[:, None]] + [r for r in qrows[1:]], 1)                        # (B, 1 + levels k, V)
    slot = torch.cat(qslot, 1).gather(1, sel)                                         # (B, n)
    slot = torch.cat([torch.zeros((B, 1), dtype=torch.long, device=dev), slot + (slot >= 0)], 1)   # root: slot 0
    q = allq.gather(1, slot.clamp(min=0)[..., None].expand(-1, -1, V))
    q = torch.where((slot >= 0)[..., None], q, torch.full_like(q, 1.0 / V))
    return tokens, parent, q, fwd, depth


def _ancestors(parent, D: int):
    """Tree attention (B, n+1, n+1) bool: node a sees node b iff b is a or one of its ancestors (D levels); parent
    (B, n+1) (-1 at the root), numpy or torch (array API: pointer jumping, a loop over tree levels)."""
    xp = namespace(parent)
    n1 = parent.shape[-1]
    ar = xp.arange(n1, device=array_api_compat.device(parent))
    cur = xp.broadcast_to(ar, parent.shape)
    m = cur[..., :, None] == ar                                                # the node itself
    for _ in range(D):  # a loop over tree levels
        safe = xp.where(cur >= 0, cur, xp.zeros_like(cur))
        cur = xp.where(cur >= 0, xp.take_along_axis(parent, safe, axis=-1), cur)
        m = m | (cur[..., :, None] == ar)                                      # -1 (past the root) matches nothing
    return m
