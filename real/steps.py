"""The step functions of ``real.engine.generate``: one round of plain AR, chain or static-tree speculative
decoding for a batch of B images, each image with its own committed length n[b].

Shapes: b < B indexes images, r < R = k B model rows (k = 2 with classifier-free guidance: rows
[cond; uncond], ``Run.rows``). Positions are absolute: the target holds the condition prefix (P
positions) then image token j at position P + j; the draft stream is indexed by "elements": an
independent draft's element d_off + j is image token j (d_off = its prefix length), an EAGLE drafter's
element i is the pair (token at target position i + 1, target hidden state at position i), so
d_off = P - 1 and image token j is element P - 1 + j as well (``Run.d_off``).

A round at committed lengths n (docs/theory.md section 1 for chains, section 9 for trees):
  each unfinished image drafts L'_b = min(L, T - n_b - 1) tokens (a tree: depth D'_b = min(D, T - n_b - 1));
  the batch drafts max_b L'_b, ``theory.verify.verify_chain(..., n_drafted=L')`` (``verify_tree(...,
  max_depth=D')``) ignores what a row drafted past its own L'_b, so every image follows exactly the law
  of the batch-1 round; rows that finished (n_b = T) ride along and keep nothing;
  positions past an image's last token (drafts that can never be accepted) are clamped to it.
The draft is first fed the committed tokens it has not seen (``feed_draft``: a ragged block, shorter
rows padded and the padding rolled back at once), so rows that accepted different numbers of drafts
continue in the same forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory.tree import Tree, draft_without_replacement, verify_tree
from theory.verify import verify_chain

from .sampling import Processing, sample

__all__ = ["Run", "Step", "prefill_step", "ar_step", "chain_step", "tree_step", "TreePlan", "tree_plan",
           "truncate_tree"]


def sync(device) -> None:
    """Wait for the device's queued work (CUDA) before a clock is read; a no-op elsewhere."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Run:
    """State of one batch's generation (module docstring for the index conventions)."""
    target: object
    draft: object | None
    proc: Processing
    gen: torch.Generator
    dev: torch.device
    T: int
    n: np.ndarray                        # (B,) committed tokens per image
    out: torch.Tensor                    # (B, T + slack) committed tokens (past n[b]: scratch)
    feat: bool = False                   # the draft is an EAGLE-style feature drafter
    P: int = 0                           # target prefix positions
    d_off: int = 0                       # draft element of image token 0
    hist: torch.Tensor | None = None     # (R, P + T + slack, D) target hidden states by position (feature drafters)
    plans: dict = field(default_factory=dict)
    host: bool = False                   # verify on numpy views of the rows (``verify_on``)

    @property
    def B(self) -> int:
        """Images in the batch."""
        return int(self.n.shape[0])

    @property
    def active(self) -> np.ndarray:
        """(B,) bool: the images still short of T committed tokens."""
        return self.n < self.T

    def rows(self, x):
        """Per-image (B, ...) -> per-model-row (R, ...): the CFG pair's rows share everything."""
        k = self.proc.batch
        if k == 1:
            return x
        return np.tile(x, (k,) + (1,) * (x.ndim - 1)) if isinstance(x, np.ndarray) else x.repeat(k, *([1] * (x.ndim - 1)))

    def positions(self, model, offsets: np.ndarray, cap: int) -> np.ndarray:
        """(R, S) absolute positions: each row's cache length + offsets (S,), clamped to ``cap`` (the
        image's last position: what lies past it is never accepted)."""
        return np.minimum(model.cache_lens[:, None] + offsets[None, :], cap)


@dataclass
class Step:
    """What one round did, per image: drafted L'_b (tree: nodes), accepted tau_b, tree depth D'_b and the
    accepted nodes (B, D) (-1 past tau), times of the batch, and (record_rows) the processed rows."""
    drafted: np.ndarray
    accepted: np.ndarray
    t_draft: float
    t_target: float
    t_verify: float
    draft_forwards: int = 0
    depth: np.ndarray | None = None
    nodes: np.ndarray | None = None
    p: torch.Tensor | None = None        # (B, S+1, V) target rows along the round
    q: torch.Tensor | None = None        # (B, S, V) chain / (B, N+1, V) tree draft rows
    drafts: torch.Tensor | None = None   # (B, S) chain / (B, N+1) tree node tokens

    def to_host(self) -> "Step":
        """The recorded rows as numpy on the host (float32), so a recording run holds no rows on the device."""
        for name in ("p", "q", "drafts"):
            x = getattr(self, name)
            if isinstance(x, torch.Tensor):
                setattr(self, name, (x.float() if x.is_floating_point() else x).cpu().numpy())
        return self


