"""SJD-PAC's release verdict (``real.decode.sjd_pac``'s module docstring): the longest accepted path of a round's tree
(``longest_path_verdict``, the round's ``Proposal.verify`` for ``sjd-pac``) and its expected accepted drafts given
recorded rows (``predict_longest``). numpy or torch rows; imports the theory only."""
from __future__ import annotations

from functools import partial

import numpy as np
import torch

from theory.core.xp import (gather, gather_rows, namespace, normalize, ratio_min1, ratio_min1_floats,
                            sample_categorical, take_last)
from theory.rules.acceptance import Vanilla, accept_at, reads_f
from theory.tree import Tree, TreeVerdict

__all__ = ["longest_path_verdict", "predict_longest"]


class _VerdictPlan:
    """What ``longest_path_verdict`` reads of a tree, host ints built once per tree (``_verdict_plan``): node depths
    ``dep`` (N+1,); the parents of several children ``par_m`` (Pm,) and their positions ``pos_m``; the parents of a
    first child ``par0`` (P0,), par_m first; the recursion's ranks b = 1..R (R <= K - 1: the ranks some parent has)
    and per rank the parents (indices into par_m) with a child of that rank (``sel``, None: all); the children of rank
    b - 1 whose token the recursion's step b removes (``prev``, 0 where none). The draft rows of every test and of the
    recursion in one layout of X = P0 + R Pm rows: rank 0 over par0, then each rank b over all of par_m (``q_src``,
    the node of each row); the codes each row lacks, the tokens of its parent's children of ranks < b, as (row,
    node) pairs (``z_row``, ``z_node``); the tested children in that layout's order ``kid_all``, their positions
    ``pos_all`` and rows ``t_rows`` (None: every row). The ancestor table ``a`` (N+1, D), padded with the root
    (always accepted); the path order ``order`` (N+1,) (deeper first, then the first in path order); per node its
    number of children ``nk``, last child ``last`` (0 where none) and index in par_m ``pm_of`` (0 where none).
    ``on(device)``: the same index arrays as torch tensors there (built once per device). ``depth`` the tree's."""

    def __init__(self, tree: Tree, anc: np.ndarray):
        ch = tree.children
        N1, K = ch.shape
        self.N1, self.K = N1, K
        self.dep = tree.node_depth.astype(np.int64)
        self.depth = int(self.dep.max())
        self.par_m = np.flatnonzero(ch[:, 1] >= 0) if K > 1 else np.zeros(0, np.int64)
        one = np.flatnonzero((ch[:, 0] >= 0) & ~np.isin(np.arange(N1), self.par_m))
        self.par0 = np.concatenate([self.par_m, one]).astype(np.int64)
        self.pos_m = self.dep[self.par_m] + 1
        kids_m = ch[self.par_m]                                                             # (Pm, K)
        P0, Pm = len(self.par0), len(self.par_m)
        self.sel, kid_all, pos_all, t_rows, z_row, z_node = [], [ch[self.par0, 0]], [self.dep[self.par0] + 1], \
            [np.arange(P0)], [], []
        for b in range(1, K):                       # plan time only: a loop over the K ranks
            sel = np.flatnonzero(kids_m[:, b] >= 0)   # the parents (in par_m) with a child of rank b
            if not len(sel):
                break
            self.sel.append(None if len(sel) == Pm else sel)
            kid_all.append(kids_m[sel, b])
            pos_all.append(self.pos_m[sel])
            base = P0 + (b - 1) * Pm
            t_rows.append(base + sel)
            for a in range(b):                      # rank b's draft rows lack the tokens of ranks 0..b-1
                z_row.append(base + np.arange(Pm))
                z_node.append(np.maximum(kids_m[:, a], 0))
        R = len(self.sel)
        self.prev = [np.maximum(kids_m[:, b - 1], 0) for b in range(1, R + 1)]
        self.q_src = np.concatenate([self.par0, np.tile(self.par_m, R)]).astype(np.int64)      # (X,)
        self.z_row = np.concatenate(z_row).astype(np.int64) if z_row else np.zeros(0, np.int64)
        self.z_node = np.concatenate(z_node).astype(np.int64) if z_node else np.zeros(0, np.int64)
        self.kid_all, self.pos_all = np.concatenate(kid_all), np.concatenate(pos_all)
        t_rows = np.concatenate(t_rows)
        self.t_rows = None if len(t_rows) == len(self.q_src) else t_rows
        self.a = np.where(anc >= 0, anc, 0)
        self.anc = np.asarray(anc, np.int64)
        self.order = self.dep * (N1 + 1) + N1 - np.arange(N1)
        self.none = np.full(N1, -1, np.int64)                     # the order of a node that is not accepted
        self.nk = (ch >= 0).sum(1)
        self.last = np.where(self.nk > 0, ch[np.arange(N1), np.maximum(self.nk - 1, 0)], 0)
        self.pm_of = np.zeros(N1, np.int64)
        self.pm_of[self.par_m] = np.arange(Pm)
        self._dev: dict = {}
        self._flat: dict = {}
        self.wins: dict = {}      # one image on the host: (accepted nodes, cap) -> ``_winner``'s arrays (read-only)
        # one image on the host (``_one_image``): each node's children in rank order and depths as Python ints, each
        # node's (row, earlier sibling) pairs of its children's zeroed draft rows, each winner's (tau, path, node)
        self.kids = [[k for k in row if k >= 0] for row in ch.tolist()]
        self.dep_l = self.dep.tolist()
        self.zeros = {}
        for n, ks in enumerate(self.kids):          # plan time only: a loop over the nodes of several children
            if len(ks) > 1:                         # (draft row b lacks the tokens of siblings a < b)
                self.zeros[n] = tuple(np.array(x, np.int64) for x in zip(*[(b, ks[a]) for b in range(len(ks))
                                                                               for a in range(b)]))
        self.ones: dict = {}

    def batch(self, B: int) -> np.ndarray:
        """(B, 1) the batch rows of the host path's flat gathers, built once per B (read-only)."""
        hit = self._flat.get(("batch", B))
        if hit is None:
            hit = self._flat[("batch", B)] = np.arange(B)[:, None]
            hit.setflags(write=False)
        return hit

    def flat(self, V: int) -> tuple:
        """The host path's flat offsets in rows of V codes, built once per V (kept in ``_flat``, as ``batch``'s rows):
        the zeroed entries' rows ``z_row * V`` and the tests' rows ``arange(X or tests) * V`` (an entry (row r, code c)
        of a (B, X, V) array is column r * V + c of its (B, X V) view)."""
        hit = self._flat.get(V)
        if hit is None:
            hit = self._flat[V] = (self.z_row * V, np.arange(len(self.kid_all), dtype=np.int64) * V)
        return hit

    _ARRAYS = ("dep", "par0", "par_m", "pos_m", "kid_all", "pos_all", "q_src", "z_row", "z_node", "a", "anc",
               "order", "none", "last", "pm_of")

    def on(self, device) -> dict:
        """{name: array} of the index arrays: numpy (``device`` None) or torch tensors on ``device`` (each built once)."""
        key = None if device is None else str(device)
        if key in self._dev:
            return self._dev[key]
        if device is None:
            self._dev[None] = {k: getattr(self, k) for k in self._ARRAYS} | {
                "prev": self.prev, "sel": self.sel, "t_rows": self.t_rows}
            return self._dev[None]
        t = lambda a: torch.as_tensor(a, device=device)  # noqa: E731
        self._dev[key] = {k: t(getattr(self, k)) for k in self._ARRAYS} | {
            "prev": [t(a) for a in self.prev], "sel": [None if sel is None else t(sel) for sel in self.sel],
            "t_rows": None if self.t_rows is None else t(self.t_rows)}
        return self._dev[key]


