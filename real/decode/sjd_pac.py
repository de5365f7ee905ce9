"""SJD-PAC: Speculative Jacobi Decoding with Proactive Drafting and Adaptive Continuation (Kang et al., CVPR 2026,
arXiv 2603.18599), as released and corrected, as one drafter-free drafting mode (``real.protocol.Drafting``).

Facts read from the release (KangJialiang/SJD-PAC at commit 4fbc099f7f765b6b363a767da317c0fb8ad4a980: the sampler
``SJDPACSpeculativeSampler``, the tree builders ``generate_tree_mask_and_retrieve`` / ``setup_speculative_tree_buffers``,
the loop ``SJDPACSampler._sample`` and ``push_forward_model_kwargs_and_inputs``, all in
``scheduler/sjd_pac_iteration_lumina_mgpt.py``; settings in ``test_lumina_mgpt.py``, ``eval_model.py``, README.md),
re-implemented here:

* the window (``max_num_new_tokens``, W) is the number of target rows per call, laid out as a tree: a K-ary tree of
  depth D (``tree_width`` K, ``tree_depth`` D; (K^D - 1) / (K - 1) nodes, root included, D nodes when K = 1) whose
  first branch continues as a chain up to W nodes in all, i.e. the first branch reaches depth M - 1 with
  M = D + W - (K^D - 1) / (K - 1) (the release asserts the tree fits the window). Defaults in the code and in every
  script: K = 3, D = 3 (README's prose names K = 4 in one place, 3 in its option list); W = 64 in the sampler's
  defaults and the demo script, 16 in ``eval_model.py``'s options. The proactive tree is drafted in EVERY round (the
  layout is fixed once per image); no other threshold or switch exists. ``jacobi_loop_interval_l/_r`` are accepted and
  stored but never read: unlike SJD / SCD on Lumina-mGPT, every image token is Jacobi-drafted;
* the K candidates of one tree level are shared by every node of the level above (token of the node at depth d and
  branch b = the b-th of the level's K draws), drawn without replacement from the level's draft row
  (``torch.multinomial(..., K)``, without replacement by default); the draft row q of a level is the same for all its
  nodes; sibling b is verified against q with siblings 0..b-1 removed and renormalised, and against the target row
  made residual by siblings 0..b-1: p_b = Norm([p_{b-1} - q_{b-1}]_+) (recursive rejection sampling's rows);
* the verdict: every node is tested independently (p_b(x) > u q_b(x), one uniform per node, shared by the paths
  through it); each root-to-leaf path accepts its longest all-accepted prefix, and the path with the LONGEST prefix
  wins, the first leaf in (lexicographic) path order on ties (``torch.max`` over leaves). Not the first accepted
  sibling: a later sibling whose subtree accepts deeper wins over an earlier accepted one;
* the next token: below the winning node, a draw from the residual after all its children (the last sibling's
  [p_{K-1} - q_{K-1}]_+; a chain node's [p - q]_+); at a leaf off the main branch, its own target row; when the whole
  main branch (M - 1 drafts) is accepted the sampler has no row left (the last node's logits are not among p) and the
  token is drawn from the UNIFORM padding row over the image tokens;
* adaptive continuation: past the first rejection the tokens of the continuation path (the winning path, then first
  children; past depth D - 1 the main branch) are tested against the rows just computed, which saw the rejected
  token (stale rows), with the same test p(x) > u q(x) and the same uniforms; a token that passes stays as the next
  window's first candidate of its level, the level's other K - 1 candidates drawn from [p - q]_+; a token that fails
  is replaced by K draws (without replacement) from [p - q]_+, at a tree level from the residual after ALL the
  level's siblings (the last sibling's [p_{K-1} - q_{K-1}]_+, as for the next token); below an off-main leaf there is
  no token and the K candidates come from the leaf's own row. Every carried level's new draft row is the stale row p
  itself (not residual);
* new window slots (round one, and levels past the carried ones) hold random image tokens whose draft row is the
  UNIFORM row over the image tokens (not one-hot: ``get_multi_token_for_preparation`` and the uniform padding rows);
  round one draws every node independently (with replacement), later rounds K per level without replacement.

Here (module ``SJDPAC``; ``release=True``, registered ``sjd-pac``): the release's tree, its longest-path verdict
(``real.decode.sjd_pac_verdict.longest_path_verdict``, passed to the round as ``Proposal.verify``), its next token
(uniform after a full main branch, except in greedy decoding, which the release does not have), its continuation and its
uniform initialisation, with any registry verifier's f and residual where the release has vanilla's (the continuation's
keep test stays vanilla's, as released: it is a coupling, not a verification). Departures, none of which changes the
law: round one is the target's prefill alone (token 0 plain) and its window is drawn as every later one (K per level
without replacement); uniforms come from the images' streams (``real.decode.rng``), the continuation's from its own
stream instead of the verification's (the same law: those uniforms decide nothing else); the release's 1e-20 added to
token id 0 of every residual row (a non-image id on Lumina-mGPT) is left out.

As released SJD-PAC is not lossless (docs/theory.md section 12b; tests/test_sjd_pac.py measures it): (a) the longest
path is chosen after looking at nodes deeper than the first rejection, so the committed tokens depend on draws they
must be independent of; (b) after a full main branch the next token is uniform; (c) a continued token is kept by the
test against its own row but replaced from the residual of ALL siblings, so it is not distributed as the stale row
stored as its q; (d) a continued level's other candidates come from [p - q]_+, not from the stale row without the
first candidate, which is what the next verification assumes.

``release=False`` (registered ``sjd-pac-p``, ours) keeps the tree, the carried stale tail and the uniform
initialisation and fixes the four: the standard recursive-rejection walk of the tree (``theory.tree.verify_round``,
first accepted sibling), the next token from the target row after a full branch, the maximal coupling of the carried
token with its stale row (keep x with min(1, p(x) / q(x)), else a draw from Norm([p - q]_+): then y ~ p), and the
level's other K - 1 candidates drawn from p without y (a draw without replacement from p, as verified). By the argument
of section 12 (every q is a function of the window before its position, every uniform used once) it is lossless.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np
import torch

from theory.core.xp import ratio_min1
from theory.tree import Tree, truncate_tree
from real.nn.devpath import to_device
from real.protocol import Proposal

from . import rng as R
from .sjd_pac_verdict import longest_path_verdict, predict_longest

__all__ = ["SJDPAC", "PacWindow", "DEFAULT_WINDOW", "DEFAULT_TREE_WIDTH", "DEFAULT_TREE_DEPTH", "tree_nodes",
           "pac_tree", "longest_path_verdict", "predict_longest"]

DEFAULT_WINDOW = 64            # the sampler's max_num_new_tokens default and the demo's (eval_model.py's option: 16)
DEFAULT_TREE_WIDTH = 3         # tree_width K (code and scripts)
DEFAULT_TREE_DEPTH = 3         # tree_depth D

# purposes of the mode's uniforms (disjoint from real.decode.jacobi's JACOBI + 0..4)
_INIT = R.JACOBI + 8           # Exp(1) noise of the K draws of a fresh level (uniform row), per (slot, token)
_KEEP = R.JACOBI + 9           # continuation: keep-the-stale-token uniforms, per slot
_RES = R.JACOBI + 10           # continuation: Exp(1) noise of the residual draws, per (slot, token)
_SIB = R.JACOBI + 11           # sjd-pac-p: Exp(1) noise of the other candidates of a carried level


def tree_nodes(width: int, depth: int) -> int:
    """Nodes (root included) of the release's K-ary tree of depth D: (K^D - 1) / (K - 1), D when K = 1."""
    return depth if width == 1 else (width ** depth - 1) // (width - 1)