def holds_tensors(obj, depth: int = 4) -> bool:
    """Whether ``obj`` (a verifier, its rules, their schedules...) keeps a torch tensor among its attributes,
    containers included, up to ``depth`` levels (e.g. LANTERN's neighbour table placed on the model device)."""
    if isinstance(obj, torch.Tensor):
        return True
    if depth == 0 or isinstance(obj, (str, bytes, int, float, np.ndarray)) or obj is None:
        return False
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = obj
    else:
        items = getattr(obj, "__dict__", {}).values()
    return any(holds_tensors(x, depth - 1) for x in items)


def host_verification(dev, verifier) -> bool:
    """Whether rounds on ``dev`` can be verified on numpy views of their rows: CPU rows and a verifier whose
    rules hold no torch tensors (``theory`` is array-API code). On (B, V) rows numpy's per-operation cost is
    about a third of torch's, and the tree walk is ~70 such operations per candidate."""
    return torch.device(dev).type == "cpu" and verifier is not None and not holds_tensors(verifier)


def verify_on(run: "Run", fn, *arrays, **kw):
    """``fn(*arrays, **kw)`` (``verify_chain`` / ``verify_tree``) on the round's tensors, or with ``run.host``
    on numpy views of the same memory (no copy); the verdict's fields come back as tensors either way."""
    if not run.host:
        return fn(*arrays, **kw)
    conv = lambda a: a.numpy() if isinstance(a, torch.Tensor) else a  # noqa: E731
    v = fn(*map(conv, arrays), **{k: conv(a) for k, a in kw.items()})
    return type(v)(*(torch.from_numpy(np.ascontiguousarray(a)) for a in v))


def _check_finite(*rows: torch.Tensor) -> None:
    """ValueError unless every entry of the probability rows is finite: rows in [0, 1] sum to a finite number iff
    every entry is, so one reduction and one sync decide the usual case; the entries are looked at only then."""
    if bool(torch.isfinite(sum(r.sum() for r in rows))):
        return
    if not all(bool(torch.isfinite(r).all()) for r in rows):
        raise ValueError("non-finite probabilities (NaN/inf logits from the model?)")


def _commit(run: Run, cand: torch.Tensor, tau: np.ndarray) -> None:
    """Write cand[b, :tau_b + 1] (B, S) at out[b, n_b:]; n_b += tau_b + 1 for unfinished images."""
    act = run.active
    cols = torch.as_tensor(run.n, device=run.dev)[:, None] + torch.arange(cand.shape[1], device=run.dev)
    run.out.scatter_(1, cols, cand)              # past tau_b + 1: scratch, overwritten later
    run.n = run.n + np.where(act, tau + 1, 0)


def _store_hidden(run: Run, hidden: torch.Tensor, pos: np.ndarray) -> None:
    """Feature drafters: keep the target's hidden states (R, S, D) at absolute positions pos (R, S)."""
    idx = torch.as_tensor(pos, device=run.dev)[..., None].expand(-1, -1, hidden.shape[-1])
    run.hist.scatter_(1, idx, hidden.to(run.hist.dtype))


# ----------------------------------------------------------------------------- round 0 and plain AR