_PLANS: dict = {}          # id(tree) -> (tree, anc, _VerdictPlan): the trees of ``real.decode.sjd_pac``'s cached plans


def _verdict_plan(tree: Tree, anc: np.ndarray) -> _VerdictPlan:
    """The tree's ``_VerdictPlan``, built once per tree object (kept alive here, so its id names it) and ancestor
    table."""
    hit = _PLANS.get(id(tree))
    if hit is not None and hit[0] is tree and hit[1] is anc:
        return hit[2]
    if len(_PLANS) >= 512:
        _PLANS.clear()
    vp = _VerdictPlan(tree, anc)
    _PLANS[id(tree)] = (tree, anc, vp)
    return vp


def _winner(vp: _VerdictPlan, A: dict, ok, cap, torch_rows: bool) -> tuple:
    """The deepest accepted node of each image given its accepted nodes ``ok`` (B, N+1) bool and caps ``cap`` (B,)
    (``longest_path_verdict``; numpy, or torch on the rows' device): (win, tau, path (B, D), the winner's number of
    children ``nkw`` (B,) host ints and their set ``ks``, its index in par_m ``at``, its last child ``kid``, whether
    that child is live ``live`` and the children's position ``pos``), each (B,) unless shown."""
    where, host = (torch.where, partial(torch.as_tensor, device=ok.device)) if torch_rows else (np.where, np.asarray)
    win = where(ok, A["order"][None, :], A["none"][None, :]).argmax(1)                     # (B,)
    win = win if torch_rows else win.astype(np.int64, copy=False)
    nkw = vp.nk[win.cpu().numpy() if torch_rows else win]
    kid = A["last"][win]
    return (win, A["dep"][win], A["anc"][win], nkw, set(nkw.tolist()), A["pm_of"][win], kid,
            host(nkw > 0) & (cap >= A["dep"][kid]), A["dep"][win] + 1)