def pac_tree(window: int, width: int, depth: int) -> Tree:
    """The release's window as a ``theory.tree.Tree`` (root excluded from its paths): every path of ranks < K up to
    depth D - 1, then the first branch (0, 0, ...) continued to depth M - 1 (W nodes in all); None-free for W >= 2."""
    M = depth + window - tree_nodes(width, depth)
    paths = [()]
    level = [()]
    for _ in range(depth - 1):      # a loop over the D - 1 branching levels (plan time only)
        level = [p + (k,) for p in level for k in range(width)]
        paths += level
    paths += [(0,) * d for d in range(depth, M)]
    return Tree(tuple(p for p in paths if p))


@dataclass
class PacWindow:
    """Per-image window between rounds: ``cand`` (B, M-1, K) candidate tokens of depths 1..M-1 by rank (chain levels
    use rank 0) and ``q`` (B, M-1, V) the draft row of each depth's candidates; ``plan`` the last proposal's
    (``_Plan``, read by ``advance``)."""
    cand: torch.Tensor
    q: torch.Tensor
    plan: object = None


@dataclass
class _Plan:
    """Everything a round needs that depends only on the truncated tree: the tree, node depths (N+1,) and ranks
    (numpy), the attention mask, children (N+1, K), the ancestor table (N+1, D) and the continuation tables (N+1, M+1)
    (host ints): for an accepted node a and a depth e, the node whose row drafts depth e (``par_np``) and its first
    child (``xn_np``), -1 where none; the same by the next window's level s < S (old depth e = depth(a) + 2 + s, -1
    past the tree): ``cpar`` and ``cxn`` (N+1, S), and ``ctree`` (N+1, S) bool, whether that level has a token and
    was a tree level (old depth <= D - 1: the release's siblings' residual); ``kids_np`` (N+1, 2, K) each node's
    children (0 where none) and whether each exists; as tensors, ``slot`` (N,) each non-root node's candidate in a
    window's flat (level, rank) slots (level = depth - 1) and ``q_rows`` (N+1,) the window level whose draft row each
    node's children read (its depth, at most the window's last level); ``verdicts`` the release's verdict of this
    tree, by whether the bonus token is uniform (built once, ``SJDPAC.propose``)."""
    tree: Tree
    depth: np.ndarray
    rank: np.ndarray
    mask: torch.Tensor
    children: np.ndarray
    anc: np.ndarray
    par_np: np.ndarray
    xn_np: np.ndarray
    kids_np: np.ndarray
    slot: torch.Tensor
    q_rows: torch.Tensor
    cpar: np.ndarray
    cxn: np.ndarray
    ctree: np.ndarray
    verdicts: dict


