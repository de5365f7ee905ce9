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

from dataclasses import dataclass, field
from functools import cached_property, lru_cache, partial

import numpy as np
import torch

from theory.tree import Tree, truncate_tree
from real.protocol import Proposal

from .sjd_pac_verdict import longest_path_verdict, predict_longest
from .rng import rows_plan
from .sjd_pac_window import (_INIT, _KEEP, _NONE, _RES, _SIB, _fresh, _fresh_levels, _next_depth, carry,
                             carry_index)

__all__ = ["SJDPAC", "PacWindow", "DEFAULT_WINDOW", "DEFAULT_TREE_WIDTH", "DEFAULT_TREE_DEPTH", "tree_nodes",
           "pac_tree", "longest_path_verdict", "predict_longest"]

DEFAULT_WINDOW = 64            # the sampler's max_num_new_tokens default and the demo's (eval_model.py's option: 16)
DEFAULT_TREE_WIDTH = 3         # tree_width K (code and scripts)
DEFAULT_TREE_DEPTH = 3         # tree_depth D


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
    (``_Plan``, read by ``advance``); ``plans`` the batch's plans by truncation depth (``_cached_plan``'s, looked up
    once per depth and batch)."""
    cand: torch.Tensor
    q: torch.Tensor
    plan: object = None
    plans: dict = field(default_factory=dict)
    _views: tuple | None = field(default=None, repr=False)

    def host_views(self) -> tuple:
        """numpy views of the window's CPU tensors (the host path): q as (B, S, V) and (B S, V), cand as (B, S K) and
        (B S, K); made once per pair of tensors (the update writes them in place; a tensor put in their place gets
        views of its own)."""
        v = self._views
        if v is None or v[4] is not self.q or v[5] is not self.cand:
            B, S, K = self.cand.shape
            q, c = self.q.numpy(), self.cand.numpy()
            v = self._views = (q, q.reshape(B * S, -1), c.reshape(B, S * K), c.reshape(B * S, K), self.q, self.cand)
        return v


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
    node's children read (its depth, at most the window's last level), both also as host ints (``slot_np``,
    ``q_rows_np``: the host path's gathers); ``verdicts`` the release's verdict of this
    tree, by whether the bonus token is uniform (built once, ``SJDPAC.propose``); ``moves`` the window update's index
    arrays of one image by (accepted node, next depth read, release, V, host path) (``SJDPAC._moves``, built once
    each) with its uniforms' ``rng.rows_plan`` (host path)."""
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
    moves: dict
    slot_np: np.ndarray = None
    q_rows_np: np.ndarray = None


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
    slot, q_rows = (dep[1:] - 1) * width + rank[1:N1], np.minimum(dep, S - 1)
    return _Plan(tree, dep, rank[:N1], torch.as_tensor(tree.attention_mask, device=dev), ch,
                 np.ascontiguousarray(anc[:N1, :max(1, tree.depth)]), par, xn, kids, torch.as_tensor(slot, device=dev),
                 torch.as_tensor(q_rows, device=dev), cpar, cxn, (cxn >= 0) & (e <= depth - 1), {}, {}, slot, q_rows)


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

    @cached_property
    def main_length(self) -> int:
        """M: nodes of the main branch, root included (the most tokens one call can give); computed once (the round
        reads it several times; a frozen instance's cache lives in its __dict__, outside its fields)."""
        return self.tree_depth + self.window - tree_nodes(self.tree_width, self.tree_depth)

    @cached_property
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
        """The plan of the tree truncated at depth Dr: built once per process (``_cached_plan``), not per image; the
        batch's window keeps the ones it met (``PacWindow.plans``)."""
        plans = run.state.plans
        hit = plans.get(Dr)
        if hit is None:
            hit = plans[Dr] = _cached_plan(self.window, self.tree_width, self.tree_depth, int(Dr), str(run.dev))
        return hit

    def propose(self, run, depth: np.ndarray) -> Proposal:
        """The window's tree truncated to the batch's deepest D'_b: node tokens (a level's candidates by rank) and the
        draft row of each node's children (its level's row); law "without_replacement"."""
        Dr = int(depth.max())
        plan = self._plan(run, Dr)
        win = run.state
        win.plan = plan
        B = win.cand.shape[0]
        if run.on_device is None:       # the host path: gathered on numpy views (copies, as on the device)
            tok = np.empty((B, len(plan.slot_np) + 1), np.int64)
            tok[:, :1] = run.last_tokens().numpy()
            q_np, _, c_np = win.host_views()[:3]
            tok[:, 1:] = c_np[:, plan.slot_np]
            tokens, q = torch.from_numpy(tok), torch.from_numpy(q_np[:, plan.q_rows_np])
        else:
            x = win.cand.view(B, -1).index_select(1, plan.slot)                                       # (B, N)
            tokens, q = torch.cat([run.last_tokens(), x], 1), win.q.index_select(1, plan.q_rows)  # (B, N+1, V)
        verify = None
        if self.release:                # the plan's verdict, built once per plan and bonus law
            bonus = not run.proc.greedy
            verify = plan.verdicts.get(bonus)
            if verify is None:
                verify = plan.verdicts[bonus] = partial(longest_path_verdict, tree=plan.tree, anc=plan.anc,
                                                        full_depth=self.max_depth, uniform_bonus=bonus)
        # (q: the window's rows, uniform or target rows checked in the round that computed them)
        return Proposal(tokens, q, "without_replacement", plan.tree, plan.depth, plan.mask, 0, verify=verify,
                        q_checked=True)

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
        S, K, V = self.max_depth, self.tree_width, p.shape[-1]
        B = run.B
        if B == 1:                      # one image: its accepted node and the next depth as Python ints
            t = int(verdict.accepted[0])
            a = np.array([int(np.asarray(verdict.path).reshape(-1)[t - 1]) if t > 0 else 0])
        else:
            tau = np.asarray(verdict.accepted, np.int64)
            path = np.asarray(verdict.path, np.int64).reshape(B, -1)
            a = np.where(tau > 0, path[np.arange(B), np.maximum(tau - 1, 0)], 0)       # (B,) the accepted node
        read = _next_depth(run, S)
        act = run.active
        if B == 1 and act[0]:           # one image: its index arrays depend on (a, read) alone, built once each
            key = (int(a[0]), read, self.release, V, run.on_device is None)
            hit = plan.moves.get(key)
            if hit is None:
                mv = self._moves(plan, a, act, read)
                for x in (*mv[:3], *mv[3], *mv[4:8], *mv[8], *mv[9], *mv[10]):   # shared by every later round
                    x.setflags(write=False)                                       # with this key: read-only
                hit = plan.moves[key] = (mv, rows_plan(self._asks(mv, V)) if run.on_device is None else None)
            mv, rp = hit
        else:
            mv, rp = self._moves(plan, a, act, read), None
        bs, ss, first_free, fresh, sib, pr, xr, tr, index, sib_rows, init_rows = mv
        asks = self._asks(mv, V) if rp is None else None          # (the host path reads the plan alone)
        u_keep, e_res, e_sib, e_init = run.rng.uniform_rows_many(run.n, asks, rp, neg_log=(1, 3))
        if len(bs):
            carry(self, run, prop, p, plan, bs, ss, pr, xr, tr, sib, u_keep, e_res, e_sib, index)
        _fresh(run, win, first_free, read, e_init, fresh)

    def _asks(self, mv: tuple, V: int) -> list:
        """Every uniform of the window's update (``Streams.uniform_rows_many``'s asks) for ``_moves``' arrays ``mv``:
        the carried levels' keep tests and residual draws (sjd-pac-p: the other candidates' at tree levels), the
        fresh levels' tokens where the next tree reads them; asks 1 and 2 (the draws) are taken as Exp(1) noise
        (``advance``'s ``neg_log=(1, 3)``)."""
        S = self.max_depth
        return [(_KEEP, (S,), mv[0], mv[1]), (_RES, (S, V), mv[0], mv[1]), (_SIB, (S, V), *mv[9]),
                (_INIT, (S, V), *mv[10])]

    def _moves(self, plan: _Plan, a: np.ndarray, act: np.ndarray, read: int) -> tuple:
        """``advance``'s index arrays (host ints) for accepted nodes ``a`` (B,), the active images ``act`` (B,) and
        the next round's deepest depth ``read``: the carried levels (bs, ss) (m,), each image's first fresh level
        (B,), the fresh levels (``_fresh_levels``), the sjd-pac-p levels with K - 1 others, and per carried level the
        node whose row drafts it, its continuation token's node (-1: none) and whether it was a tree level; ``carry``'s
        flat indices (``carry_index``); the rows of the sjd-pac-p siblings' and the drawn fresh levels' uniforms."""
        S, K, D = self.max_depth, self.tree_width, self.tree_depth
        par = plan.cpar[a]                                                              # (B, S) the carried levels'
        if not act.all():
            par = np.where(act[:, None], par, -1)
        carried = par >= 0
        bs, ss = np.nonzero(carried)                                                    # (m,) the carried levels
        first_free = carried.sum(1)
        sib = np.flatnonzero(ss < D - 1) if not self.release and K > 1 else _NONE
        pr, xr, tr = par[bs, ss], plan.cxn[a[bs], ss], plan.ctree[a[bs], ss]
        fresh = _fresh_levels(first_free, S, read)
        return (bs, ss, first_free, fresh, sib, pr, xr, tr,
                carry_index(self, plan.tree.n_nodes + 1, bs, ss, pr, xr, tr, sib), (bs[sib], ss[sib]),
                (fresh[0][fresh[2]], fresh[1][fresh[2]]))

    def params(self) -> dict:
        return {"draft": self.name, "window": self.window, "L": self.max_depth, "tree_width": self.tree_width,
                "tree_depth": self.tree_depth, "tree_nodes": self.window - 1}


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