def longest_path_verdict(p, q, tokens, u_accept, u_sample, verifier, max_depth, *, tree: Tree, anc: np.ndarray,
                         full_depth: int, uniform_bonus: bool) -> TreeVerdict:
    """The release's verdict of one round (module docstring), batched, numpy or torch rows.

    p (B, N+1, V) target rows at every node; q (B, N+1, V) each node's children's draft row; tokens (B, N+1); u_accept
    (B, N+1) one uniform per node; u_sample (B,); max_depth (B,) the images' depth caps; ``tree`` the (truncated)
    tree, ``anc`` (N+1, D) its ancestor table. Sibling b of a node is tested with f from the verifier on (p_b, q_b),
    p_b the verifier's residual after siblings 0..b-1 as if they were rejected, q_b = q without them; a candidate with
    q_b(x) = 0 passes iff p_b(x) > 0 (the release's p > u q). A node is accepted iff it and its ancestors pass; the
    deepest accepted node wins, the first in path order on ties. Next token: from the residual after all the winner's
    (live) children, its own row when it has none; uniform over the V tokens when ``uniform_bonus`` and the winner is
    the end of the full main branch (depth ``full_depth``). Returns a ``TreeVerdict``.

    Array operations over the tree, no loop over its nodes, the tree's index arrays built once per tree
    (``_verdict_plan``): every first child's test at once (rows (B, P0, V) of its P0 parents), the siblings' recursion
    by rank (a loop over K) on the Pm parents with several children, each rank's tests on its rows; a node's
    acceptance as the AND over its ancestors, the winner by one argmax, its residual by one step from the recursion's
    state before its last child. The recursion runs on every parent whatever the depth caps: siblings share a depth,
    so past an image's cap all of a parent's tests are masked and the winner's children are not live (its own row).
    One image on numpy rows with vanilla's f (the benchmark's and a common setting): ``_one_image``, the same bits
    from the tests of the accepted nodes' children alone."""
    vp = _verdict_plan(tree, anc)
    if type(p) is np.ndarray and p.shape[0] == 1 and type(verifier.accept) is Vanilla:
        v = _one_image(vp, p, q, tokens, u_accept, u_sample, verifier, max_depth, full_depth, uniform_bonus)
        if v is not None:
            return v
    return _all_images(vp, p, q, tokens, u_accept, u_sample, verifier, max_depth, full_depth, uniform_bonus)