def _full_tables(tree: Tree, D: int, M: int):
    """The full layout's host tables (``_Plan``'s rank, anc, par, xn); ``D`` the tree depth of the release's layout,
    ``M`` its main length."""
    idx = {(): 0, **{p: i + 1 for i, p in enumerate(tree.paths)}}
    N1 = tree.n_nodes + 1
    rank = np.array([0] + [p[-1] for p in tree.paths], np.int64)
    anc = np.full((N1, max(1, tree.depth)), -1, np.int64)
    par = np.full((N1, M + 1), -1, np.int64)
    xn = np.full((N1, M + 1), -1, np.int64)
    paths = [()] + list(tree.paths)
    for a, pa in enumerate(paths):   # a loop over the tree's nodes (plan time only, once per layout)
        for i in range(len(pa)):
            anc[a, i] = idx[pa[:i + 1]]
        for e in range(len(pa) + 2, M):   # depths past the rejected level: the continuation's parent row
            pp = pa + (0,) * (e - 1 - len(pa)) if e - 1 < D else (0,) * (e - 1)
            if pp in idx:
                par[a, e] = idx[pp]
                xn[a, e] = idx.get(pp + (0,), -1)
    return rank, anc, par, xn


@lru_cache(maxsize=16)
def _layout_tables(window: int, width: int, depth: int):
    """``_full_tables`` of the release's layout (``pac_tree``), built once per process."""
    full = pac_tree(window, width, depth)
    return full, _full_tables(full, depth, depth + window - tree_nodes(width, depth))


@lru_cache(maxsize=256)
def _cached_plan(window: int, width: int, depth: int, Dr: int, device: str) -> _Plan:
    """The plan of the release's layout truncated at depth Dr, on ``device``, sliced from the layout's tables (its
    nodes are in depth order, so the truncated tree is its first n nodes; a table entry naming a node past them
    becomes -1): a plan depends only on these, so it is built once per process (a window larger than the image
    truncates at a new depth every round of an image's end, and every image meets the same depths). Plans hold no
    per-image state."""
    full, (rank, anc, par, xn) = _layout_tables(window, width, depth)
    tree = truncate_tree(full, Dr)
    N1 = tree.n_nodes + 1
    par = par[:N1]
    par = np.where(par < N1, par, -1)
    xn = np.where((par >= 0) & (xn[:N1] < N1), xn[:N1], -1)
    ch = tree.children
    K = ch.shape[1]
    kids = np.concatenate([np.where(ch >= 0, ch, 0), (ch >= 0).astype(np.int64)], 1).reshape(N1, 2, K)
    dev = torch.device(device)
    dep = tree.node_depth.astype(np.int64)
    S = depth + window - tree_nodes(width, depth) - 1                                     # the window's levels
    e = dep[:, None] + 2 + np.arange(S)                               # (N+1, S) old depth of each next level
    inside = e <= S
    cols = np.minimum(e, par.shape[1] - 1)
    cpar = np.where(inside, np.take_along_axis(par, cols, 1), -1)
    cxn = np.where(cpar >= 0, np.take_along_axis(xn, cols, 1), -1)
    return _Plan(tree, dep, rank[:N1], torch.as_tensor(tree.attention_mask, device=dev), ch,
                 np.ascontiguousarray(anc[:N1, :max(1, tree.depth)]), par, xn, kids,
                 torch.as_tensor((dep[1:] - 1) * width + rank[1:N1], device=dev),
                 torch.as_tensor(np.minimum(dep, S - 1), device=dev), cpar, cxn, (cxn >= 0) & (e <= depth - 1), {})


