"""Dynamic trees regrown at every round start of given images, for their likelihood (``real.decode.score_tree``;
docs/theory.md sections 10, 11b, 11d): ``dynamic_trees`` grows, for every round start n of every image, the tree the
engine's construction (``real.decode.dynamic_tree.grow_tree``) grows there: release keys (one deterministic tree per
start), or lossless stochastic-beam keys (``LOSSLESS_TREES`` independent trees per start, the path's nodes drawn by
importance sampling, ``_Guide``, with their weights: T15). Every expansion level is ONE drafter forward over the
frontiers of a chunk of (round start, tree) units of every image (per-row masks); the drafter's cache is rolled back
after each chunk. The models come as ``real.decode.forced_rows.Forced`` (read once at scoring's entry) and are fed
through its one call, ``Forced.rows`` (processed rows back); this module imports none."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from theory.tree import guided_children, row_trees, select_nodes

from .candidates import expand, top_m
from .sampling import per_model_rows as _rows

__all__ = ["LOSSLESS_TREES", "dynamic_trees"]

LOSSLESS_TREES = 16      # lossless dynamic trees sampled per round start (T15: their weighted mean is the round's law)


@contextlib.contextmanager
def _room(model, need: int):
    """``model`` (the batched protocol, as ``Forced.draft`` holds it) with a fixed cache (``extra_slots`` spare entries
    past the image) sized for ``need`` spare entries for the duration (a prefill allocates it); unbounded caches (None,
    e.g. the transformers caches ``OneRow`` passes on) are left alone. The model itself is sized, never a model it
    wraps (BatchedImageLM's ``model`` is the transformers model: sizing that one left the cache short, issue 50)."""
    old = getattr(model, "extra_slots", None)
    if old is None or old >= need:
        yield
        return
    model.extra_slots = int(need)
    try:
        yield
    finally:
        model.extra_slots = old


def dynamic_trees(m, conds, tok, spec, budget: int, gen: torch.Generator, trees: int = LOSSLESS_TREES):
    """p (B, T, V) and the regrown trees of ``spec`` (a ``DynamicTree``) at every round start: children (B, T, N+1, k),
    node depths, node tokens and parents (B, T, N+1) int64 (module docstring); lossless trees: ``trees``
    independent trees per round start, (B, T, M, N+1, ...), Gumbel noise from ``gen``. ``m``: the models
    (``real.decode.forced_rows.Forced``), ``tok`` (B, T) int64 on ``m.dev``. Round starts n = 1 .. T-2 draft
    (D'(n) >= 1); n = 0 (the prefill) and n = T-1 get a placeholder star (never read)."""
    B, T = tok.shape
    draft, dev = m.draft, m.dev
    Mt = 1 if spec.sampling == "release" else trees
    feat = m.features
    p, hidden = m.rows(m.target, tok[:, :T - 1], conds=conds, hidden=feat)      # (B, T, V)
    N1, k, levels = spec.total, spec.topk, spec.depth
    S = T - 2                                                                      # round starts n = 1 .. T - 2
    parent = torch.zeros((B, T, Mt, N1), dtype=torch.long, device=dev)
    parent[..., 0] = -1
    depth = torch.ones((B, T, Mt, N1), dtype=torch.long, device=dev)
    depth[..., 0] = 0
    node_tokens = torch.zeros((B, T, Mt, N1), dtype=torch.long, device=dev)
    weight = torch.ones((B, T, Mt), dtype=torch.float64, device=dev)             # importance weights (_Guide)
    units = np.repeat(np.arange(1, S + 1), Mt)                                    # (round start, tree) pairs
    S = len(units)
    if S >= 1:
        M = T - 2                      # the drafter's committed entries a round start may hide (the last M)
        R = m.proc.batch * B
        # starts per chunk: the last level's mask, R Sc k (M + levels Sc k) elements, within the budget
        a2, b1 = R * k * k * levels, R * k * M
        Sc = max(1, min(S, int((-b1 + np.sqrt(b1 * b1 + 4.0 * a2 * budget)) / (2 * a2))))
        if feat:
            P = hidden.shape[1] - (T - 1)
            E = P + T - 2
            draft.start(P, R, extra=levels * Sc * k)
            ids = torch.cat([torch.zeros(B, P - 1, dtype=torch.long, device=dev), tok[:, :T - 1]], 1)
            q0, h0 = m.rows(draft, ids, features=hidden[:, :E], position_ids=np.tile(np.arange(E), (R, 1)))
            q0, hid0, d_off = q0[:, P - 1:E - 1], h0[:, P - 1:E - 1], P - 1
        else:
            with _room(draft, levels * Sc * k + 1):
                q0 = m.rows(draft, tok[:, :T - 1], conds=conds)[0][:, 1:T - 1]
            hid0 = None
            d_off = int(draft.cache_lens[0]) - (T - 1)
        for a in range(0, S, Sc):      # a loop over chunks of (round start, tree) units (memory), `levels` forwards each
            ns = units[a:a + Sc]
            idx = torch.as_tensor(ns, device=dev)
            tree = torch.as_tensor(np.arange(a, a + len(ns)) % Mt, device=dev)
            *got, w = _grow(m, spec, tok, ns, q0[:, idx - 1], None if hid0 is None else hid0[:, idx - 1], d_off, M,
                            gen, p)
            for arr, g in zip((parent, depth, node_tokens), got):
                arr[:, idx, tree, :g.shape[-1]] = g
            weight[:, idx, tree] = w
    if Mt == 1:                        # the release's one deterministic tree per round start
        parent, depth, node_tokens = parent[:, :, 0], depth[:, :, 0], node_tokens[:, :, 0]
    children = row_trees(parent, k, depth=spec.max_depth, node_depth=depth).children
    return p, (children, depth, node_tokens, parent, weight)


def _depth_caps(spec, ns: np.ndarray, T: int) -> np.ndarray:
    """D'(n) = min(depth + 1, T - n - 1) (S,) for ``spec`` (a ``DynamicTree``): the depth an image's round at start n walks, and the deepest level it
    selects its tree among (``grow_tree``'s ``caps``)."""
    return np.minimum(spec.max_depth, T - ns - 1)


def _grow(m, spec, tok, ns: np.ndarray, q0, hid0, d_off: int, M: int, gen: torch.Generator, p: torch.Tensor):
    """The trees (``spec``, a ``DynamicTree``; lossless keys: Gumbel noise from ``gen``) of round starts ``ns`` (S,)
    of every image (a start may repeat: independent trees), as ``grow_tree`` grows one image's, by ``m.draft``
    (``m``: the models, ``real.decode.forced_rows.Forced``): q0 (B, S, V) the drafter's processed rows after each
    start's committed entries (hid0 (R, S, H) its features, EAGLE), ``depth`` expansions (one drafter forward each
    over the S k frontier nodes of every image, per-row masks), the image's own depth cap D'(n) ranking deeper nodes
    last, the best N nodes. -> parents, node depths, node tokens (B, S, n+1) int64 (n = min(N, pool))."""
    B, T, S = tok.shape[0], tok.shape[1], len(ns)
    draft, dev, feat = m.draft, m.dev, m.features
    kr, k, levels = m.proc.batch, spec.topk, spec.depth
    R = kr * B
    def gumbel(shape):                 # Gumbel(0, 1) noise for lossless keys (None: release keys)
        if spec.sampling == "release":
            return None
        return torch.rand(shape, generator=gen, dtype=torch.float64, device=dev).log_().neg_().log_().neg_()

    zero = torch.zeros(q0.shape[:-1], dtype=torch.float64, device=dev)
    nt = torch.as_tensor(ns, device=dev)
    caps = torch.as_tensor(_depth_caps(spec, ns, T), device=dev)                  # D'(n)
    guide = _Guide(spec, p, tok, nt, caps, gen, dev)
    noise = gumbel(q0.shape)
    drawn, onf = guide.root(q0)                               # the path's children, drawn towards the image
    tok_f, key, logp = expand(spec, q0, zero, zero, noise, drawn)                # (B, S, k) the root's children
    toks, keys, fronts = [tok_f], [key], []
    front = torch.arange(k, device=dev).expand(B, S, -1)
    fhid = hid0[:, :, None].expand(-1, -1, k, -1) if feat else None               # (R, S, k, H)
    anc = torch.zeros((B, S, k, 0), dtype=torch.bool, device=dev)                # ancestors among this start's entries
    eye_k = torch.eye(k, dtype=torch.bool, device=dev)
    eye_s = torch.eye(S, dtype=torch.bool, device=dev)
    seen = (torch.arange(M, device=dev)[None, :] < (nt[:, None] - 1))           # (S, M) committed entries visible
    seen = seen[None, :, None, :].expand(B, -1, k, -1).reshape(B, S * k, M)
    cap = d_off + T - 1
    size = k
    for i in range(levels):   # one drafter forward per expansion level (a loop over at most `depth` levels)
        pos = np.repeat(np.minimum(d_off + ns + i, cap), k)                       # root d_off + n - 1, plus 1 + i
        blocks = anc.reshape(B, S, k, i, k)                                       # [image, start, node, level, node']
        blocks = eye_s[None, :, None, None, :, None] & blocks[:, :, :, :, None, :]   # (B, S, k, i, S, k)
        mask = torch.cat([seen, blocks.reshape(B, S * k, i * S * k),
                          torch.eye(S * k, dtype=torch.bool, device=dev).expand(B, -1, -1)], -1)
        mask = mask[0] if B == 1 else _rows(mask, kr)
        kw = {"features": fhid.reshape(R, S * k, -1)} if feat else {}
        q, hid = m.rows(draft, tok_f.reshape(B, S * k), position_ids=np.tile(pos, (R, 1)), attn_mask=mask, **kw)
        q = q.reshape(B, S, k, -1)                                               # (B, S, k, V)
        noise = gumbel(q.shape)
        drawn, con = guide.level(i, q, onf, key, logp)        # the path node's children, drawn towards the image
        ctok, ckey, clogp = expand(spec, q, key, logp, noise, drawn)              # (B, S, k, k) the level
        ctok, ckey, clogp, con = (a.reshape(B, S, k * k) for a in (ctok, ckey, clogp, con))
        base = size
        fronts.append(front)
        toks.append(ctok)
        keys.append(ckey)
        size += k * k
        if i + 1 < levels:                     # the next frontier: the k best of the k^2
            best = top_m(ckey, k)                                                 # (B, S, k)
            out = best // k
            tok_f, key, logp = ctok.gather(-1, best), ckey.gather(-1, best), clogp.gather(-1, best)
            onf = con.gather(-1, best)
            front = base + best
            if feat:
                h = hid.reshape(R, S, k, -1)
                fhid = h.gather(2, _rows(out, kr)[..., None].expand(-1, -1, -1, h.shape[-1]))
            prev = anc.gather(2, out[..., None].expand(-1, -1, -1, anc.shape[-1]))
            anc = torch.cat([prev, eye_k[out]], -1)
    draft.rollback(levels * S * k)
    n = min(spec.n_nodes, size)
    pool_keys = torch.cat(keys, -1)                                               # (B, S, pool)
    pool_parents = torch.cat([torch.full((B, S, k), -1, dtype=torch.long, device=dev)]
                             + [f.repeat_interleave(k, dim=-1) for f in fronts], -1)
    pool_depth = torch.cat([torch.ones(k, dtype=torch.long, device=dev)]
                           + [torch.full((k * k,), 2 + i, dtype=torch.long, device=dev) for i in range(levels)])
    pool_keys = pool_keys.masked_fill(pool_depth[None, None, :] > caps[None, :, None], -float("inf"))
    sel, parent = select_nodes(pool_keys, pool_parents, n)                       # (B, S, n), (B, S, n+1)
    zero = torch.zeros((B, S, 1), dtype=torch.long, device=dev)
    node_depth = torch.cat([zero, pool_depth[sel]], -1)
    node_tok = torch.cat([tok[:, nt - 1][..., None], torch.cat(toks, -1).gather(-1, sel)], -1)
    return parent, node_depth, node_tok, guide.weight


GUIDE_NATURAL = 0.1       # share of lossless trees drawn as the engine draws them (the defensive proposal)


class _Guide:
    """Importance sampling of lossless trees towards the image's own path (T15, docs/theory/likelihood.md 11d). Each
    tree (unit) draws a target t: with probability ``GUIDE_NATURAL`` none (drawn as the engine draws it), else a
    block length t uniform in 0..D'(n); the path's node at depth d < t drafts the image's token first (``first``),
    the one at depth t drafts tokens the target rejects (``rejected``), the others are natural. The path's nodes are
    the root, then the frontier node whose path spells the image; every other node is drawn as the engine draws it.
    ``weight`` (B, S): 1 / sum_t P(t) pi_t(tree) / P(tree), the balance heuristic over all targets, computed from
    the log ratios ``theory.tree.guided_children`` returns for every path node. Release trees: weight 1."""

    def __init__(self, spec, p, tok, nt, caps, gen, dev):
        """``caps`` (S,) the units' depth caps D'(n), a tensor on ``dev``; ``nt`` (S,) their round starts."""
        self.on = spec.sampling != "release"
        self.p, self.tok, self.nt, self.caps, self.gen, self.dev, self.k = p, tok, nt, caps, gen, dev, spec.topk
        B, S = tok.shape[0], len(nt)
        self.shape, self.D = (B, S), int(spec.max_depth)
        if not self.on:
            return
        u = torch.rand((B, S), generator=gen, dtype=torch.float64, device=dev)
        t = torch.floor((u - GUIDE_NATURAL) / (1 - GUIDE_NATURAL) * (self.caps + 1)[None, :].double()).long()
        self.target = torch.where(u < GUIDE_NATURAL, torch.full_like(t, -1), torch.minimum(t, self.caps[None, :]))
        self.logr = torch.zeros((B, S, self.D, 2), dtype=torch.float64, device=dev)   # path node d: log ratios

    @property
    def weight(self) -> torch.Tensor:
        """(B, S) float64: the trees' importance weights (class docstring)."""
        B, S = self.shape
        if not self.on:
            return torch.ones((B, S), dtype=torch.float64, device=self.dev)
        t = torch.arange(self.D + 1, device=self.dev)                             # targets 0..D
        lf = torch.cat([torch.zeros((B, S, 1), dtype=torch.float64, device=self.dev),
                        self.logr[..., 0].cumsum(-1)], -1)                        # (B, S, D+1): sum_{d<t} log F_d
        lr = torch.cat([self.logr[..., 1], torch.zeros((B, S, 1), dtype=torch.float64, device=self.dev)], -1)
        lr = torch.where(t[None, None, :] < self.caps[None, :, None], lr, torch.zeros_like(lr))   # at the cap: natural
        ok = t[None, None, :] <= self.caps[None, :, None]
        mix = torch.where(ok, (lf + lr).exp(), torch.zeros_like(lf)).sum(-1) * (1 - GUIDE_NATURAL) / (self.caps + 1)
        return 1.0 / (GUIDE_NATURAL + mix)

    def _draw(self, q, d, key, logp, has):
        """Children of the path nodes at depth d (rows q (B, S, V)), by each unit's proposal: tokens, keys, logps
        (B, S, k); their log ratios are kept where ``has`` (B, S) (the path's node exists and its children are
        walked)."""
        at = self._at(d)
        u = torch.rand((*q.shape[:-1], self.k, 3), generator=self.gen, dtype=torch.float64, device=self.dev)
        mode = torch.where(self.target < 0, 0, torch.where(d < self.target, 1, torch.where(d == self.target, 2, 0)))
        mode = torch.where(d < self.caps[None, :], mode, torch.zeros_like(mode))
        tok, key, logp, lr = guided_children(key, logp, q.double(), self.p[:, at].double(), self.tok[:, at], u,
                                             self.k, mode)
        self.logr[:, :, d] = torch.where(has[..., None], lr, torch.zeros_like(lr))
        return tok, key, logp

    def _at(self, d: int) -> torch.Tensor:
        """(S,) the position of the path's token at depth d of each unit's round (clamped to the image)."""
        return torch.clamp(self.nt + d, max=self.tok.shape[1] - 1)

    def root(self, q0):
        """The root's children (rows q0 (B, S, V)) as ``expand(drawn=...)`` takes them, all drawn here, and which
        of them is the path's node (B, S, k); (None, None) for release trees."""
        if not self.on:
            return None, None
        zero = torch.zeros(q0.shape[:-1], dtype=torch.float64, device=self.dev)
        tok, key, logp = self._draw(q0, 0, zero, zero, torch.ones_like(zero, dtype=torch.bool))
        return (torch.ones_like(tok, dtype=torch.bool), tok, key, logp), tok == self.tok[:, self._at(0)][..., None]

    def level(self, i, q, onf, key, logp):
        """Level i: the frontier (B, S, k) at depth i + 1 with rows q (B, S, k, V), keys and log-probabilities
        (B, S, k); ``onf`` marks the path's node. -> the path node's children as ``expand(drawn=...)`` takes them
        (None for release trees), and which children (B, S, k, k) are the path's next node."""
        if not self.on:
            return None, torch.zeros((*q.shape[:-1], self.k), dtype=torch.bool, device=q.device)
        has = onf.any(-1) & (i + 2 <= self.caps)[None, :]                       # the path's children are walked
        j = onf.to(torch.int64).argmax(-1)                                      # (B, S) its frontier slot
        qj = q.gather(2, j[..., None, None].expand(-1, -1, 1, q.shape[-1]))[:, :, 0]
        gt, gk, gl = self._draw(qj, i + 1, key.gather(-1, j[..., None])[..., 0], logp.gather(-1, j[..., None])[..., 0],
                                has)
        sel = (onf & has[..., None])[..., None]                                 # (B, S, k, 1) the path's node
        nxt = self.tok[:, self._at(i + 1)]
        return (sel, gt[:, :, None], gk[:, :, None], gl[:, :, None]), sel & (gt[:, :, None] == nxt[..., None, None])
