"""SJD-PAC's release verdict (``real.decode.sjd_pac``'s module docstring): the longest accepted path of a round's tree
(``longest_path_verdict``, the round's ``Proposal.verify`` for ``sjd-pac``) and its expected accepted drafts given
recorded rows (``predict_longest``). numpy or torch rows; imports the theory only."""
from __future__ import annotations

import numpy as np
import torch

from theory.core.xp import gather, gather_rows, namespace, normalize, sample_categorical, take_last
from theory.rules.acceptance import accept_at, reads_f
from theory.tree import Tree, TreeVerdict

__all__ = ["longest_path_verdict", "predict_longest"]


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

    Array operations over the tree, no loop over its nodes: every node's test at once (rows (B, P, V) of the P
    parents, positions as an array), the siblings' recursion by rank (a loop over K) on the parents with several
    children only, a node's acceptance as the AND over its ancestors (``anc``), the winner by one argmax, its residual
    by one step from the recursion's state before its last child."""
    xp = namespace(p, q)
    B, N1, V = p.shape
    ch, dep = tree.children, tree.node_depth.astype(np.int64)
    torch_rows = isinstance(p, torch.Tensor)
    dev = p.device if torch_rows else None
    asarr = (lambda a: torch.as_tensor(a, device=dev)) if torch_rows else np.asarray
    cap = asarr(np.asarray(max_depth) if not torch_rows else max_depth)
    tokens = xp.astype(tokens, xp.int64)
    arV = xp.arange(V, device=dev) if torch_rows else np.arange(V)
    passed = xp.zeros((B, N1), dtype=xp.bool, device=dev) if torch_rows else np.zeros((B, N1), bool)

    def test(par: np.ndarray, kid: np.ndarray, p_j, q_j) -> None:
        """passed[:, kid] for children ``kid`` (m,) of ``par`` (m,) against their rows p_j, q_j (B, m, V)."""
        c = tokens[:, asarr(kid)]
        qc, pc = take_last(q_j, c[..., None], xp)[..., 0], take_last(p_j, c[..., None], xp)[..., 0]
        f = accept_at(verifier.accept, p_j, q_j, asarr(dep[par] + 1), c)
        passed[:, asarr(kid)] = xp.where(qc > 0, u_accept[:, asarr(kid)] < f, pc > 0)

    def residual(p_j, q_left, kids: np.ndarray, pos, last: bool, q_first=None):
        """The siblings' recursion (rank order) for rows p_j, q_left (B, m, V) whose children are ``kids`` (B or 1,
        m, K) (-1 where none) at 1-based positions ``pos`` (broadcastable to (B, m)): each rank's test (``last``
        False: the tests of ranks >= 1 of the parents ``par_m``), and the residual after it as if rejected (after the
        last rank only when ``last``: the winner's next token reads it, the tests do not). ``q_first``: q_left
        normalised, when the caller has it."""
        K = kids.shape[-1]
        for b in range(K):                      # a loop over the K ranks, each over all the rows at once
            has = kids[..., b] >= 0                                                      # (B or 1, m)
            if not has.any():
                break
            q_j = q_first if b == 0 and q_first is not None else normalize(q_left, q_left, xp)
            if b and not last:
                if has[0].all():
                    test(par_m, kids[0, :, b], p_j, q_j)
                else:
                    sel = np.flatnonzero(has[0])
                    test(par_m[sel], kids[0, sel, b], p_j[:, asarr(sel)], q_j[:, asarr(sel)])
            if not last and not (kids[..., b + 1:] >= 0).any():
                return p_j, q_j                 # the state before the last rank's residual (the winner's reads it)
            k = np.maximum(kids[..., b], 0)
            c = take_last(tokens, asarr(np.broadcast_to(k, (B, k.shape[1])).copy()), xp)  # (B, m)
            live = asarr(has) & (cap[:, None] >= asarr(dep[k]))
            f = verifier.accept(p_j, q_j, pos) if reads_f(verifier.resample) else None
            G = verifier.resample(p_j, q_j, f, c)
            p_j = xp.where(live[..., None], G, p_j)
            zero = live[..., None] & (arV == c[..., None])
            q_left = xp.where(zero, xp.zeros_like(q_left), q_left) if torch_rows else np.where(zero, 0.0, q_left)
        return p_j, None

    # rank 0 of every parent: its row and its level's draft row, normalised
    par0 = np.flatnonzero(ch[:, 0] >= 0)
    p0, q0 = p[:, asarr(par0)], q[:, asarr(par0)]
    q0n = normalize(q0, q0, xp)
    test(par0, ch[par0, 0], p0, q0n)
    # ranks 1..K-1: the parents with several children (among par0), by the siblings' recursion
    par_m = np.flatnonzero(ch[:, 1] >= 0) if ch.shape[1] > 1 else np.zeros(0, np.int64)
    snap = None
    if len(par_m):
        m = asarr(np.searchsorted(par0, par_m))
        snap = residual(p0[:, m], q0[:, m], ch[par_m][None], asarr(dep[par_m] + 1), last=False, q_first=q0n[:, m])
    live = cap[:, None] >= asarr(dep)[None, :]                                           # (B, N+1)
    ok = passed & live
    ok[:, 0] = True
    a = np.where(anc >= 0, anc, 0)                                                       # (N+1, D)
    ok = xp.all(ok[:, asarr(a)] | asarr(anc < 0)[None], axis=-1)                         # every ancestor passes
    order = asarr((dep * (N1 + 1) + N1 - np.arange(N1)).astype(np.float64))
    score = xp.where(ok, xp.astype(order, u_sample.dtype)[None, :], xp.full_like(ok, -1.0, dtype=u_sample.dtype))
    win = xp.astype(xp.argmax(score, axis=1), xp.int64)                                  # (B,)
    tau = xp.take(asarr(dep), win, axis=0)
    path = xp.take(asarr(anc), win, axis=0)                                              # (B, D)
    # the next token's row: the residual after all the winner's (live) children (its own row when it has none)
    wins = win.cpu().numpy() if torch_rows else np.asarray(win)
    rows = gather_rows(p, win, xp)
    nk = (ch >= 0).sum(1)
    nkw = nk[wins]
    if len(par_m) and (nk[par_m] != nk[par_m[0]]).any():      # parents of unequal fan-out: the whole recursion
        rows = residual(rows[:, None], gather_rows(q, win, xp)[:, None], ch[wins][:, None],
                        asarr(dep[wins] + 1)[:, None], last=True)[:, 0]
    elif (nkw > 0).any():
        # one step from the state before the winner's last child: a parent of several children (ranks 0..K-2 done by
        # the tests' recursion, ``snap``), else its own rows (the same operations on the same rows: the same bits)
        if snap is not None and (nkw > 1).all():
            at = (asarr(np.arange(B)), asarr(np.searchsorted(par_m, wins)))
            p_pre, q_pre = snap[0][at], snap[1][at]
        else:
            qw = gather_rows(q, win, xp)
            p_pre, q_pre = rows, normalize(qw, qw, xp)
            if snap is not None and (nkw > 1).any():
                at = (asarr(np.arange(B)), asarr(np.searchsorted(par_m, wins).clip(max=len(par_m) - 1)))
                many = asarr(nkw > 1)[:, None]
                p_pre, q_pre = xp.where(many, snap[0][at], p_pre), xp.where(many, snap[1][at], q_pre)
        kid = ch[wins, np.maximum(nkw - 1, 0)]
        c = tokens[asarr(np.arange(B)), asarr(np.maximum(kid, 0))]
        live = asarr(nkw > 0) & (cap >= asarr(dep[np.maximum(kid, 0)]))
        pos = asarr(dep[wins] + 1)
        f = verifier.accept(p_pre, q_pre, pos) if reads_f(verifier.resample) else None
        rows = xp.where(live[:, None], verifier.resample(p_pre, q_pre, f, c), p_pre)
    nxt = sample_categorical(rows, u_sample, xp)
    if uniform_bonus:
        uni = xp.astype(xp.floor(u_sample * V), xp.int64)
        uni = xp.where(uni < V, uni, xp.full_like(uni, V - 1))
        nxt = xp.where(tau == full_depth, uni, nxt)
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