@dataclass(frozen=True)
class SJDPAC:
    """SJD-PAC drafting (module docstring): ``window`` W target rows per call, ``tree_width`` K, ``tree_depth`` D,
    ``release`` (True: as released, ``sjd-pac``; False: ours, lossless, ``sjd-pac-p``). Drafter-free: ``generate``'s
    draft must be None; the window lives in ``run.state``. ``width`` (the image row width the command line passes to
    every drafter-free mode) is not used."""
    window: int = DEFAULT_WINDOW
    tree_width: int = DEFAULT_TREE_WIDTH
    tree_depth: int = DEFAULT_TREE_DEPTH
    release: bool = True
    width: int | None = None
    needs_draft = False
    trees = True

    @property
    def main_length(self) -> int:
        """M: nodes of the main branch, root included (the most tokens one call can give)."""
        return self.tree_depth + self.window - tree_nodes(self.tree_width, self.tree_depth)

    @property
    def max_depth(self) -> int:
        return self.main_length - 1

    @property
    def name(self) -> str:
        return "sjd-pac" if self.release else "sjd-pac-p"

    def check(self, target, draft, num_tokens, verifier, processing, batch_size) -> None:
        """``check_sjd_pac`` and no draft model."""
        if draft is not None:
            raise ValueError(f"{self.name} drafts from the target itself (Jacobi drafts): give no draft model")
        check_sjd_pac(self, num_tokens, None if target is None else int(target.vocab_size))

    def from_prefill(self, run) -> bool:
        return False

    def tree(self) -> Tree:
        """The release's layout for this window (``pac_tree``)."""
        return pac_tree(self.window, self.tree_width, self.tree_depth)

    def start(self, run) -> PacWindow:
        """Every level freshly initialised after the first token (round 0 gave it)."""
        S, K, V = self.max_depth, self.tree_width, int(run.target.vocab_size)
        win = PacWindow(torch.zeros((run.B, S, K), dtype=torch.long, device=run.dev),
                        torch.full((run.B, S, V), 1.0 / V, dtype=run.proc.dtype, device=run.dev))
        _fresh(run, win, np.zeros(run.B, np.int64))
        return win

    def _plan(self, run, Dr: int) -> _Plan:
        """The plan of the tree truncated at depth Dr: built once per process (``_cached_plan``), not per image."""
        return _cached_plan(self.window, self.tree_width, self.tree_depth, int(Dr), str(run.dev))

    def propose(self, run, depth: np.ndarray) -> Proposal:
        """The window's tree truncated to the batch's deepest D'_b: node tokens (a level's candidates by rank) and the
        draft row of each node's children (its level's row); law "without_replacement"."""
        Dr = int(depth.max())
        plan = self._plan(run, Dr)
        win = run.state
        win.plan = plan
        x = win.cand.view(win.cand.shape[0], -1).index_select(1, plan.slot)                          # (B, N)
        q = win.q.index_select(1, plan.q_rows)                                          # (B, N+1, V)
        verify = None
        if self.release:                # the plan's verdict, built once per plan and bonus law
            bonus = not run.proc.greedy
            verify = plan.verdicts.get(bonus)
            if verify is None:
                verify = plan.verdicts[bonus] = partial(longest_path_verdict, tree=plan.tree, anc=plan.anc,
                                                        full_depth=self.max_depth, uniform_bonus=bonus)
        return Proposal(torch.cat([run.last_tokens(), x], 1), q, "without_replacement", plan.tree, plan.depth,
                        plan.mask, 0, verify=verify)

    def advance(self, run, prop, verdict, p, n0) -> None:
        """The next window: levels past the committed token carried from the stale rows ``p`` (B, N+1, V) along the
        continuation path (module docstring; release or coupled), the rest freshly initialised (keyed by the new
        committed lengths). Which levels are carried, and from which node rows, is known on the host (the verdict and
        the plan's tables by accepted node): only those m (image, level) rows are gathered, hashed and drawn from,
        (m, V) each, and a level's K - 1 other candidates only where the next tree reads them (the tree levels, depth
        <= D - 1). On the host path (CPU rows) the keep tests are decided on numpy views of the rows (m entries), so
        the rows each law needs are chosen on the host (the siblings' residual only for the tree levels that failed);
        on the device path the same formulas run on the device and the laws are chosen row by row there (no sync)."""
        win = run.state
        plan = win.plan                                                               # the proposal's (its Dr)
        S, K, V, D = self.max_depth, self.tree_width, p.shape[-1], self.tree_depth
        tau = np.asarray(verdict.accepted, np.int64)
        B = len(tau)
        path = np.asarray(verdict.path, np.int64).reshape(B, -1)
        a = np.where(tau > 0, path[np.arange(B), np.maximum(tau - 1, 0)], 0)           # (B,) the accepted node
        par = plan.cpar[a]                                                              # (B, S) the carried levels'
        act = run.active
        if not act.all():
            par = np.where(act[:, None], par, -1)
        carried = par >= 0
        bs, ss = np.nonzero(carried)                                                    # (m,) the carried levels
        first_free = carried.sum(1)
        # every uniform of the window's update in one pass: the carried levels' keep tests and residual draws
        # (sjd-pac-p: the other candidates' at tree levels), the fresh levels' tokens where the next tree reads them
        read = _next_depth(run, S)
        fresh = _fresh_levels(first_free, S, read)
        fb, fs, fdraw = fresh
        sib = np.flatnonzero(ss < D - 1) if not self.release and K > 1 else _NONE
        asks = [(_KEEP, (S,), bs, ss), (_RES, (S, V), bs, ss), (_SIB, (S, V), bs[sib], ss[sib]),
                (_INIT, (S, V), fb[fdraw], fs[fdraw])]
        u_keep, e_res, e_sib, e_init = run.rng.uniform_rows_many(run.n, asks)
        if len(bs):
            self._carry(run, prop, p, plan, bs, ss, par[bs, ss], plan.cxn[a[bs], ss], plan.ctree[a[bs], ss], sib,
                        u_keep, e_res, e_sib)
        _fresh(run, win, first_free, read, e_init, fresh)

    def _carry(self, run, prop, p, plan, bs, ss, pr, xr, tree, sib, u_keep, e_res, e_sib) -> None:
        """``advance``'s carried levels (m,): images ``bs``, levels ``ss``, the nodes whose rows draft them ``pr``,
        their continuation tokens' nodes ``xr`` (-1: none), whether each was a tree level with a token ``tree``, the
        sjd-pac-p levels with K - 1 others ``sib`` (host ints); their uniforms. Writes the window's levels.

        The same operations on both paths: on the host path (CPU) on numpy views of the rows (no copies to send, the
        keep tests decided there, so the laws are chosen row by row on the host), row sums, logarithms and top-k by
        torch on views of them (the bits of the device path's); on the device path on the device, no sync."""
        win = run.state
        S, K, V = self.max_depth, self.tree_width, p.shape[-1]
        dev = run.dev
        host = run.on_device is None
        m, N1 = len(bs), p.shape[1]
        f_p, f_x, f_s = bs * N1 + pr, bs * N1 + np.maximum(xr, 0), bs * S + ss   # flat rows of p / q, tokens, window
        # (release: the tree levels whose token may fail, sjd-pac-p: the levels with K - 1 others)
        t_rows = np.flatnonzero(tree) if self.release else sib
        if host:
            toks, i_t = prop.tokens.numpy(), t_rows
            dt = win.q.numpy().dtype
            P = p.numpy().reshape(-1, V)[f_p].astype(dt, copy=False)                     # (m, V) stale rows
            qo = prop.q.numpy().reshape(-1, V)[f_p].astype(dt, copy=False)               # their levels' draft rows
            x = toks.reshape(-1)[f_x]                                                    # (m,) their tokens
            px, qx = P[np.arange(m), x], qo[np.arange(m), x]
            u, hx = u_keep.numpy().astype(dt), xr >= 0
            q_win, c_win = win.q.view(-1, V).numpy(), win.cand.view(-1, K).numpy()
        else:           # every index the update reads, sent at once (index_select on flat views)
            toks, dt = prop.tokens, win.q.dtype
            ix = to_device(np.concatenate([f_p, f_s, t_rows, f_x, xr]), dev)
            i_p, f_s, i_t = ix[:m], ix[m:2 * m], ix[2 * m:2 * m + len(t_rows)]
            P = p.reshape(-1, V).index_select(0, i_p).to(dt)
            qo = prop.q.reshape(-1, V).index_select(0, i_p).to(dt)
            x = toks.reshape(-1).index_select(0, ix[2 * m + len(t_rows):3 * m + len(t_rows)])
            px, qx = P.gather(-1, x[:, None])[:, 0], qo.gather(-1, x[:, None])[:, 0]
            u, hx = u_keep.to(dev, dt), ix[3 * m + len(t_rows):] >= 0
            q_win, c_win = win.q.view(-1, V), win.cand.view(-1, K)
        keep = hx & (u < ratio_min1(px, qx))                      # the continuation's vanilla test
        # [p - q]_+ (the coupling residual); rows without a token draw from their own row, an empty residual (p = q)
        # falls back to the row
        w = _safe(_pos_(P - qo), P, own=~hx)
        noise = e_res.log_().neg_()
        noise = noise.numpy() if host else noise.to(dev)
        if self.release:
            if len(t_rows):             # tree levels whose token failed: the residual after all the siblings
                fail = t_rows[~keep[t_rows]] if host else t_rows
                if len(fail):
                    i_f = fail if host else i_t
                    Pf = _rows(P, i_f)
                    last = _safe(_last_sibling_rows(plan, pr[fail], Pf, _rows(qo, i_f), _rows(toks, bs[fail] if host
                                                    else to_device(bs[fail], dev))), Pf)
                    if not host:        # the device path chooses by the kept flags there
                        last = torch.where(keep.index_select(0, i_f)[:, None], w.index_select(0, i_f), last)
                    _put_rows(w, i_f, last)
            # one draw per level, from the law its verdict needs (the same noise: a kept level's K - 1 others are
            # the first K - 1 of the K it would draw)
            d = _draw(w, K, noise)
            cand = _pick(keep, _first_then(x, d), d)
        else:
            y = _pick(keep, x, _draw(w, 1, noise)[:, 0])
            cand = np.repeat(y[:, None], K, 1) if host else y[:, None].expand(-1, K).clone()   # chains read rank 0
            if len(t_rows):
                rest = _zero_at_(_rows(P, i_t), _rows(y, i_t))
                e = e_sib.log_().neg_()
                _put_rows(cand[:, 1:], i_t, _draw(rest, K - 1, e.numpy() if host else e.to(dev)))
        _put_rows(c_win, f_s, cand)
        _put_rows(q_win, f_s, P)

    def params(self) -> dict:
        return {"draft": self.name, "window": self.window, "L": self.max_depth, "tree_width": self.tree_width,
                "tree_depth": self.tree_depth, "tree_nodes": self.window - 1}