def _one_image(vp: _VerdictPlan, p, q, tokens, u_accept, u_sample, verifier, max_depth, full_depth: int,
               uniform_bonus: bool) -> TreeVerdict | None:
    """``longest_path_verdict`` of one image (B = 1) on numpy rows p, q (1, N+1, V) of one dtype, float32 or float64,
    with vanilla's f (None where not served: the caller takes ``_all_images``). Top down from the root: only an
    accepted node's children are tested (a node fails when its parent does, so the others' tests decide nothing),
    its siblings' draft rows (q without the earlier siblings' tokens, normalised) and residual recursion built for
    that node alone, the same row operations as ``_all_images``' on its rows (the verifier's rules on rows (1, V), the
    same sums and divisions row for row); the node tests, the acceptance and the winner as Python scalars (the test
    p_b(x) > u q_b(x) by ``ratio_min1_floats``, ``ratio_min1``'s bits); the next token from the winner's recursion
    carried one step on. A loop over the accepted nodes (a few a round), each over its children (K at most)."""
    dt = p.dtype
    if q.dtype != dt or dt not in (np.float32, np.float64):
        return None
    f32 = dt == np.float32
    p0, q0, V = p[0], q[0], p.shape[-1]
    t = np.asarray(tokens).reshape(-1)
    tok = t.tolist()
    ua = np.asarray(u_accept).reshape(-1).tolist()
    cap = int(np.asarray(max_depth).reshape(-1)[0])
    kids, dep = vp.kids, vp.dep_l
    reads = reads_f(verifier.resample)
    memo = {}

    def step(p_b, q_b, n, x):
        """p's recursion one step on (1, V): the residual of p_b after rejecting token x drafted from q_b at a child
        of node n."""
        f = verifier.accept(p_b, q_b, dep[n] + 1) if reads else None
        return verifier.resample(p_b, q_b, f, np.array([x]))

    def states(n):
        """Node n's children's draft rows (k, V) and p's recursion [p_0, .., p_{k-1}] ((1, V) rows), k children."""
        hit = memo.get(n)
        if hit is None:
            ks = kids[n]
            Q = np.repeat(q0[n:n + 1], len(ks), 0)
            if len(ks) > 1:
                jj, zk = vp.zeros[n]
                Q[jj, t[zk]] = 0
            Q = normalize(Q, Q, np)
            ps = [p0[n:n + 1]]
            for b in range(1, len(ks)):             # the siblings in rank order (K at most)
                ps.append(step(ps[-1], Q[b - 1:b], n, tok[ks[b - 1]]))
                if ps[-1].dtype != dt:
                    return None
            hit = memo[n] = (Q, ps)
        return hit

    acc, i = [0], 0
    while i < len(acc):                             # the accepted nodes, parents before children
        n, i = acc[i], i + 1
        if not kids[n] or dep[n] >= cap:
            continue
        st = states(n)
        if st is None:
            return None
        Q, ps = st
        for b, k in enumerate(kids[n]):
            c = tok[k]
            pc, qc = ps[b].item(c), Q.item(b, c)
            if qc > 0:
                f = ratio_min1_floats(pc, qc, f32)
                if f is None:
                    return None
                ok = ua[k] < f
            else:
                ok = pc > 0
            if ok:
                acc.append(k)
    win = min(acc, key=lambda k: (-dep[k], k))     # the deepest, the first in path order on ties
    hit = vp.ones.get(win)
    if hit is None:
        hit = vp.ones[win] = tuple(np.array(x, np.int64) for x in ([dep[win]], vp.anc[win:win + 1], [win]))
        for x in hit:
            x.setflags(write=False)                 # (shared by every later round with this winner)
    tau, path, w = hit
    own = p0[win:win + 1]
    ks = kids[win]
    if ks:                                          # the residual after all its children (its own row where not live)
        st = states(win)
        if st is None:
            return None
        Q, ps = st
        live = cap >= dep[ks[-1]]
        res = step(ps[-1], Q[-1:], win, tok[ks[-1]])
        rows = res if live and res.dtype == dt else np.where(np.array([[live]]), res, own)
    else:
        rows = own
    nxt = sample_categorical(rows, u_sample, np)
    if uniform_bonus and dep[win] == full_depth:
        uni = np.minimum(np.floor(u_sample * V).astype(np.int64), V - 1)
        nxt = np.where(tau == full_depth, uni, nxt)
    return TreeVerdict(tau, path, nxt, w)