def prefill_step(run: Run, conds: list, record: bool) -> Step:
    """Round 0 for every mode: the target's prefill alone gives token 0; the draft is started on the
    same conditions (independent draft: its prefill; feature drafter: ``start``)."""
    t0 = time.perf_counter()
    o = run.target.prefill(conds, cfg=run.proc.cfg, return_hidden=run.feat)
    p = run.proc.rows(o.logits[:, -1:])                                   # (B, 1, V)
    run.P = int(run.target.cache_lens[0])
    if run.draft is not None:
        if run.feat:
            run.hist = o.hidden.new_zeros((o.hidden.shape[0], run.P + run.out.shape[1], o.hidden.shape[-1]))
            run.hist[:, :run.P] = o.hidden
            run.draft.start(run.P, o.hidden.shape[0])
            run.d_off = run.P - 1
        else:
            run.draft.prefill(conds, cfg=run.proc.cfg)
            run.d_off = int(run.draft.cache_lens[0])
    sync(run.dev)
    t1 = time.perf_counter()
    _check_finite(p)
    x = sample(p[:, 0], run.gen)
    _commit(run, x[:, None], np.zeros(run.B, np.int64))
    sync(run.dev)
    zeros = np.zeros(run.B, np.int64)
    return Step(zeros, zeros, 0.0, t1 - t0, time.perf_counter() - t1, int(run.draft is not None and not run.feat),
                p=p if record else None)


def ar_step(run: Run, record: bool) -> Step:
    """One target forward over every image's last token, one token sampled per image (finished images
    ride along and are rolled back)."""
    t0 = time.perf_counter()
    last = run.out.gather(1, torch.as_tensor(run.n - 1, device=run.dev)[:, None])     # (B, 1)
    pos = run.positions(run.target, np.zeros(1, np.int64), run.P + run.T - 1)
    o = run.target.forward(run.rows(last), position_ids=pos, return_hidden=run.feat)
    p = run.proc.rows(o.logits)                                                        # (B, 1, V)
    if run.feat:
        _store_hidden(run, o.hidden, pos)
    sync(run.dev)
    t1 = time.perf_counter()
    x = sample(p[:, 0], run.gen)
    act = run.active
    if not act.all():
        run.target.rollback(run.rows(np.where(act, 0, 1)))
    _commit(run, x[:, None], np.zeros(run.B, np.int64))
    sync(run.dev)
    zeros = np.zeros(run.B, np.int64)
    return Step(zeros, zeros, 0.0, t1 - t0, time.perf_counter() - t1, p=p if record else None,
                drafts=last if record else None)


# ----------------------------------------------------------------------------- drafting

def feed_draft(run: Run):
    """Feed the draft every committed element it has not seen, one ragged block for the batch (shorter
    rows padded with their last element, the padding rolled back at once). Returns the draft output
    rows that follow each row's last committed element: logits (R, V) and hidden (R, D) (or None)."""
    draft = run.draft
    seen = draft.cache_lens[:run.B]
    need = np.where(run.active, run.d_off + run.n, seen)
    f = need - seen
    F = int(f.max())
    idx = np.minimum(seen[:, None] + np.arange(F)[None, :], np.maximum(need - 1, 0)[:, None])   # (B, F)
    idx_t = torch.as_tensor(idx, device=run.dev)
    tok = run.out.gather(1, (idx_t - run.d_off).clamp(min=0))               # elements before token 0: id 0
    tok = torch.where(idx_t < run.d_off, torch.zeros_like(tok), tok)
    pos = run.rows(idx)
    if run.feat:
        fidx = torch.as_tensor(pos, device=run.dev)[..., None].expand(-1, -1, run.hist.shape[-1])
        o = draft.forward(run.rows(tok), features=run.hist.gather(1, fidx), position_ids=pos)
    else:
        o = draft.forward(run.rows(tok), position_ids=pos)
    if (f < F).any():
        draft.rollback(run.rows(F - f))
    last = torch.as_tensor(run.rows(np.maximum(f - 1, 0)), device=run.dev)
    r = torch.arange(last.shape[0], device=run.dev)
    return o.logits[r, last], (o.hidden[r, last] if run.feat else None)


def draft_chain(run: Run, logits: torch.Tensor, hid: torch.Tensor | None, Lr: int):
    """Draft Lr tokens per image from the draft's rows that follow the committed tokens (logits (R, V),
    feature drafters: their hidden (R, D)): tokens (B, Lr), rows q (B, Lr, V)."""
    xs, qs = [], []
    cap = run.d_off + run.T - 1
    for i in range(Lr):   # a loop over the L draft positions (each one batched over images)
        q = run.proc.rows(logits)
        x = sample(q, run.gen)
        xs.append(x)
        qs.append(q)
        if i < Lr - 1:
            pos = run.positions(run.draft, np.zeros(1, np.int64), cap)
            if run.feat:
                o = run.draft.forward(run.rows(x)[:, None], features=hid[:, None], position_ids=pos)
                hid = o.hidden[:, -1]
            else:
                o = run.draft.forward(run.rows(x)[:, None], position_ids=pos)
            logits = o.logits[:, -1]
    return torch.stack(xs, 1), torch.stack(qs, 1)