def _draw(w, k: int, e):
    """k tokens (..., k) drawn without replacement from weights ``w`` (..., V) by the exponential race (the k largest
    w / e, ``e`` Exp(1) noise); past the tokens of positive weight, distinct tokens of zero weight uniformly (where the
    release's ``torch.multinomial`` refuses a row with fewer than k positive entries). Torch tensors, or numpy arrays
    (the host path: the keys divided there, the top-k by torch on a view, numpy indices returned). On the host, when
    the k largest w / e are all positive (every row has k tokens of positive weight that win the race) the keys of
    the zero weights (-e < 0, below them) cannot change the draw, and the where is skipped: the same tokens."""
    key = w / e
    if isinstance(key, np.ndarray):
        top = torch.from_numpy(key).topk(k, dim=-1)
        if bool((top.values.numpy() > 0).all()):
            return top.indices.numpy()
        return torch.from_numpy(np.where(w > 0, key, -e)).topk(k, dim=-1).indices.numpy()
    if key.device.type == "cpu":
        top = key.topk(k, dim=-1)
        if bool((top.values > 0).all()):
            return top.indices
    return torch.where(w > 0, key, -e).topk(k, dim=-1).indices


def _rows(x, i):
    """Rows i of x: numpy (host ints) or torch (an index tensor), a new array."""
    return x[i] if isinstance(x, np.ndarray) else x.index_select(0, i)


