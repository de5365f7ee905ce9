"""The SJD-PAC release's bookkeeping between two target forwards, re-implemented as the timing reference of
``bench_sjd_pac.py`` (issue 55): the same tensor operations at the same shapes as the release's sampler and its
window push-forward (KangJialiang/SJD-PAC @ 4fbc099, ``scheduler/sjd_pac_iteration_lumina_mgpt.py``:
``SJDPACSpeculativeSampler.__call__``, ``push_forward_model_kwargs_and_inputs``, and the loop's re-indexing of the
window by the retrieve paths), written from the release's description, not copied. Not a decoder of this toolkit: it
draws from torch's global generator, as the release does, and nothing checks its tokens.

What one round does, as released (P = K^(D-1) root-to-leaf paths, the main path first; M = D + W - tree nodes; all
rows per path and depth, (P, M - 1, V), in float32, torch's default on a CPU):

* the draft rows: the window's draft row per depth repeated over the P paths; at every tree level, each path's row
  loses the tokens of the node's earlier siblings and is renormalised (the release's q_b);
* the target rows: the sibling recursion p_b = Norm([p_{b-1} - q_{b-1}]_+) by rank, in place, on the tree levels;
* one uniform per (path, depth), shared by the paths through a node; the test p(x) > u q(x); each path's longest
  accepted prefix (cummin), the longest over paths (one ``max`` read back to the host);
* the residual rows [p - q]_+ of the levels past the accepted prefix (the last sibling's at a rejected tree level),
  1e-20 added at id 0, the uniform padding rows for the rest of the window, K draws per row by
  ``torch.multinomial`` without replacement; the continuation's kept tokens put back; the stale rows copied as the
  next window's draft rows;
* the window's tokens re-laid out by the tree's ids; the committed ids concatenated; the next forward's attention mask
  (the context's last row, then the tree mask) and positions. The KV cache's reordering (a loop over the model's
  layers) is left out: the stub target has no cache.
"""
from __future__ import annotations

import numpy as np
import torch


