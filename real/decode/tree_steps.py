"""Static draft trees (docs/theory.md section 9) as a step of ``real.decode.engine.generate``: the per-tree
drafting plan (``tree_plan``, built once per (tree, depth)), level-by-level drafting (``draft_tree``: one draft
forward per level, children drawn without replacement, or the top-m tokens when greedy) and the round
(``tree_step``: one target forward with the tree mask, ``theory.tree.verify_tree``, KV compaction to the
accepted path). Index conventions as in ``real.decode.steps``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from theory.tree import Tree, TreeVerdict, draft_without_replacement, truncate_tree, verify_tree

from . import rng as R
from .fast_verify import fast_kind, verify_tree_fast
from .steps import (RoundRecord, Run, Step, ar_step, as_tensors, check_finite, commit, feed_draft, on_host,
                    store_hidden, sync)

__all__ = ["TreePlan", "TreeStep", "tree_plan", "draft_tree", "tree_step", "verify_tree_on", "finish_tree_round",
           "top_m"]


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
        mask = None if d == 0 else torch.as_tensor(tree.attention_mask[np.ix_(par, fed + list(par))], device=device)
        levels.append(_Level(torch.as_tensor(par, device=device),
                             torch.as_tensor(np.maximum(par_of[par], 0), device=device),
                             torch.as_tensor(ch[par, :K][valid], device=device),
                             torch.as_tensor(np.flatnonzero(valid), device=device), K, mask, d))
        if d > 0:
            fed += list(par)
    cm = np.zeros((tree.n_nodes + 1,) * 2, dtype=bool)
    cm[par_of[1:], np.arange(1, tree.n_nodes + 1)] = True
    return TreePlan(tree, levels, torch.as_tensor(tree.attention_mask, device=device), dep.astype(np.int64),
                    len(fed), torch.as_tensor(cm, device=device))


def _exponential(run: Run, level: int, shape: tuple) -> torch.Tensor:
    """Exp(1) noise (B, *shape) -log U from the images' float64 uniforms in [0, 1) for tree level ``level``: always
    > 0 (U = 0, probability 2^-53, gives inf: that token is simply drawn last, no NaN)."""
    return run.rng.uniform(run.n, R.TREE + level, shape).log_().neg_()


def top_m(x: torch.Tensor, m: int) -> torch.Tensor:
    """Indices (..., m) of the m largest entries of x (..., V) in decreasing order, ties to the lower index:
    ``argsort(x, descending, stable)[..., :m]`` without sorting all V entries (``topk``, then the m winners
    ordered by (value, index)); when a tie straddles the m-th place, the full stable sort decides."""
    V = x.shape[-1]
    if m >= V:
        return torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m]
    val, idx = x.topk(m + 1, dim=-1, sorted=True)
    if not bool((val[..., 1:] == val[..., :-1]).any()):   # no tie among the m + 1 largest: topk's order is the one
        return idx[..., :m]
    if bool((val[..., m - 1] == val[..., m]).any()):      # which of the tied entries is in is decided by index
        return torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m]
    idx, val = idx[..., :m], val[..., :m]
    idx, o = idx.sort(dim=-1)                              # by index, then stably by value: ties to the lower id
    return idx.gather(-1, torch.argsort(val.gather(-1, o), dim=-1, descending=True, stable=True))


def draft_tree(run: Run, plan: TreePlan, with_q: bool = True):
    """Feed the draft, then draft the tree level by level (one draft forward per level below the root).
    A node's children: a draw without replacement from its processed row (temperature > 0, lossless), or
    its top-m tokens by guided logits (temperature 0, as EAGLE; ties to the lower token id), the draft
    row then being uniform over them. Returns node tokens (B, N+1) (root at 0), draft rows q (B, N+1, V)
    (uniform at leaves: unused by the verifier; None when greedy and not ``with_q``: the greedy walk over distinct
    top-m candidates never needs them), draft forwards done."""
    logits, hid0 = feed_draft(run)
    dev, B, N = run.dev, run.B, plan.tree.n_nodes
    V = logits.shape[-1]
    greedy = run.proc.temperature == 0
    tokens = torch.empty(B, N + 1, dtype=torch.long, device=dev)
    tokens[:, 0] = run.out.gather(1, torch.as_tensor(run.n - 1, device=dev)[:, None])[:, 0]
    q = None if greedy and not with_q else torch.full((B, N + 1, V), 1.0 / V, dtype=run.proc.dtype, device=dev)
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
            pos = np.repeat(np.minimum(root + lv.offset, cap)[:, None], lv.parents.numel(), 1)
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
            q[:, lv.parents] = rows
            noise = _exponential(run, lv.offset, rows.shape[1:])
            draws = draft_without_replacement(rows, lv.K, exponential=noise)            # (B, k, K)
        tokens[:, lv.kids] = draws.reshape(B, -1)[:, lv.draw]          # index gathers only: no device sync
    if greedy and with_q:   # draft rows uniform over each node's drafted children (q only marks the candidates)
        ind = torch.zeros((B, N + 1, V), dtype=run.proc.dtype, device=dev)
        par = torch.as_tensor(plan.tree.parent[1:], device=dev)[None, :].expand(B, -1)
        ind[torch.arange(B, device=dev)[:, None], par, tokens[:, 1:]] = 1.0
        cnt = ind.sum(-1, keepdim=True)
        q = torch.where(cnt > 0, ind / cnt.clamp(min=1), q)
    return tokens, q, fwd


def tree_step(run: Run, tree: Tree, verifier, record: bool) -> Step:
    """One static-tree round for the batch (module docstring; section 9)."""
    act = run.active
    Db = np.where(act, np.minimum(tree.depth, run.T - run.n - 1), 0)
    Dr = int(Db.max())
    if Dr == 0:
        return ar_step(run, record)
    if Dr not in run.plans:
        run.plans[Dr] = tree_plan(truncate_tree(tree, Dr), run.dev)
    plan = run.plans[Dr]
    N = plan.tree.n_nodes
    t0 = time.perf_counter()
    # greedy verified by the host walk reads no draft rows: its candidates (distinct top-m tokens) all have mass
    lean = not record and run.host and run.proc.temperature == 0 and fast_kind(verifier, "point") == "greedy"
    tokens, q, fwd = draft_tree(run, plan, with_q=not lean)
    sync(run.dev)
    t1 = time.perf_counter()
    pos = run.positions(run.target, plan.depth, run.P + run.T - 1)
    o = run.target.forward(run.rows(tokens), position_ids=pos, attn_mask=plan.mask, return_hidden=run.feat)
    p = run.proc.rows(o.logits)                                                        # (B, N+1, V)
    sync(run.dev)
    t2 = time.perf_counter()
    check_finite(p) if q is None else check_finite(p, q)
    u_acc = run.rng.uniform(run.n, R.ACCEPT, (N + 1,), p.dtype)
    u_smp = run.rng.uniform(run.n, R.SAMPLE, (), p.dtype)
    v = verify_tree_on(run, p, p if q is None else q, tokens, u_acc, u_smp, plan.tree, verifier,
                       torch.as_tensor(Db, device=run.dev), "point" if q is None else "without_replacement")
    tau, path = finish_tree_round(run, tokens, o.hidden, v, Dr)
    if plan.n_fed:
        run.draft.rollback(plan.n_fed)
    sync(run.dev)
    nodes_at = np.searchsorted(tree.node_depth[1:], np.arange(tree.depth + 1), side="right")   # nodes up to depth d
    return TreeStep(np.where(act, nodes_at[Db], 0), np.where(act, tau, 0), t1 - t0, t2 - t1, time.perf_counter() - t2,
                    fwd, p=p if record else None, drafts=tokens if record else None, q=q if record else None,
                    depth=Db, nodes=path)


def verify_tree_on(run: Run, p, q, tokens, u_acc, u_smp, tree, verifier, max_depth, draft_law: str = "without_replacement"
                   ) -> TreeVerdict:
    """``theory.tree.verify_tree`` for the batch (rows p, q (B, N+1, V), node tokens (B, N+1), uniforms (B, N+1) and
    (B,), per-row depths (B,); ``tree`` a ``Tree`` or per-row ``RowTrees``), early exit, on numpy views with
    ``run.host``; the verdict as tensors. On the host, vanilla with the point law and greedy take the closed-form
    walk of ``real.decode.fast_verify`` (the same verdict without full-row work per candidate)."""
    p, q, tokens, u_acc, u_smp, max_depth = on_host(run, p, q, tokens, u_acc, u_smp, max_depth)
    kind = fast_kind(verifier, draft_law) if run.host else None
    if kind is not None:
        return as_tensors(run, verify_tree_fast(kind, p, q, tokens, u_acc, u_smp, tree, max_depth, draft_law))
    return as_tensors(run, verify_tree(p, q, tokens, u_acc, u_smp, tree, verifier, early_exit=True, max_depth=max_depth,
                                       draft_law=draft_law))


def finish_tree_round(run: Run, tokens: torch.Tensor, hidden, v: TreeVerdict, Dr: int):
    """After a tree verification: keep the accepted path in the target's cache (and, for feature drafters, its hidden
    states at their positions), commit path + next token. tokens (B, N+1); hidden (R, N+1, D) or None; returns
    tau (B,) and the accepted nodes (B, Dr) (-1 past tau) on the host (the round's one sync)."""
    act = run.active
    head = torch.cat([v.accepted[:, None], v.path], 1).cpu().numpy()                  # the round's sync
    tau, path = head[:, 0], head[:, 1:]
    keep = np.concatenate([np.zeros((run.B, 1), np.int64), np.maximum(path, 0)], 1)   # (B, Dr + 1)
    keep_t = torch.as_tensor(keep, device=run.dev)
    run.target.keep(run.rows(keep), run.rows(np.where(act, tau + 1, 0)))
    if run.feat:
        kidx = torch.as_tensor(run.rows(keep), device=run.dev)[..., None].expand(-1, -1, hidden.shape[-1])
        store_hidden(run, hidden.gather(1, kidx), run.rows(run.P + run.n - 1)[:, None] + np.arange(Dr + 1))
    cand = tokens.gather(1, keep_t[:, 1:])
    cand = torch.cat([cand, cand[:, :1]], 1).scatter(1, v.accepted[:, None], v.next_token[:, None])
    commit(run, cand, tau)
    return tau, path


@dataclass
class TreeStep(Step):
    """A static-tree round: ``drafted`` (B,) the nodes of each image's truncated tree, ``accepted`` tau_b,
    ``depth`` (B,) D'_b, ``nodes`` (B, D) the accepted nodes (-1 past tau); with record_rows ``p``, ``q``
    (B, N+1, V) and node tokens ``drafts`` (B, N+1), the root (the last committed token) at 0."""
    q: torch.Tensor | None = None
    depth: np.ndarray | None = None
    nodes: np.ndarray | None = None

    def record(self, b: int, share: float, rows: bool, tree_run: bool) -> RoundRecord:
        """Image b's record: its truncated tree's nodes, depth and accepted path, its rows cut to that tree."""
        tau, m = int(self.accepted[b]), int(self.drafted[b]) + 1
        rec = RoundRecord(m - 1, tau, self.t_draft * share, self.t_target * share, self.t_verify * share,
                          depth=int(self.depth[b]), nodes=tuple(int(x) for x in self.nodes[b, :tau]))
        if rows:
            rec.p, rec.q, rec.drafts = self.p[b, :m], self.q[b, :m], self.drafts[b, :m]
        return rec