def _put_rows(x, i, v) -> None:
    """x[i] = v by rows, in place: numpy (host ints) or torch (an index tensor)."""
    if isinstance(x, np.ndarray):
        x[i] = v
    else:
        x.index_copy_(0, i, v)


def _row_sums(x):
    """(m, 1) row sums of x (m, V), by torch on both paths (numpy rows through a view): the bits of the device's."""
    return torch.from_numpy(x).sum(-1, keepdim=True).numpy() if isinstance(x, np.ndarray) else x.sum(-1, keepdim=True)


def _pos_(x):
    """[x]_+ in place (a fresh difference of masses: no NaN, no -0.0)."""
    return np.maximum(x, 0, out=x) if isinstance(x, np.ndarray) else x.clamp_(min=0)


def _zero_at_(x, c):
    """x (m, V) with 0 at the codes c (m,), in place."""
    if isinstance(x, np.ndarray):
        x[np.arange(len(c)), c] = 0
        return x
    return x.scatter_(-1, c[:, None], 0.0)


def _safe(w, fallback, own=None):
    """Rows ``w`` (m, V), ``fallback``'s where a row has no mass (p = q exactly: the release would draw its padding
    id 0 there) or where ``own`` (m,) bool (None: nowhere). numpy (the host path: the few such rows copied into ``w``
    in place) or torch (one where over the rows)."""
    if isinstance(w, np.ndarray):
        bad = w.sum(-1) <= 0                  # (only the sign is read: any summation order gives it)
        if own is not None:
            bad |= own
        if bad.any():
            w[bad] = fallback[bad]
        return w
    ok = w.sum(-1, keepdim=True) > 0
    return torch.where(ok if own is None else ok & ~own[:, None], w, fallback)