class ReleaseRound:
    """The release's per-round bookkeeping for window ``W``, tree width ``K``, depth ``D``, vocabulary ``V``. Build
    once (the release's tree buffers, at set-up), then ``__call__(probs)`` per round with the target's rows
    ``probs`` (P, M, V) (the softmax at the retrieve paths, which the release computes before its sampler)."""

    def __init__(self, W: int, K: int, D: int, V: int):
        self.W, self.K, self.D, self.V = W, K, D, V
        nodes = (K ** D - 1) // (K - 1) if K > 1 else D
        self.M = D + W - nodes
        P, T = K ** (D - 1), D - 1                       # paths; tree levels (depths 1..D-1)
        self.P = P
        stride = np.array([K ** (T - 1 - c) for c in range(T)], np.int64)                # (T,)
        lp = np.arange(P)[:, None]
        branch = (lp // stride[None]) % K                                                 # (P, T) rank at level c
        # earlier siblings of each (path, level): the paths lp - o * stride, o = 1..branch
        zb, zc, zp = [], [], []
        for o in range(1, K):                            # set-up only
            l, c = np.nonzero(branch >= o)
            zb.append(l), zc.append(c), zp.append(l - o * stride[c])
        t = lambda a: torch.as_tensor(np.concatenate(a) if isinstance(a, list) else a)  # noqa: E731
        self.z_b, self.z_c, self.z_p = t(zb), t(zc), t(zp)
        self.u_b, self.u_c = (torch.as_tensor(a) for a in np.nonzero(branch >= 1))
        self.seq = []                                    # per rank k >= 1: (path, level, the previous sibling's path)
        for k in range(1, K):
            l, c = np.nonzero(branch == k)
            self.seq.append(tuple(torch.as_tensor(a) for a in (l, c, l - stride[c])))
        self.heads = torch.as_tensor((lp // stride[None]) * stride[None])                 # (P, T) group's first path
        first = (lp // (stride * K)[None]) * (stride * K)[None]
        self.first, self.last = torch.as_tensor(first), torch.as_tensor(first + (stride * K)[None] - 1)
        # each path's node at every depth (window slots; W, the padding slot, past a side path's end), the slot of
        # each node's token among the sampler's K x M draws (the release's tree ids), the tree's attention mask
        ret = np.full((P, self.M), W, np.int64)
        ret[:, 0] = 0
        ret[0] = np.arange(self.M)
        ids, parent, tid = {}, list(range(-1, self.M - 1)), list(range(self.M))
        for g in range(1, P):                            # set-up only
            for c in range(T):
                key = tuple(branch[g, :c + 1])
                if not any(key):
                    ret[g, c + 1] = c + 1
                    continue
                if key not in ids:
                    ids[key] = len(parent)
                    parent.append(ret[g, c])
                    tid.append(int(key[-1]) * self.M + c + 1)
                ret[g, c + 1] = ids[key]
        assert len(parent) == W, (len(parent), W)
        self.ret = torch.as_tensor(ret)
        self.tree_ids = torch.as_tensor(tid)
        anc = np.zeros((W, W), bool)
        for j in range(W):                               # set-up only
            i = j
            while i != -1:
                anc[j, i], i = True, parent[i]
        self.tree_mask = torch.as_tensor(anc)
        self.pos = self.tree_mask.sum(-1) - 1
        self.pad = torch.full((self.M, V), 1.0 / V)
        self.q = torch.full((1, self.M, V), 1.0 / V)                                      # the draft rows
        self.window = torch.randint(0, V, (1, W))
        self.ids = torch.zeros(1, 1, dtype=torch.long)
        self.attn = torch.ones(1, W, W + 1, dtype=torch.bool)
        self.pos_ids = torch.zeros(1, 1, dtype=torch.long)

    def __call__(self, probs: torch.Tensor) -> int:
        """One round's bookkeeping (module docstring) on rows ``probs`` (P, M, V); returns the tokens committed."""
        K, D, M = self.K, self.D, self.M
        win = torch.hstack((self.window, -torch.ones_like(self.window[:, -1:])))[0, self.ret]
        L_t = M - 1
        p = probs[:, :L_t]
        q = self.q[:, 1:M].repeat(self.P, 1, 1)
        d = win[:, 1:M]
        q[self.z_b, self.z_c, d[self.z_p, self.z_c]] = 0
        qc = q[self.u_b, self.u_c]
        qc.div_(qc.sum(-1, keepdim=True))
        q[self.u_b, self.u_c] = qc
        for cb, cc, pb in self.seq:                      # the K - 1 sibling ranks
            pc = p[pb, cc].sub_(q[pb, cc]).clamp_min_(0)
            pc.div_(pc.sum(-1, keepdim=True))
            p[cb, cc] = pc
        rnd = torch.rand(d.shape)
        rnd[:, :D - 1] = rnd.gather(0, self.heads)
        rnd[1:, D - 1] = torch.inf
        tk = d.clamp_min(0)[..., None]
        acc = p.gather(-1, tk)[..., 0] > q.gather(-1, tk)[..., 0].mul_(rnd)
        lens = acc.cummin(dim=1).values.sum(dim=1)
        a_len, a_row = torch.max(lens, dim=0)
        a_len, a_row = int(a_len.item()), int(a_row.item())
        res_len = L_t - a_len
        cols = torch.arange(a_len, L_t)
        rows = torch.where(cols < D, a_row, 0)
        rej = ~acc[rows, cols]
        rrows = rows.clone()
        tl = D - a_len - 1
        if tl > 0:
            rrows[:tl] = torch.where(rej[:tl], self.last[rows[:tl], cols[:tl]], rows[:tl])
        q[1:, D - 1] = 0
        res = p[rrows, cols].sub_(q[rrows, cols]).clamp_min_(0)
        res[..., 0].add_(1e-20)
        res = torch.cat([res, self.pad[:M - res_len]], 0)
        st = torch.multinomial(res, K).T
        if (~rej).any():
            v = st[:, :res_len]
            v[1:] = torch.where(rej, v[1:], v[:-1])
            v[0] = torch.where(rej, v[0], d[rows, cols])
        if tl > 0:
            rrows[:tl] = self.first[rrows[:tl], cols[:tl]]
        res[:res_len] = p[rrows, cols]
        self.q = res[None]
        # the push-forward: the window re-laid out, the committed ids, the next forward's mask and positions
        self.window = st.flatten()[self.tree_ids][None]
        self.ids = torch.cat([self.ids, win[None, a_row, 1:a_len + 1], self.window[:, :1]], -1)
        n = self.ids.shape[-1] - 1
        trash = self.attn.shape[-1] - n
        attn = self.attn[:, :, :-trash] if trash > 0 else self.attn
        mask = torch.ones((1, self.W, n + self.W), dtype=torch.bool)
        mask[..., :-self.W] = attn[:, -1:, :]
        mask[..., -self.W:] = self.tree_mask
        self.attn = mask
        self.pos_ids = self.pos_ids[:, -1:] + 1 + self.pos
        return a_len + 1