# ----------------------------------------------------------------------------- chain round

def chain_step(run: Run, L: int, verifier, record: bool, conds: list | None = None) -> Step:
    """One chain round for the batch (module docstring). With ``conds`` this is round 0 of an independent
    draft: both models' prefills, the target's over [prefix; drafts] (target forwards == rounds)."""
    act = run.active
    Lb = np.where(act, np.minimum(L, run.T - run.n - 1), 0)
    Lr = int(Lb.max())
    if Lr == 0:
        return ar_step(run, record) if conds is None else prefill_step(run, conds, record)
    t0 = time.perf_counter()
    if conds is None:
        logits, hid = feed_draft(run)
    else:
        logits, hid = run.draft.prefill(conds, cfg=run.proc.cfg).logits[:, -1], None
        run.d_off = int(run.draft.cache_lens[0])
    x, q = draft_chain(run, logits, hid, Lr)
    sync(run.dev)
    t1 = time.perf_counter()
    if conds is None:
        last = run.out.gather(1, torch.as_tensor(run.n - 1, device=run.dev)[:, None])
        pos = run.positions(run.target, np.arange(Lr + 1), run.P + run.T - 1)
        o = run.target.forward(run.rows(torch.cat([last, x], 1)), position_ids=pos, return_hidden=run.feat)
        if run.feat:
            _store_hidden(run, o.hidden, pos)
    else:
        o = run.target.prefill(conds, run.rows(x), cfg=run.proc.cfg)
        run.P = int(run.target.cache_lens[0]) - Lr
    p = run.proc.rows(o.logits)                                                        # (B, Lr + 1, V)
    sync(run.dev)
    t2 = time.perf_counter()
    _check_finite(p, q)
    u_acc = torch.rand((run.B, Lr), generator=run.gen, device=run.dev, dtype=p.dtype)
    u_smp = torch.rand((run.B,), generator=run.gen, device=run.dev, dtype=p.dtype)
    v = verify_on(run, verify_chain, p, q, x, u_acc, u_smp, verifier, n_drafted=torch.as_tensor(Lb, device=run.dev),
                  check=False)
    tau = v.accepted.cpu().numpy()                                                     # the round's sync
    cand = torch.cat([x, x[:, :1]], 1).scatter(1, v.accepted[:, None], v.next_token[:, None])
    run.target.rollback(run.rows(np.where(act, Lr - tau, Lr + 1)))
    own = Lr - 1 if run.feat else np.where(act, Lr - 1 - np.minimum(tau, Lr - 1), Lr - 1)
    if np.any(own):
        run.draft.rollback(run.rows(np.broadcast_to(own, (run.B,)).astype(np.int64)))
    _commit(run, cand, tau)
    sync(run.dev)
    return Step(Lb, np.where(act, tau, 0), t1 - t0, t2 - t1, time.perf_counter() - t2, Lr,
                p=p if record else None, q=q if record else None, drafts=x if record else None)


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


def _exponential(shape, gen: torch.Generator, device) -> torch.Tensor:
    """Exp(1) noise -log U from float64 uniforms in [0, 1): always > 0 (U = 0, probability 2^-53, gives inf: that
    token is simply drawn last, no NaN)."""
    return torch.rand(shape, generator=gen, device=device, dtype=torch.float64).log_().neg_()