def _all_images(vp: _VerdictPlan, p, q, tokens, u_accept, u_sample, verifier, max_depth, full_depth: int,
                uniform_bonus: bool) -> TreeVerdict:
    """``longest_path_verdict`` by array operations over the batch and the tree (its docstring), ``vp`` the tree's
    ``_verdict_plan``."""
    torch_rows = isinstance(p, torch.Tensor)
    xp = np if type(p) is np.ndarray and type(q) is np.ndarray else namespace(p, q)
    B, V = p.shape[0], p.shape[-1]
    if torch_rows:              # the few glue operations called directly (the compat layer's wrappers cost more)
        A, where, cat = vp.on(p.device), torch.where, torch.cat
        host = lambda a: torch.as_tensor(a, device=p.device)   # noqa: E731  host data to the rows' device
        cap, tokens = max_depth, tokens.long()
        passed = torch.zeros((B, vp.N1), dtype=torch.bool, device=p.device)
    else:
        A, where, cat, host = vp.on(None), np.where, np.concatenate, np.asarray
        cap, tokens = np.asarray(max_depth), np.asarray(tokens).astype(np.int64, copy=False)
        passed = np.zeros((B, vp.N1), bool)

    # the draft rows of every test and of the recursion at once: q at each row's parent without its earlier
    # siblings' tokens, normalised (row for row the sums and divisions of the rank-by-rank recursion)
    if torch_rows:
        Q = q.index_select(1, A["q_src"])                                                    # (B, X, V)
        if len(vp.z_row):
            Q.view(B, -1).scatter_(1, A["z_row"][None, :] * V + tokens[:, A["z_node"]], 0.0)
    else:                       # (entries of the rows' flat (B, X V) views: ``_VerdictPlan.flat``)
        z_off, t_off = vp.flat(V)
        Q = np.take(q, A["q_src"], axis=1)          # (a new C-ordered array: its flat view is written below)
        if len(vp.z_row):
            Q.reshape(B, -1)[vp.batch(B), z_off + tokens[:, A["z_node"]]] = 0
    Q = normalize(Q, Q, xp)
    P0, Pm = len(vp.par0), len(vp.par_m)
    reads = reads_f(verifier.resample)
    tests = [p[:, A["par0"]]]             # the target rows of every test: rank 0 of every parent, then ranks 1..R
    states = [None]                       # (p_b, q_b) over the Pm parents of several children, rank b = 0..R
    if Pm:
        p_j, q_j = tests[0][:, :Pm], Q[:, :Pm]                  # par0 lists par_m first
        if torch_rows:          # (torch: contiguous rows, as the per-rank copies were)
            p_j, q_j = p_j.contiguous(), q_j.contiguous()
        states[0] = (p_j, q_j)
        for b, sel in enumerate(A["sel"], 1):           # a loop over the ranks, each over all the parents at once
            c = tokens[:, A["prev"][b - 1]]                                               # (B, Pm) rank b - 1
            f = verifier.accept(p_j, q_j, A["pos_m"]) if reads else None
            p_j = verifier.resample(p_j, q_j, f, c)
            q_j = Q[:, P0 + (b - 1) * Pm:P0 + b * Pm]
            q_j = q_j.contiguous() if torch_rows else q_j
            states.append((p_j, q_j))
            tests.append(p_j if sel is None else p_j[:, sel])
    # every node's test in one call (rank 0's rows, then each rank's)
    kid = A["kid_all"]
    p_t = tests[0] if len(tests) == 1 else cat(tests, 1)
    q_t = Q if A["t_rows"] is None else Q[:, A["t_rows"]]
    c = tokens[:, kid]
    if torch_rows:
        qc, pc = take_last(q_t, c[..., None], xp)[..., 0], take_last(p_t, c[..., None], xp)[..., 0]
    else:                       # the same entries of the (contiguous) test rows' flat views
        at = (vp.batch(B), t_off + c)
        qc, pc = q_t.reshape(B, -1)[at], p_t.reshape(B, -1)[at]
    # vanilla's f at c is ratio_min1 of the entries just gathered (``Vanilla.at``'s own formula on them: the same bits)
    f = (ratio_min1(pc, qc, xp) if type(verifier.accept) is Vanilla
         else accept_at(verifier.accept, p_t, q_t, A["pos_all"], c))
    passed[:, kid] = where(qc > 0, u_accept[:, kid] < f, pc > 0)
    inside = not torch_rows and int(cap.min()) >= vp.depth              # (host: no image's cap inside the tree)
    ok = passed if inside else passed & (cap[:, None] >= A["dep"][None, :])
    ok[:, 0] = True
    ok = ok[:, A["a"]].all(-1)                     # every ancestor passes (the table's padding reads the root's True)
    if torch_rows or B > 1:
        win, tau, path, nkw, ks, at, kid, live, pos = _winner(vp, A, ok, cap, torch_rows)
    else:                       # one image on the host: the winner's arrays depend on its accepted nodes and cap alone
        key = (ok.tobytes(), int(cap.reshape(-1)[0]))
        hit = vp.wins.get(key)
        if hit is None:
            if len(vp.wins) >= 4096:
                vp.wins.clear()
            hit = vp.wins[key] = _winner(vp, A, ok, cap, False)
            for x in hit:
                if isinstance(x, np.ndarray):
                    x.setflags(write=False)                     # (shared by every later round with this key)
        win, tau, path, nkw, ks, at, kid, live, pos = hit
    # the next token's row: the residual after all the winner's live children (its own row when it has none)
    own = gather_rows(p, win, xp) if 0 in ks or 1 in ks or torch_rows else None
    if ks != {0}:
        bi = torch.arange(B, device=p.device) if torch_rows else np.arange(B)
        p_pre = q_pre = None
        if 1 in ks:
            qw = gather_rows(q, win, xp)
            p_pre, q_pre = own, normalize(qw, qw, xp)                    # one child: the winner's own rows
        for r in sorted(k for k in ks if k > 1):        # several: the state before the last child (a rank loop)
            s_p, s_q = states[r - 1][0][bi, at], states[r - 1][1][bi, at]
            if p_pre is None:                           # (a leaf's rows are not read: its children are not live)
                p_pre, q_pre = s_p, s_q
            else:
                pick = host(nkw == r)[:, None]
                p_pre, q_pre = where(pick, s_p, p_pre), where(pick, s_q, q_pre)
        c = tokens[bi, kid]
        f = verifier.accept(p_pre, q_pre, pos) if reads else None
        res = verifier.resample(p_pre, q_pre, f, c)
        # (host rows: where every image's winner has live children, the residual rows themselves, the same values)
        if not torch_rows and live.all() and res.dtype == p.dtype:
            rows = res
        else:
            rows = where(live[:, None], res, gather_rows(p, win, xp) if own is None else own)
    else:
        rows = own
    nxt = sample_categorical(rows, u_sample, xp)
    if uniform_bonus and (torch_rows or (tau == full_depth).any()):       # (host: only when a winner reaches it)
        uni = xp.floor(u_sample * V)
        uni = uni.long().clamp(max=V - 1) if torch_rows else np.minimum(uni.astype(np.int64), V - 1)
        nxt = where(tau == full_depth, uni, nxt)
    return TreeVerdict(tau, path, nxt, win)