def _pick(keep, a, b):
    """Where ``keep`` (m,) (numpy or torch, as ``a`` and ``b``), ``a``'s entries (m,) or rows (m, k), else ``b``'s."""
    k = keep if a.ndim == 1 else keep[:, None]
    return np.where(k, a, b) if isinstance(keep, np.ndarray) else torch.where(k, a, b)


def _first_then(x, d):
    """(m, k) ``x`` (m,) then the first k - 1 of ``d`` (m, k): a kept level's candidates (numpy or torch)."""
    if isinstance(x, np.ndarray):
        return np.concatenate([x[:, None], d[:, :-1]], 1)
    return torch.cat([x[:, None], d[:, :-1]], 1)


def _last_sibling_rows(plan: _Plan, par: np.ndarray, P, qo, tokens):
    """The release's residual of a tree level whose stale token failed, the residual after ALL its parent's children,
    Norm([p_{K-1} - q_{K-1}]_+) by the siblings' recursion: (r, V) from the parent nodes ``par`` (r,) (host ints),
    their stale rows P and draft rows qo (r, V) (fresh rows: ``qo`` is overwritten), and their images' node tokens
    (r, N+1); numpy (the host path) or torch. A step whose residual rows all have mass (read on the host) divides
    without the where (the same values)."""
    kids, live = plan.kids_np[par, 0], plan.kids_np[par, 1]                              # (r, K) host
    host = isinstance(P, np.ndarray)
    p_j, q_left = P, qo
    cs = tokens[np.arange(len(par))[:, None], kids] if host else \
        tokens.gather(1, torch.as_tensor(kids, device=P.device))                        # (r, K) the siblings' tokens
    K = kids.shape[-1]
    tiny = np.float64(1e-300) if P.dtype in (np.float64, torch.float64) else np.float32(1e-300)  # float32: 0
    for j in range(K):   # the K siblings in rank order (K <= a few)
        s = _row_sums(q_left)
        s = np.maximum(s, tiny, out=s) if host else s.clamp_(min=1e-300)
        if not host or (s > 0).all():
            q_j = q_left / s
        else:                             # an emptied row (a one-hot q): 0 / 0, NaN, as torch gives it (no warning)
            with np.errstate(invalid="ignore", divide="ignore"):
                q_j = q_left / s
        nxt = _pos_(p_j - q_j)
        s = _row_sums(nxt)
        # ``_safe`` of the normalised row, from its sum before the division (positive iff the row's is)
        if host and bool((s > tiny).all()):                  # the clamp is the identity: the division alone
            nxt /= s
        elif host:                        # (where's division only where s > 0: no 0 / 0 computed)
            nxt = np.divide(nxt, np.maximum(s, tiny), out=p_j.copy(), where=s > 0)
        else:
            nxt = torch.where(s > 0, nxt / s.clamp(min=1e-300), p_j)
        on = live[:, j] > 0
        if on.all():
            p_j = nxt
            if j < K - 1:                 # the last sibling's removal from q is read by no later step
                q_left = _zero_at_(q_left, cs[:, j])
        else:
            on = on[:, None] if host else torch.as_tensor(on, device=P.device)[:, None]
            p_j = _pick(on[:, 0], nxt, p_j) if host else torch.where(on, nxt, p_j)
            z = _zero_at_(q_left.copy() if host else q_left.clone(), cs[:, j])
            q_left = np.where(on, z, q_left) if host else torch.where(on, z, q_left)
    return p_j