def top_m(x: torch.Tensor, m: int) -> torch.Tensor:
    """Indices (..., m) of the m largest entries of x (..., V) in decreasing order, ties to the lower index:
    ``argsort(x, descending, stable)[..., :m]`` without sorting all V entries (``topk``, then the m winners
    ordered by (value, index)); when a tie straddles the m-th place, the full stable sort decides."""
    V = x.shape[-1]
    if m >= V:
        return torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m]
    val, idx = x.topk(m + 1, dim=-1, sorted=True)
    if bool((val[..., m - 1] == val[..., m]).any()):      # which of the tied entries is in is decided by index
        return torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m]
    idx, val = idx[..., :m], val[..., :m]
    idx, o = idx.sort(dim=-1)                              # by index, then stably by value: ties to the lower id
    return idx.gather(-1, torch.argsort(val.gather(-1, o), dim=-1, descending=True, stable=True))


def draft_tree(run: Run, plan: TreePlan):
    """Feed the draft, then draft the tree level by level (one draft forward per level below the root).
    A node's children: a draw without replacement from its processed row (temperature > 0, lossless), or
    its top-m tokens by guided logits (temperature 0, as EAGLE; ties to the lower token id), the draft
    row then being uniform over them. Returns node tokens (B, N+1) (root at 0), draft rows q (B, N+1, V)
    (uniform at leaves: unused by the verifier), draft forwards done."""
    logits, hid0 = feed_draft(run)
    dev, B, N = run.dev, run.B, plan.tree.n_nodes
    V = logits.shape[-1]
    greedy = run.proc.temperature == 0
    tokens = torch.empty(B, N + 1, dtype=torch.long, device=dev)
    tokens[:, 0] = run.out.gather(1, torch.as_tensor(run.n - 1, device=dev)[:, None])[:, 0]
    q = torch.full((B, N + 1, V), 1.0 / V, dtype=run.proc.dtype, device=dev)
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
            noise = _exponential(rows.shape, run.gen, dev)
            draws = draft_without_replacement(rows, lv.K, exponential=noise)            # (B, k, K)
        tokens[:, lv.kids] = draws.reshape(B, -1)[:, lv.draw]          # index gathers only: no device sync
    if greedy:   # draft rows uniform over each node's drafted children (q only marks the candidates)
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
    tokens, q, fwd = draft_tree(run, plan)
    sync(run.dev)
    t1 = time.perf_counter()
    pos = run.positions(run.target, plan.depth, run.P + run.T - 1)
    o = run.target.forward(run.rows(tokens), position_ids=pos, attn_mask=plan.mask, return_hidden=run.feat)
    p = run.proc.rows(o.logits)                                                        # (B, N+1, V)
    sync(run.dev)
    t2 = time.perf_counter()
    _check_finite(p, q)
    u_acc = torch.rand((run.B, N + 1), generator=run.gen, device=run.dev, dtype=p.dtype)
    u_smp = torch.rand((run.B,), generator=run.gen, device=run.dev, dtype=p.dtype)
    v = verify_on(run, verify_tree, p, q, tokens, u_acc, u_smp, plan.tree, verifier, early_exit=True,
                  max_depth=torch.as_tensor(Db, device=run.dev))
    head = torch.cat([v.accepted[:, None], v.path], 1).cpu().numpy()                  # the round's sync
    tau, path = head[:, 0], head[:, 1:]
    keep = np.concatenate([np.zeros((run.B, 1), np.int64), np.maximum(path, 0)], 1)   # (B, Dr + 1)
    keep_t = torch.as_tensor(keep, device=run.dev)
    run.target.keep(run.rows(keep), run.rows(np.where(act, tau + 1, 0)))
    if run.feat:
        kidx = torch.as_tensor(run.rows(keep), device=run.dev)[..., None].expand(-1, -1, o.hidden.shape[-1])
        _store_hidden(run, o.hidden.gather(1, kidx), run.rows(run.P + run.n - 1)[:, None] + np.arange(Dr + 1))
    if plan.n_fed:
        run.draft.rollback(plan.n_fed)
    cand = tokens.gather(1, keep_t[:, 1:])
    cand = torch.cat([cand, cand[:, :1]], 1).scatter(1, v.accepted[:, None], v.next_token[:, None])
    _commit(run, cand, tau)
    sync(run.dev)
    return Step(np.where(act, N, 0), np.where(act, tau, 0), t1 - t0, t2 - t1, time.perf_counter() - t2, fwd,
                depth=Db, nodes=path, p=p if record else None, q=q if record else None,
                drafts=tokens if record else None)