def predict_longest(p, q, tokens, tree: Tree, verifier, max_depth=None):
    """Expected accepted drafts per round (R,) of the release's longest-path verdict given recorded rows (the analogue
    of T10 for ``longest_path_verdict``): node tests are independent given the rows, so with g_n(d) the probability
    that an accepted path from node n reaches depth d, g_n(d) = 1 - prod_children (1 - f_c g_c(d)) below depth d and
    E[tau] = sum_{d >= 1} g_root(d). numpy rows (R, N+1, V), tokens (R, N+1), max_depth (R,) ints or None."""
    R, N1, V = p.shape
    ch, dep = tree.children, tree.node_depth
    Dm = int(tree.depth)
    cap = np.full(R, Dm) if max_depth is None else np.asarray(max_depth)
    f_node = np.zeros((R, N1))
    for n in range(N1):   # parents before children
        p_j, q_left = p[:, n], q[:, n]
        for k in (int(c) for c in ch[n] if c >= 0):
            q_j = normalize(q_left, q_left, np)
            c = tokens[:, k]
            i = int(dep[n]) + 1
            qc, pc = gather(q_j, c, np), gather(p_j, c, np)
            f_c = accept_at(verifier.accept, p_j, q_j, i, c)
            f_node[:, k] = np.where(cap >= dep[k], np.where(qc > 0, f_c, (pc > 0) * 1.0), 0.0)
            p_j = verifier.resample(p_j, q_j, verifier.accept(p_j, q_j, i) if reads_f(verifier.resample) else None, c)
            q_left = np.where(np.arange(V) == c[:, None], 0.0, q_left)
    g = np.zeros((R, N1, Dm + 1))
    for n in range(N1 - 1, -1, -1):   # children before parents
        d_n = int(dep[n])
        g[:, n, :d_n + 1] = 1.0
        miss = np.ones((R, Dm + 1))
        for k in (int(c) for c in ch[n] if c >= 0):
            miss *= 1.0 - f_node[:, k, None] * g[:, k]
        g[:, n, d_n + 1:] = 1.0 - miss[:, d_n + 1:]
    return g[:, 0, 1:].sum(1)