def _fresh_levels(first_free: np.ndarray, S: int, read: int | None):
    """The fresh levels (bs, ss) (m,) of a window of S levels: i >= first_free (B,) (host ints); ``draw`` (m,) bool:
    those whose tokens are drawn, i < ``read`` (``_fresh``; None: all)."""
    bs, ss = np.nonzero(np.arange(S)[None, :] >= np.asarray(first_free)[:, None])
    return bs, ss, (ss < read) if read is not None else np.ones(len(ss), bool)


_NONE = np.zeros(0, np.int64)


def _next_depth(run, S: int) -> int:
    """The next round's deepest depth D'_max = max_b D'_b (``run.depths(S).max()``: min(S, T - n_b - 1) over the
    unfinished images, 0 when none is left)."""
    n = run.n[run.n < run.T]
    return min(S, run.T - 1 - int(n.min())) if len(n) else 0


def _fresh(run, win: PacWindow, first_free: np.ndarray, read: int | None = None, e=None, levels=None) -> None:
    """Levels i >= first_free (B,) (host ints) get the uniform draft row and K distinct uniform image tokens (as
    released), keyed by the images' committed lengths; only those levels' uniforms are hashed, and only the tokens
    of levels i < ``read`` (the next round's deepest depth D'_max: its tree reads no deeper level's candidates, and
    D'_max never grows as the images fill, so a level skipped here is never read; None: all). ``e``: those levels'
    uniforms (``_fresh_levels``' drawn rows, hashed by the caller with its others), else hashed here; ``levels``:
    ``_fresh_levels(first_free, S, read)`` when the caller has it. The host path writes through numpy views."""
    B, S, K = win.cand.shape
    bs, ss, draw = levels if levels is not None else _fresh_levels(first_free, S, read)
    if len(bs) == 0:
        return
    V = win.q.shape[-1]
    flat = bs * S + ss                                            # the levels in the window's flat (B * S) rows
    drawn = flat[draw]
    host = run.on_device is None
    if host:
        win.q.view(-1, V).numpy()[flat] = 1.0 / V
    else:
        ix = to_device(np.concatenate([flat, drawn]), run.dev)
        win.q.view(-1, V).index_fill_(0, ix[:len(flat)], 1.0 / V)
    if not len(drawn):
        return
    if e is None:
        e = run.rng.uniform_rows(run.n, _INIT, (S, V), bs[draw], ss[draw])
    # K distinct tokens, uniformly without replacement
    if host:
        win.cand.view(-1, K).numpy()[drawn] = e.topk(K, dim=-1).indices.numpy()
    else:
        win.cand.view(-1, K).index_copy_(0, ix[len(flat):], e.to(run.dev).topk(K, dim=-1).indices)


def check_sjd_pac(spec, num_tokens: int, vocab_size: int | None = None) -> SJDPAC:
    """ValueError naming the option unless ``spec`` is a valid ``SJDPAC`` for images of ``num_tokens`` tokens (and
    ``vocab_size`` image tokens, when known): window, tree width and depth >= 1, the tree within the window (the
    release's assertion), K <= V. The window may exceed the image (the release's default 64 on MNIST's 49 tokens): a
    round's tree is cut at the image's end."""
    if not isinstance(spec, SJDPAC):
        raise ValueError(f"sjd-pac drafting must be a real.decode.sjd_pac.SJDPAC, got {type(spec).__name__}")
    for name in ("window", "tree_width", "tree_depth"):
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    nodes = tree_nodes(spec.tree_width, spec.tree_depth)
    if nodes > spec.window:
        raise ValueError(f"the proactive tree (tree width {spec.tree_width}, depth {spec.tree_depth}: {nodes} nodes) "
                         f"does not fit the window of {spec.window} target rows (the release asserts it): raise the "
                         "window or lower the tree width / depth")
    if vocab_size is not None and spec.tree_width > vocab_size:
        raise ValueError(f"tree width {spec.tree_width} is larger than the vocabulary (V = {vocab_size}): a level's "
                         "candidates are distinct tokens")
    return spec
