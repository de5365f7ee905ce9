"""Speculative and plain autoregressive generation of one image through ``real.protocol`` models.

One round (THEORY section 1), with n of the T image tokens generated:
  L' = min(L, T - n - 1) drafts x~_1..x~_L' sampled from the processed draft rows q_i;
  one target forward over [last committed token; x~_1..x~_L'] gives the processed rows p_1..p_{L'+1};
  ``theory.verify.verify_chain`` (the shared rules, on torch tensors) returns tau and the next token;
  both KV caches are rolled back to the accepted prefix. L' = 0 is a single target step.
The first round's target forward is the prefill itself ([condition prefix; drafts] in one call), so
target forwards == rounds. Feature drafters (EAGLE) cannot draft the first token: their first round is
the prefill alone (L' = 0), then the convention above applies.

Static-tree rounds (``tree_generate``, docs/theory.md section 9; EAGLE-1 / LANTERN++ setting), n tokens
generated, the root being the last committed token x_{n-1} (not yet in the target's cache):
  the tree is truncated to depth D' = min(D, T - n - 1) (nodes deeper than T - n - 1 are dropped, so a
  round never produces more than the T - n tokens left; D' = 0 is a single target step);
  drafting goes level by level: one draft forward over the committed tokens not yet fed (ending with
  the root) gives the root's row q_0, then one forward per depth d = 1..D'-1 over that level's inner
  nodes (tree mask over the tree entries already in the draft's cache, positions root + d); each
  node's children are the first m tokens of a draw without replacement from its processed row
  (``theory.tree.draft_without_replacement``, Gumbel noise from the seeded generator);
  one target forward over [root; nodes 1..N'] with the tree attention mask and positions root + depth
  gives the rows p (N'+1, V); ``theory.tree.verify_tree`` returns the accepted path and the next token;
  the target's cache is compacted to [root; accepted path] with ``keep``; the draft's tree entries are
  rolled back and the accepted path is re-fed in the next round's first draft forward (with the
  target's hidden states for EAGLE drafters, as EAGLE-1 does; no extra forward for independent drafts).
The first round (n = 0) is the prefill alone for every drafter (the prefix cannot carry a tree mask
through ``prefill``), so target forwards == rounds here too.

Uniforms come from one seeded ``torch.Generator`` on the model device (draft sampling, acceptance and
the final draw), so runs are reproducible. Probabilities are float32 (or float64) whatever the model
dtype. Greedy decoding = temperature 0 (one-hot rows) with ``theory.rules.greedy()``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory.tree import Tree, draft_without_replacement, verify_tree
from theory.verify import verify_chain

from .protocol import check_pair
from .sampling import Processing, sample

__all__ = ["RoundRecord", "Generation", "speculative_generate", "tree_generate", "ar_generate", "summarize",
           "records_to_arrays", "truncate_tree"]


@dataclass
class RoundRecord:
    """One round: ``drafted`` = L', ``accepted`` = tau (tokens produced: tau + 1), wall times in seconds
    (CUDA-synchronised), and with ``record_rows=True`` the processed rows along the drafted path:
    ``p`` (L'+1, V) target rows P(.|h_{i-1}), i = 1..L'+1; ``q`` (L', V) draft rows; ``drafts`` (L',).

    Tree rounds: ``drafted`` = N' nodes drafted, ``depth`` = D' (the truncated tree's depth), ``nodes``
    the accepted tree nodes (tau of them, by depth); rows: ``p`` (N'+1, V) target rows at every node,
    ``q`` (N'+1, V) the draft rows the node's children were drawn from (uniform placeholders at leaves),
    ``drafts`` (N'+1,) node tokens, the root's (the last committed token) at 0."""
    drafted: int
    accepted: int
    t_draft: float
    t_target: float
    t_verify: float
    p: np.ndarray | None = None
    q: np.ndarray | None = None
    drafts: np.ndarray | None = None
    depth: int | None = None
    nodes: tuple | None = None


@dataclass
class Generation:
    tokens: torch.Tensor                 # (T,) int64 image tokens
    rounds: list[RoundRecord]
    seconds: float
    target_forwards: int
    draft_forwards: int
    info: dict = field(default_factory=dict)

    def stats(self) -> dict:
        return summarize([self])


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _rows(out_logits: torch.Tensor, k: int, proc: Processing) -> torch.Tensor:
    """Processed rows of the last k positions: logits (B, S, V) -> (k, V)."""
    return proc(out_logits[:, -k:])


def _check_rows(p: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"non-finite {name} probabilities (NaN/inf logits from the model?)")


def _device_of(model) -> torch.device:
    d = getattr(model, "device", None)
    return torch.device(d) if d is not None else torch.device("cpu")


def _start(model, num_tokens: int, seed: int, generator: torch.Generator | None):
    """(T, device, generator) of a generation: T = num_tokens checked >= 1; the caller's generator, else
    one on the model's device seeded with ``seed``."""
    T = int(num_tokens)
    if T < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    dev = _device_of(model)
    return T, dev, generator or torch.Generator(device=dev).manual_seed(seed)


def speculative_generate(target, draft, cond, *, num_tokens: int, verifier, L: int | None = None,
                         tree: Tree | None = None, processing: Processing = Processing(), seed: int = 0,
                         generator: torch.Generator | None = None, record_rows: bool = False,
                         progress: bool | None = False) -> Generation:
    """Generate ``num_tokens`` image tokens with speculative decoding (chain drafts of length L, or the
    static draft ``tree``: then this is ``tree_generate``).

    ``target`` follows ``real.protocol.ARModel``; ``draft`` an ``ARModel`` (independent small model,
    prefilled with the same condition) or a ``FeatureDrafter`` (EAGLE). ``verifier`` is a
    ``theory.rules.Verifier``; ``processing`` is applied identically to draft and target logits.
    Returns tokens (T,), per-round records and counts."""
    from tqdm import tqdm

    if tree is not None:
        if L is not None:
            raise ValueError("give a chain length L or a tree, not both (the tree sets the depth)")
        return tree_generate(target, draft, cond, num_tokens=num_tokens, verifier=verifier, tree=tree,
                             processing=processing, seed=seed, generator=generator, record_rows=record_rows,
                             progress=progress)
    if L is None:
        raise ValueError("speculative_generate needs a draft length L (or a tree)")
    check_pair(target, draft)
    T, dev, gen = _start(target, num_tokens, seed, generator)
    if L < 1:
        raise ValueError(f"draft length L must be >= 1, got {L}")
    proc = processing
    B = proc.batch
    feat = bool(getattr(draft, "needs_features", False))

    out: list[torch.Tensor] = []
    records: list[RoundRecord] = []
    t_pending: torch.Tensor | None = None       # last committed token, not yet fed to the target
    d_tok: list[torch.Tensor] = []               # committed tokens not yet fed to the draft
    d_feat: list[torch.Tensor] = []              # (B, k, D) target features paired with d_tok (EAGLE)
    n_target = n_draft = 0
    bar = tqdm(total=T, disable=not progress if progress is not None else None, desc="spec decode", leave=False)
    _sync(dev)
    t_start = time.perf_counter()
    n = 0
    while n < T:
        Lr = 0 if (feat and n == 0) else min(L, T - n - 1)
        # ------------------------------------------------------------------ draft
        t0 = time.perf_counter()
        drafts: list[torch.Tensor] = []
        qrows: list[torch.Tensor] = []
        if Lr > 0:
            if feat:
                o = draft.forward(torch.stack(d_tok).view(1, -1).expand(B, -1), features=torch.cat(d_feat, 1))
            elif n == 0:
                o = draft.prefill(cond, cfg=proc.cfg)
            else:
                o = draft.forward(torch.stack(d_tok).view(1, -1).expand(B, -1))
            n_draft += 1
            d_tok, d_feat = [], []
            for i in range(Lr):
                q = proc(o.logits[:, -1])
                x = sample(q, gen)
                drafts.append(x)
                qrows.append(q)
                if i < Lr - 1:
                    xb = x.view(1, 1).expand(B, 1)
                    o = draft.forward(xb, features=o.hidden[:, -1:]) if feat else draft.forward(xb)
                    n_draft += 1
        _sync(dev)
        t1 = time.perf_counter()
        # ------------------------------------------------------------------ target
        block = torch.stack(drafts).view(1, -1).expand(B, -1) if drafts else None
        if n == 0:
            o_t = target.prefill(cond, block, cfg=proc.cfg, return_hidden=feat)
        else:
            inp = t_pending.view(1, 1).expand(B, 1)
            o_t = target.forward(inp if block is None else torch.cat([inp, block], 1), return_hidden=feat)
        n_target += 1
        p = _rows(o_t.logits, Lr + 1, proc)                     # (L'+1, V)
        _sync(dev)
        t2 = time.perf_counter()
        # ------------------------------------------------------------------ verify
        if Lr == 0:
            _check_rows(p, "target")
            nxt = sample(p[0], gen)
            tau = 0
        else:
            q = torch.stack(qrows)
            if not bool(torch.isfinite(p).all() & torch.isfinite(q).all()):   # one sync for both
                _check_rows(p, "target")
                _check_rows(q, "draft")
            tok = torch.stack(drafts)
            u_acc = torch.rand(Lr, generator=gen, device=dev, dtype=p.dtype)
            u_smp = torch.rand((), generator=gen, device=dev, dtype=p.dtype)
            # a leading batch dim of 1: rules index rows with (...,)-shaped tokens (LANTERN's resampler
            # gathers neighbour rows of the rejected token, which needs at least a 1-d index on torch)
            verdict = verify_chain(p[None], q[None], tok[None], u_acc[None], u_smp[None], verifier)
            tau = int(verdict.accepted[0])
            nxt = verdict.next_token[0]
        _sync(dev)
        t3 = time.perf_counter()
        # ------------------------------------------------------------------ commit + rollback
        new = drafts[:tau] + [nxt]
        out.extend(new)
        if Lr - tau:
            target.rollback(Lr - tau)
        if feat:
            hid = o_t.hidden[:, -(Lr + 1):]
            if n == 0:                                  # pairs over the prefix: (id 0, h_p), then (x_0, h_{P-1})
                P = o_t.hidden.shape[1]
                draft.start(P, B)
                zeros = [torch.zeros((), dtype=torch.long, device=dev)] * (P - 1)
                d_tok, d_feat = zeros + new, [o_t.hidden]
            else:
                if Lr > 1:
                    draft.rollback(Lr - 1)              # the drafter's own (draft, predicted feature) pairs
                d_tok = d_tok + new
                d_feat = d_feat + [hid[:, :tau + 1]]
        elif Lr > 0:
            if tau <= Lr - 1:
                if Lr - 1 - tau:
                    draft.rollback(Lr - 1 - tau)
                d_tok = [nxt]
            else:                                        # all accepted: the last draft was never fed
                d_tok = [drafts[-1], nxt]
        else:
            d_tok = d_tok + [nxt]
        t_pending = nxt
        rec = RoundRecord(Lr, tau, t1 - t0, t2 - t1, t3 - t2)
        if record_rows:
            rec.p = p.float().cpu().numpy()
            rec.q = (torch.stack(qrows) if qrows else p[:0]).float().cpu().numpy()
            rec.drafts = (torch.stack(drafts) if drafts else torch.zeros(0, dtype=torch.long)).cpu().numpy()
        records.append(rec)
        n += tau + 1
        bar.update(tau + 1)
    bar.close()
    _sync(dev)
    seconds = time.perf_counter() - t_start
    tokens = torch.stack(out).reshape(-1).cpu()
    return Generation(tokens, records, seconds, n_target, n_draft,
                      {"method": getattr(verifier, "name", "custom"), "L": L, **proc.params()})


# ----------------------------------------------------------------------------- static trees

def truncate_tree(tree: Tree, depth: int) -> Tree | None:
    """The tree without its nodes deeper than ``depth`` (None when depth < 1): still a valid tree,
    since a node's parent and lower-ranked siblings are never deeper than the node."""
    if depth < 1:
        return None
    if depth >= tree.depth:
        return tree
    return Tree(tuple(p for p in tree.paths if len(p) <= depth))


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
class _TreePlan:
    tree: Tree
    levels: list
    mask: torch.Tensor          # (N+1, N+1) bool tree attention (target)
    depth: torch.Tensor         # (N+1,) node depths (target positions = root position + depth)
    n_fed: int                  # draft cache entries written by levels 1..D-1 (rolled back after the round)


def _tree_plan(tree: Tree, device) -> _TreePlan:
    ch, dep, par_of = tree.children, tree.node_depth, tree.parent
    inner = (ch >= 0).any(1)
    levels, fed = [], []
    for d in range(tree.depth):  # a loop over tree levels (at most D), at plan time only
        par = np.flatnonzero((dep == d) & inner)
        valid = ch[par] >= 0
        K = int(valid.sum(1).max())
        valid = valid[:, :K]
        mask = None if d == 0 else torch.as_tensor(tree.attention_mask[np.ix_(par, fed + list(par))], device=device)
        levels.append(_Level(torch.as_tensor(par, device=device), torch.as_tensor(np.maximum(par_of[par], 0), device=device),
                             torch.as_tensor(ch[par, :K][valid], device=device),
                             torch.as_tensor(np.flatnonzero(valid), device=device), K, mask, d))
        if d > 0:
            fed += list(par)
    return _TreePlan(tree, levels, torch.as_tensor(tree.attention_mask, device=device),
                     torch.as_tensor(dep, device=device), len(fed))


def _gumbel(shape, gen: torch.Generator, device) -> torch.Tensor:
    """Gumbel(0, 1) noise -log(-log U) from float64 uniforms (U = 0, probability 2^-53, gives -inf: that
    token is simply drawn last, no NaN)."""
    u = torch.rand(shape, generator=gen, device=device, dtype=torch.float64)
    return -torch.log(-torch.log(u))


def _draft_tree(draft, plan: _TreePlan, o0, root: torch.Tensor, proc: Processing, gen, feat: bool):
    """Draft the tree level by level. ``o0``: the draft output whose last row follows the root.
    Returns node tokens (N+1,) (root at 0), draft rows q (N+1, V) (uniform at leaves: unused by the
    verifier), draft forwards done."""
    dev = root.device
    N, V = plan.tree.n_nodes, o0.logits.shape[-1]
    B = o0.logits.shape[0]
    tokens = torch.empty(N + 1, dtype=torch.long, device=dev)
    tokens[0] = root
    q = torch.full((N + 1, V), 1.0 / V, dtype=proc.dtype, device=dev)
    hid = o0.hidden.new_empty((B, N + 1, o0.hidden.shape[-1])) if feat else None
    root_pos = draft.cache_len - 1
    fwd = 0
    for lv in plan.levels:  # one draft forward per level (a loop over at most D levels)
        if lv.offset == 0:
            rows = proc(o0.logits[:, -1:])
            if feat:
                hid[:, 0] = o0.hidden[:, -1]
        else:
            x = tokens[lv.parents].view(1, -1).expand(B, -1)
            pos = torch.full((lv.parents.numel(),), root_pos + lv.offset, dtype=torch.long, device=dev)
            if feat:
                o = draft.forward(x, features=hid[:, lv.parent_of], position_ids=pos, attn_mask=lv.mask)
                hid[:, lv.parents] = o.hidden
            else:
                o = draft.forward(x, position_ids=pos, attn_mask=lv.mask)
            rows = proc(o.logits)
            fwd += 1
        q[lv.parents] = rows
        draws = draft_without_replacement(rows, lv.K, _gumbel(rows.shape, gen, dev))   # (k, K)
        tokens[lv.kids] = draws.reshape(-1)[lv.draw]       # index gathers only: no device sync
    return tokens, q, fwd


def tree_generate(target, draft, cond, *, num_tokens: int, verifier, tree: Tree,
                  processing: Processing = Processing(), seed: int = 0, generator: torch.Generator | None = None,
                  record_rows: bool = False, progress: bool | None = False) -> Generation:
    """Generate ``num_tokens`` image tokens with static-tree speculative decoding (module docstring:
    level-by-level drafting without replacement, one tree-masked target forward per round,
    ``theory.tree.verify_tree`` with any ``theory.rules.Verifier``, cache compaction with ``keep``).

    ``target``: an ``ARModel`` with ``position_ids``/``attn_mask`` and ``keep``; ``draft``: an
    ``ARModel`` with ``rollback`` and (S, K) tree masks, or a ``FeatureDrafter`` (EAGLE-1).
    Records: one per round with ``drafted`` = nodes, ``depth``, ``nodes`` (accepted path)."""
    from tqdm import tqdm

    check_pair(target, draft)
    if not isinstance(tree, Tree):
        raise ValueError(f"tree must be a theory.tree.Tree, got {type(tree).__name__}")
    T, dev, gen = _start(target, num_tokens, seed, generator)
    V = int(target.vocab_size)
    if tree.children.shape[1] > V:
        raise ValueError(f"the tree has a node with {tree.children.shape[1]} candidates but V = {V}")
    proc = processing
    B = proc.batch
    feat = bool(getattr(draft, "needs_features", False))
    plans: dict[int, _TreePlan] = {}

    out: list[torch.Tensor] = []
    records: list[RoundRecord] = []
    root: torch.Tensor | None = None             # last committed token, not yet fed to the target
    d_tok: list[torch.Tensor] = []               # committed tokens (1-d blocks) not yet fed to the draft
    d_feat: list[torch.Tensor] = []              # (B, k, D) target features paired with d_tok (EAGLE)
    d_started = False
    n_target = n_draft = 0
    bar = tqdm(total=T, disable=not progress if progress is not None else None, desc="tree decode", leave=False)
    _sync(dev)
    t_start = time.perf_counter()
    n = 0
    while n < T:
        Dr = 0 if n == 0 else min(tree.depth, T - n - 1)
        plan = None
        if Dr > 0:
            if Dr not in plans:
                plans[Dr] = _tree_plan(truncate_tree(tree, Dr), dev)
            plan = plans[Dr]
        Nr = plan.tree.n_nodes if plan else 0
        # ------------------------------------------------------------------ draft (level by level)
        t0 = time.perf_counter()
        if plan is not None:
            pend = torch.cat(d_tok).view(1, -1).expand(B, -1)
            if feat:
                o0 = draft.forward(pend, features=torch.cat(d_feat, 1))
            elif not d_started:
                o0 = draft.prefill(cond, pend, cfg=proc.cfg)
                d_started = True
            else:
                o0 = draft.forward(pend)
            tokens, q, fwd = _draft_tree(draft, plan, o0, root, proc, gen, feat)
            n_draft += 1 + fwd
            d_tok, d_feat = [], []
        _sync(dev)
        t1 = time.perf_counter()
        # ------------------------------------------------------------------ target (one tree-masked forward)
        if n == 0:
            o_t = target.prefill(cond, cfg=proc.cfg, return_hidden=feat)
        elif plan is None:
            o_t = target.forward(root.view(1, 1).expand(B, 1), return_hidden=feat)
        else:
            o_t = target.forward(tokens.view(1, -1).expand(B, -1), position_ids=target.cache_len + plan.depth,
                                 attn_mask=plan.mask, return_hidden=feat)
        n_target += 1
        p = _rows(o_t.logits, Nr + 1, proc)                     # (N'+1, V)
        _sync(dev)
        t2 = time.perf_counter()
        # ------------------------------------------------------------------ verify
        if plan is None:
            _check_rows(p, "target")
            nxt = sample(p[0], gen)
            tau, path = 0, []
        else:
            if not bool(torch.isfinite(p).all() & torch.isfinite(q).all()):   # one sync for both
                _check_rows(p, "target")
                _check_rows(q, "draft")
            u_acc = torch.rand(Nr + 1, generator=gen, device=dev, dtype=p.dtype)
            u_smp = torch.rand((), generator=gen, device=dev, dtype=p.dtype)
            v = verify_tree(p[None], q[None], tokens[None], u_acc[None], u_smp[None], plan.tree, verifier,
                            early_exit=True)
            head = torch.cat([v.accepted, v.path[0]]).tolist()   # one sync: tau and the accepted nodes
            tau, path = int(head[0]), [int(x) for x in head[1:1 + head[0]]]
            nxt = v.next_token[0]
        _sync(dev)
        t3 = time.perf_counter()
        # ------------------------------------------------------------------ commit + compaction
        if plan is not None:
            keep_host = torch.tensor([0] + path, dtype=torch.long)
            target.keep(keep_host)                               # [root; accepted path]
            keep = keep_host.to(dev, non_blocking=True)
            new = torch.cat([tokens[keep[1:]], nxt.view(1)])
            if plan.n_fed:
                draft.rollback(plan.n_fed)                       # the draft's tree levels 1..D'-1
        else:
            new = nxt.view(1)
        out.append(new)
        if feat:
            if n == 0:                                  # pairs over the prefix: (id 0, h_p), then (x_0, h_{P-1})
                P = o_t.hidden.shape[1]
                draft.start(P, B)
                d_tok, d_feat = [torch.zeros(P - 1, dtype=torch.long, device=dev), new], [o_t.hidden]
            else:                                       # pairs (next token, target hidden at root / path nodes)
                d_tok = d_tok + [new]
                d_feat = d_feat + [o_t.hidden[:, keep] if plan is not None else o_t.hidden[:, -1:]]
        else:
            d_tok = d_tok + [new]
        rec = RoundRecord(Nr, tau, t1 - t0, t2 - t1, t3 - t2, depth=Dr, nodes=tuple(path))
        if record_rows:
            rec.p = p.float().cpu().numpy()
            rec.q = (q if plan is not None else p[:0]).float().cpu().numpy()
            if plan is not None:
                rec.drafts = tokens.cpu().numpy()
            else:
                rec.drafts = (root if root is not None else torch.full((), -1, dtype=torch.long)).view(1).cpu().numpy()
        records.append(rec)
        root = nxt
        n += tau + 1
        bar.update(tau + 1)
    bar.close()
    _sync(dev)
    seconds = time.perf_counter() - t_start
    toks = torch.cat(out).cpu()
    return Generation(toks, records, seconds, n_target, n_draft,
                      {"method": getattr(verifier, "name", "custom"), "tree_nodes": tree.n_nodes,
                       "tree_depth": tree.depth, **proc.params()})


def ar_generate(model, cond, *, num_tokens: int, processing: Processing = Processing(), seed: int = 0,
                generator: torch.Generator | None = None, progress: bool | None = False) -> Generation:
    """Plain autoregressive sampling through the same protocol and processing (the baseline): one
    target forward per token, the token drawn from the processed row with the seeded generator."""
    from tqdm import tqdm

    T, dev, gen = _start(model, num_tokens, seed, generator)
    proc = processing
    B = proc.batch
    out, records = [], []
    _sync(dev)
    t_start = time.perf_counter()
    for n in tqdm(range(T), disable=not progress if progress is not None else None, desc="AR decode", leave=False):
        t1 = time.perf_counter()
        o = model.prefill(cond, cfg=proc.cfg) if n == 0 else model.forward(out[-1].view(1, 1).expand(B, 1))
        p = _rows(o.logits, 1, proc)
        _sync(dev)
        t2 = time.perf_counter()
        if n == 0:
            _check_rows(p, "model")
        out.append(sample(p[0], gen))
        _sync(dev)
        records.append(RoundRecord(0, 0, 0.0, t2 - t1, time.perf_counter() - t2))
    _sync(dev)
    seconds = time.perf_counter() - t_start
    return Generation(torch.stack(out).cpu(), records, seconds, T, 0, {"method": "ar", **proc.params()})


def summarize(gens: list[Generation]) -> dict:
    """Aggregate figures over generations: tokens per target call (= tokens per round, mean of tau + 1)
    with its standard error over rounds, accepted drafts tau, acceptance rate (accepted / drafted depth:
    the fraction of draft levels accepted; for chains the depth is L'), drafted tokens (tree nodes) per
    round, time split."""
    taus = np.array([r.accepted for g in gens for r in g.rounds], dtype=np.float64)
    drafted = np.array([r.drafted for g in gens for r in g.rounds], dtype=np.float64)
    depth = np.array([r.drafted if r.depth is None else r.depth for g in gens for r in g.rounds], dtype=np.float64)
    R = len(taus)
    tokens = int(sum(g.tokens.numel() for g in gens))
    secs = float(sum(g.seconds for g in gens))
    td = float(sum(r.t_draft for g in gens for r in g.rounds))
    tt = float(sum(r.t_target for g in gens for r in g.rounds))
    tv = float(sum(r.t_verify for g in gens for r in g.rounds))
    se = float(taus.std(ddof=1) / math.sqrt(R)) if R > 1 else float("nan")
    return {
        "tokens": tokens, "rounds": R, "images": len(gens),
        "target_forwards": int(sum(g.target_forwards for g in gens)),
        "draft_forwards": int(sum(g.draft_forwards for g in gens)),
        "tokens_per_target_call": tokens / R, "tokens_per_target_call_se": se,
        "accepted_mean": float(taus.mean()), "accepted_se": se,
        "drafted_mean": float(drafted.mean()), "depth_mean": float(depth.mean()),
        "acceptance_rate": float(taus.sum() / depth.sum()) if depth.sum() else float("nan"),
        "seconds": secs, "tokens_per_second": tokens / secs if secs > 0 else float("nan"),
        "time_draft_s": td, "time_target_s": tt, "time_verify_s": tv,
        "verify_share": tv / (td + tt + tv) if (td + tt + tv) > 0 else float("nan"),
    }


def records_to_arrays(records: list[RoundRecord], L: int):
    """Stack recorded rounds for ``theory.recorded.predict_rounds``: p (R, L+1, V), q (R, L, V),
    drafts (R, L), n_drafted (R,). Rounds with L' < L are padded with uniform rows (f = 1, D = 0 there,
    and ``n_drafted`` masks them anyway) and token 0; L' = 0 rounds are dropped (nothing to predict)."""
    if any(r.depth is not None for r in records):
        raise ValueError("records_to_arrays stacks chain rounds; these are static-tree rounds (tree_generate)")
    recs = [r for r in records if r.drafted > 0]
    if not recs:
        raise ValueError("no drafted rounds recorded")
    if any(r.p is None for r in recs):
        raise ValueError("rounds were recorded without rows: run with record_rows=True")
    V = recs[0].p.shape[-1]
    R = len(recs)
    p = np.full((R, L + 1, V), 1.0 / V, dtype=np.float32)
    q = np.full((R, L, V), 1.0 / V, dtype=np.float32)
    d = np.zeros((R, L), dtype=np.int64)
    nd = np.array([r.drafted for r in recs], dtype=np.int64)
    for j, r in enumerate(recs):  # copying R recorded rounds into padded arrays, not a hot path
        k = r.drafted
        p[j, :k + 1], q[j, :k], d[j, :k] = r.p, r.q, r.drafts
    return p, q, d, nd
