"""Predict any verifier's trade-off from rounds recorded under another one (section 8, T10-T11).

Drafts are drawn from Q whatever the verifier, and the target's verification pass computes
P(.|h_{i-1}) at every drafted position. So the rows recorded along the drafted path of one run give,
for every other rule r, per-round unbiased estimates (given the round's prefix) of

  accepted drafts  sum_{i<=L} prod_{j<=i} f^r_j(x~_j)                    (T10)
  bound term       sum_{i<=L} prod_{j<i}  f^r_j(x~_j) D^r_i(h_{i-1})      (T11)

Array-API code: numpy, torch or JAX rows. ``Rows`` / ``TreeRows`` hold recorded chain / static-tree rounds
(numpy float64, checked) and ``load_rows`` reads them from ``coolsd generate --record`` (used by ``theory.likelihood.tune``,
which re-exports them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import array_api_compat
import numpy as np

from ..core import checks
from ..core.xp import Array, gather, namespace, normalize
from ..rules.discrepancy import discrepancy
from ..tree import DRAFT_LAWS, RowTrees, Tree


class RoundPrediction(NamedTuple):
    accepted: Array  # (R,) T10 estimate of the accepted drafts per round
    bound: Array     # (R,) T11 estimate of the per-round TV-bound term
    f: Array         # (R, L) acceptance probabilities of the recorded drafts under the rule


def predict_rounds(p: Array, q: Array, drafts: Array, verifier, n_drafted: Array | None = None, *,
                   check: bool = True, memo: dict | None = None) -> RoundPrediction:
    """T10 and T11 per recorded round.

    p (R, L+1, V) processed target rows along the drafted path, q (R, L, V) draft rows the drafts were
    sampled from, drafts (R, L) tokens. Rounds that drafted fewer tokens (the end of an image) are
    padded to L and flagged by ``n_drafted`` (R,) ints; positions i > n_drafted contribute nothing.
    The discrepancy D_i uses the rule's effective resampling law (``resample(..., rejected=None)``).
    p and q rows must be probability rows (finite, >= 0, summing to 1 within their dtype's tolerance)
    and drafts tokens in [0, V): checked here (ValueError naming the argument); ``check=False`` skips the
    checks (rows validated once by the caller, e.g. ``theory.likelihood.tune`` under JAX tracing). Lists are converted to
    numpy arrays; the verifier must be a verifier object (TypeError otherwise). ``memo``: a dict the caller keeps for
    these same rows (p, q), in which an acceptance row is kept under the rule's ``memo_key`` (rules with equal keys
    give the same f: LANTERN's, ``coolsd.studies.demo.predict.predict_chains``), and, for a resampler with ``memo_ok``,
    the parts of its effective law that its rules share (LANTERN's released "q" law: r, d and d's neighbour sums).
    """
    checks.verifier(verifier)
    if check:
        p, q, drafts = (checks.array(n, a) if isinstance(a, (list, tuple)) or a is None or isinstance(a, str) else a
                        for n, a in (("predict_rounds: p", p), ("predict_rounds: q", q), ("predict_rounds: drafts", drafts)))
        if getattr(drafts, "ndim", 0) != 2 or getattr(p, "ndim", 0) != 3 or getattr(q, "ndim", 0) != 3:
            raise ValueError(f"predict_rounds: expected p (R, L+1, V), q (R, L, V), drafts (R, L); got p "
                             f"{tuple(getattr(p, 'shape', ()))}, q {tuple(getattr(q, 'shape', ()))}, drafts "
                             f"{tuple(getattr(drafts, 'shape', ()))}")
    xp = namespace(p, q)
    R, L = drafts.shape[0], drafts.shape[-1]
    if p.shape[:2] != (R, L + 1) or q.shape[:2] != (R, L) or p.shape[-1] != q.shape[-1]:
        raise ValueError(f"predict_rounds: expected p (R, L+1, V), q (R, L, V), drafts (R, L); got p {tuple(p.shape)}, "
                         f"q {tuple(q.shape)}, drafts {tuple(drafts.shape)}")
    if check:
        checks.check_rows_xp("predict_rounds: p", p, xp)
        checks.check_rows_xp("predict_rounds: q", q, xp)
        checks.check_tokens_xp("predict_rounds: drafts", drafts, p.shape[-1], xp)
    dev = array_api_compat.device(p)
    if n_drafted is not None:
        n_drafted = xp.asarray(n_drafted, device=dev)
        if tuple(n_drafted.shape) != (R,) or not xp.isdtype(n_drafted.dtype, "integral") \
                or (check and R and not bool(xp.all((n_drafted >= 0) & (n_drafted <= L)))):
            raise ValueError(f"predict_rounds: n_drafted must be ({R},) integers in [0, L={L}], got shape "
                             f"{tuple(n_drafted.shape)} and dtype {n_drafted.dtype}")
    pos = xp.arange(1, L + 1, device=dev)
    pp = p[:, :L, :]
    key = getattr(verifier.accept, "memo_key", None) if memo is not None else None
    f = memo.get(key) if key is not None else None
    if f is None:
        f = verifier.accept(pp, q, pos)                                 # (R, L, V)
        if key is not None:
            memo[key] = f
    G = verifier.resample(pp, q, f, memo=memo) if memo is not None and getattr(verifier.resample, "memo_ok", False) \
        else verifier.resample(pp, q, f)                                # effective law (R, L, V)
    D = discrepancy(pp, q, f, G)                                        # (R, L)  T3
    f_tok = gather(f, xp.astype(drafts, xp.int64), xp)                  # (R, L)
    if n_drafted is not None:
        live = xp.astype(pos[None, :] <= xp.asarray(n_drafted, device=dev)[:, None], p.dtype)
    else:
        live = xp.ones_like(f_tok)
    acc = xp.cumulative_prod(f_tok, axis=-1)                            # prod_{j<=i} f_j
    before = xp.concat([xp.ones_like(acc[:, :1]), acc[:, :-1]], axis=-1)  # prod_{j<i} f_j
    return RoundPrediction(xp.sum(live * acc, axis=-1), xp.sum(live * before * D, axis=-1), f_tok)


def renewal_tokens_per_round(accepted: Array, accepted_recorded: Array) -> float:
    """Tokens per round (tau + 1) of a rule, predicted from ONE recorded run of another rule, weighting
    the recorded rounds by the stretch of the image each covers (docs/theory.md section 8, renewal weighting).

    accepted (R,): T10 estimates of the predicted rule's accepted drafts per recorded round
    (``predict_rounds(...).accepted`` or ``predict_tree_rounds(...).accepted``); accepted_recorded (R,):
    the same for the rule that was run (T10 with its own verifier), so m = accepted_recorded + 1 and
    m' = accepted + 1 are the two rules' expected tokens per round from each recorded round's state.
    A recorded round covers m tokens on average, which the predicted rule needs m / m' rounds for, so

        tokens per round  =  sum_k m_k / sum_k (m_k / m'_k)                        (T10; section 8)

    rather than mean_k m'_k: the plain mean weights states by how often the RECORDED rule starts a round
    there, and overweights where the predicted rule is locally faster (it starts fewer rounds there). The
    two agree when m' / m is the same in every round; ``renewal == mean(m')`` when the rules coincide.
    Both arrays are float and >= 0 (tokens per round >= 1, so no division by zero); float64 result."""
    a = checks.array("renewal_tokens_per_round: accepted", accepted).astype(np.float64)
    b = checks.array("renewal_tokens_per_round: accepted_recorded", accepted_recorded).astype(np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(f"renewal_tokens_per_round: expected two (R,) arrays with R >= 1, got shapes "
                         f"{a.shape} and {b.shape}")
    if not (np.all(a >= 0) and np.all(b >= 0) and np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("renewal_tokens_per_round: accepted drafts per round must be finite and >= 0")
    m, m_new = b + 1.0, a + 1.0
    return float(m.sum() / (m / m_new).sum())


class TreePrediction(NamedTuple):
    accepted: Array  # (R,) T10 for trees: sum over drafted nodes of their acceptance probability
    bound: Array     # (R,) T11 for trees: sum over nodes of Pr(reach node) x node discrepancy bound
    reach: Array     # (R, N+1) probability that the walk accepts each node (root: 1) given the drafts


def predict_tree_rounds(p: Array, q: Array, tokens: Array, tree, verifier, *, check: bool = True,
                        draft_law: str = "without_replacement", max_depth: Array | None = None) -> TreePrediction:
    """T10 and T11 for static-tree rounds recorded under any rule (docs/theory.md section 9).

    p (R, N+1, V) target rows at every node (node 0 = root), q (R, N+1, V) the draft rows each node's
    children were drawn from (without replacement), tokens (R, N+1) node tokens, ``tree`` a
    ``theory.tree.Tree`` with N nodes. The candidates are drafted whatever the verifier, so for rule r,
    given the drafts, the walk of ``theory.tree.verify_tree`` accepts candidate c_j of a node (tried
    after c_1..c_{j-1} were rejected) with probability prod_{i<j} (1 - f_i(c_i)) f_j(c_j), f_i from the
    residual rows (p_i, q_i). Summing these reach probabilities over nodes gives an unbiased estimate of
    the rule's accepted drafts per round (T10 for trees).

    Bound: at a node, the law of the token it emits is, by the triangle inequality over the candidates,
    within D_1 + E[(1 - f_1(c_1)) (D_2 + E[(1 - f_2(c_2)) (D_3 + ...)])] of p (TV), where D_j is the
    one-step discrepancy (T3, effective resampling law) of the rows (p_j, q_j) and the final residual
    draw adds nothing; the recorded candidates estimate the inner expectations without bias. With
    Pr(reach node) this gives sum_n reach_n sum_j prod_{i<j} (1 - f_i(c_i)) D_j(n), an unbiased estimate
    of a bound on the round's TV to the target (T11 for trees; 0 for vanilla; equal to T11 for a chain).
    Candidates with q_j(c) = 0 are skipped, as the verifier does. Loops over the N nodes (not over rounds).

    Dynamic trees (section 10): ``tree`` a ``theory.tree.RowTrees`` (children (R, N+1, K)), each recorded round its
    own tree; ``draft_law`` as ``verify_tree``'s ("point": the release's deterministic candidates, q unused);
    ``max_depth`` (R,) ints: the walk of a round stops at that depth (the end of an image). The reach and the
    bound are then accumulated per round over (node, rank) slots (a loop over N+1 nodes and K ranks).
    """
    checks.verifier(verifier)
    if isinstance(tree, RowTrees) or draft_law != "without_replacement" or max_depth is not None:
        return _predict_row_trees(p, q, tokens, tree, verifier, check, draft_law, max_depth)
    xp = namespace(p, q)
    R = tokens.shape[0]
    N = tree.n_nodes
    if p.shape[:2] != (R, N + 1) or q.shape[:2] != (R, N + 1) or p.shape[-1] != q.shape[-1] \
            or tuple(tokens.shape) != (R, N + 1):
        raise ValueError(f"predict_tree_rounds: expected p, q (R, N+1={N + 1}, V) and tokens (R, N+1); got p "
                         f"{tuple(p.shape)}, q {tuple(q.shape)}, tokens {tuple(tokens.shape)}")
    if check:   # as predict_rounds' ``check``
        checks.check_rows_xp("predict_tree_rounds: p", p, xp)       # q rows of leaves are never read: not checked
        checks.check_tokens_xp("predict_tree_rounds: tokens", tokens[:, 1:], p.shape[-1], xp)  # entry 0: the root
    dev = array_api_compat.device(p)
    V = p.shape[-1]
    tokens = xp.astype(tokens, xp.int64)
    ar_V = xp.arange(V, device=dev)
    one = xp.ones((R,), dtype=p.dtype, device=dev)
    reach = [one] + [None] * N
    accepted = xp.zeros((R,), dtype=p.dtype, device=dev)
    bound = xp.zeros((R,), dtype=p.dtype, device=dev)
    for n in range(N + 1):  # nodes in (depth, path) order: parents come before their children
        kids = [int(k) for k in tree.children[n] if k >= 0]
        if not kids:
            continue
        d = int(tree.node_depth[n])
        p_j, q_left = p[:, n, :], q[:, n, :]
        survive = one
        for kid in kids:    # candidates in rank order
            q_j = normalize(q_left, q_left, xp)
            c = tokens[:, kid]
            f_row = verifier.accept(p_j, q_j, d + 1)
            valid = gather(q_j, c, xp) > 0
            f_c = xp.where(valid, gather(f_row, c, xp), xp.zeros_like(one))
            D = discrepancy(p_j, q_j, f_row, verifier.resample(p_j, q_j, f_row))   # (R,)  T3
            bound = bound + reach[n] * survive * xp.where(valid, D, xp.zeros_like(D))
            reach[kid] = reach[n] * survive * f_c
            accepted = accepted + reach[kid]
            survive = survive * (1 - f_c)
            p_j = xp.where(valid[:, None], verifier.resample(p_j, q_j, f_row, c), p_j)
            q_left = xp.where(valid[:, None] & (ar_V == c[:, None]), xp.zeros_like(q_left), q_left)
    return TreePrediction(accepted, bound, xp.stack(reach, axis=1))


def _predict_row_trees(p, q, tokens, tree, verifier, check, draft_law, max_depth) -> TreePrediction:
    """``predict_tree_rounds`` for per-round trees (``RowTrees``; a static ``Tree`` is broadcast to every round)."""
    if draft_law not in DRAFT_LAWS:
        raise ValueError(f"draft_law must be one of {DRAFT_LAWS}, got {draft_law!r}")
    xp = namespace(p, q)
    dev = array_api_compat.device(p)
    R, V = tokens.shape[0], p.shape[-1]
    N = tree.n_nodes
    if p.shape[:2] != (R, N + 1) or q.shape[:2] != (R, N + 1) or p.shape[-1] != q.shape[-1] \
            or tuple(tokens.shape) != (R, N + 1):
        raise ValueError(f"predict_tree_rounds: expected p, q (R, N+1={N + 1}, V) and tokens (R, N+1); got p "
                         f"{tuple(p.shape)}, q {tuple(q.shape)}, tokens {tuple(tokens.shape)}")
    children = xp.asarray(tree.children, device=dev)
    depth = xp.asarray(tree.node_depth, device=dev)
    if children.ndim == 2:          # a static tree: the same children in every round
        children = xp.broadcast_to(children[None], (R, *children.shape))
        depth = xp.broadcast_to(depth[None], (R, N + 1))
    if tuple(children.shape[:2]) != (R, N + 1):
        raise ValueError(f"predict_tree_rounds: the trees' children must be (R={R}, N+1={N + 1}, K), got "
                         f"{tuple(children.shape)}")
    cap = xp.full((R,), tree.depth, dtype=xp.int64, device=dev) if max_depth is None else \
        xp.astype(xp.asarray(max_depth, device=dev), xp.int64)
    if check:
        checks.check_rows_xp("predict_tree_rounds: p", p, xp)
        checks.check_tokens_xp("predict_tree_rounds: tokens", tokens[:, 1:], V, xp)
        if tuple(cap.shape) != (R,):
            raise ValueError(f"predict_tree_rounds: max_depth must be ({R},), got {tuple(cap.shape)}")
    tokens = xp.astype(tokens, xp.int64)
    ar_V, ar_N = xp.arange(V, device=dev), xp.arange(N + 1, device=dev)
    zero = xp.zeros((R,), dtype=p.dtype, device=dev)
    reach = xp.astype(ar_N[None, :] == 0, p.dtype) * xp.ones((R, 1), dtype=p.dtype, device=dev)   # (R, N+1)
    accepted, bound = zero, zero
    K = children.shape[-1]
    for n in range(N + 1):  # nodes in index order: parents come before their children
        kids = children[:, n, :]                                                  # (R, K)
        live_n = (kids >= 0) & (depth[:, n] < cap)[:, None]
        if not bool(xp.any(live_n)):
            continue
        r_n = reach[:, n]
        p_j, q_left = p[:, n, :], q[:, n, :]
        survive = xp.ones((R,), dtype=p.dtype, device=dev)
        for j in range(K):  # candidates in rank order
            live = live_n[:, j]
            if not bool(xp.any(live)):
                break
            kid = xp.where(live, kids[:, j], xp.zeros_like(kids[:, j]))
            c = gather(tokens, kid, xp)
            q_j = xp.astype(ar_V == c[:, None], p.dtype) if draft_law == "point" else normalize(q_left, q_left, xp)
            f_row = verifier.accept(p_j, q_j, depth[:, n] + 1)
            valid = live & (gather(q_j, c, xp) > 0)
            f_c = xp.where(valid, gather(f_row, c, xp), zero)
            D = discrepancy(p_j, q_j, f_row, verifier.resample(p_j, q_j, f_row))   # (R,)  T3
            bound = bound + r_n * survive * xp.where(valid, D, zero)
            r_kid = r_n * survive * f_c
            reach = xp.where(live[:, None] & (ar_N[None, :] == kid[:, None]), r_kid[:, None], reach)
            accepted = accepted + xp.where(live, r_kid, zero)
            survive = survive * (1 - f_c)
            p_j = xp.where(valid[:, None], verifier.resample(p_j, q_j, f_row, c), p_j)
            q_left = xp.where(valid[:, None] & (ar_V == c[:, None]), xp.zeros_like(q_left), q_left)
    return TreePrediction(accepted, bound, reach)


# --------------------------------------------------------------------------- recorded rows (numpy, float64)

@dataclass
class Rows:
    """Recorded chain rounds: p (R, L+1, V), q (R, L, V), drafts (R, L) ints, n_drafted (R,) ints (positions
    i > n_drafted are padding), image (R,) ints (the image each round belongs to; -1 when unknown)."""
    p: np.ndarray
    q: np.ndarray
    drafts: np.ndarray
    n_drafted: np.ndarray
    image: np.ndarray

    def __post_init__(self):
        self.p = np.asarray(self.p, dtype=np.float64)
        self.q = np.asarray(self.q, dtype=np.float64)
        self.drafts = np.asarray(self.drafts, dtype=np.int64)
        if self.p.ndim != 3 or self.q.ndim != 3 or self.drafts.ndim != 2:
            raise ValueError(f"rows: expected p (R, L+1, V), q (R, L, V), drafts (R, L); got p {self.p.shape}, "
                             f"q {self.q.shape}, drafts {self.drafts.shape}")
        R, L = self.drafts.shape
        if self.p.shape[:2] != (R, L + 1) or self.q.shape[:2] != (R, L) or self.p.shape[2] != self.q.shape[2]:
            raise ValueError(f"rows: expected p (R, L+1, V), q (R, L, V), drafts (R, L); got p {self.p.shape}, "
                             f"q {self.q.shape}, drafts {self.drafts.shape}")
        if R < 2:
            raise ValueError(f"rows: need at least 2 recorded rounds, got {R}")
        self.n_drafted = np.full(R, L, np.int64) if self.n_drafted is None else np.asarray(self.n_drafted, np.int64)
        self.image = np.full(R, -1, np.int64) if self.image is None else np.asarray(self.image, np.int64)
        if self.n_drafted.shape != (R,) or self.image.shape != (R,):
            raise ValueError(f"rows: n_drafted and image must be (R,) = ({R},); got {self.n_drafted.shape}, "
                             f"{self.image.shape}")
        if np.any(self.n_drafted < 1) or np.any(self.n_drafted > L):
            raise ValueError(f"rows: n_drafted must be in [1, L={L}]")
        if np.any(self.drafts < 0) or np.any(self.drafts >= self.p.shape[2]):
            raise ValueError("rows: draft tokens must be in [0, V)")

    @property
    def R(self) -> int:
        return self.drafts.shape[0]

    @property
    def L(self) -> int:
        return self.drafts.shape[1]

    def subset(self, idx) -> "Rows":
        idx = np.asarray(idx)
        return Rows(self.p[idx], self.q[idx], self.drafts[idx], self.n_drafted[idx], self.image[idx])


@dataclass
class TreeRows:
    """Recorded static-tree rounds (``theory.likelihood.recorded.predict_tree_rounds``): p (R, N+1, V) target rows at every
    node, q (R, N+1, V) the draft rows each node's children were drawn from, tokens (R, N+1) node tokens, the
    ``tree`` (N nodes; only rounds that drafted the whole tree), image (R,) ints (-1 when unknown)."""
    p: np.ndarray
    q: np.ndarray
    tokens: np.ndarray
    tree: Tree
    image: np.ndarray | None = None

    def __post_init__(self):
        self.p = np.asarray(self.p, dtype=np.float64)
        self.q = np.asarray(self.q, dtype=np.float64)
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        if not isinstance(self.tree, Tree):
            raise ValueError(f"tree rows: tree must be a theory.tree.Tree, got {type(self.tree).__name__}")
        R, N1 = self.tokens.shape if self.tokens.ndim == 2 else (None, None)
        if R is None or N1 != self.tree.n_nodes + 1 or self.p.shape[:2] != (R, N1) or self.q.shape != self.p.shape:
            raise ValueError(f"tree rows: expected p, q (R, N+1={self.tree.n_nodes + 1}, V) and tokens (R, N+1); got p "
                             f"{self.p.shape}, q {self.q.shape}, tokens {self.tokens.shape}")
        if R < 2:
            raise ValueError(f"tree rows: need at least 2 recorded rounds, got {R}")
        self.image = np.full(R, -1, np.int64) if self.image is None else np.asarray(self.image, np.int64)
        if self.image.shape != (R,):
            raise ValueError(f"tree rows: image must be (R,) = ({R},), got {self.image.shape}")
        if np.any(self.tokens < 0) or np.any(self.tokens >= self.p.shape[2]):
            raise ValueError("tree rows: node tokens must be in [0, V)")

    @property
    def R(self) -> int:
        return self.tokens.shape[0]

    @property
    def L(self) -> int:
        """The tree's depth: the number of per-depth weights w_1..w_D."""
        return int(self.tree.depth)

    def subset(self, idx) -> "TreeRows":
        idx = np.asarray(idx)
        return TreeRows(self.p[idx], self.q[idx], self.tokens[idx], self.tree, self.image[idx])


@dataclass
class DynamicRows:
    """Recorded dynamic-tree rounds (section 10), each its own tree: p (R, N+1, V), q (R, N+1, V) or None (the release's
    point-mass candidates: ``draft_law`` "point"), tokens and parent (R, N+1) ints (parent -1 at the root), max_depth
    (R,) the walk's depth bound, topk (most children per node), image (R,). ``trees`` gives the ``RowTrees`` and
    ``predict(verifier)`` T10/T11 of ``predict_tree_rounds`` on them."""
    p: np.ndarray
    q: np.ndarray | None
    tokens: np.ndarray
    parent: np.ndarray
    max_depth: np.ndarray
    topk: int
    image: np.ndarray

    def __post_init__(self):
        self.p = np.asarray(self.p, dtype=np.float64)
        self.q = None if self.q is None else np.asarray(self.q, dtype=np.float64)
        R, N1 = self.p.shape[:2]
        for name in ("tokens", "parent"):
            if np.shape(getattr(self, name)) != (R, N1):
                raise ValueError(f"dynamic rows: {name} must be (R, N+1) = ({R}, {N1}), got {np.shape(getattr(self, name))}")
        if self.q is not None and self.q.shape != self.p.shape:
            raise ValueError(f"dynamic rows: q must be p's shape {self.p.shape}, got {self.q.shape}")

    @property
    def draft_law(self) -> str:
        return "point" if self.q is None else "without_replacement"

    @property
    def trees(self) -> RowTrees:
        from ..tree import row_trees

        return row_trees(np.asarray(self.parent, np.int64), int(self.topk), depth=int(np.max(self.max_depth)))

    def predict(self, verifier, chunk: int = 64) -> TreePrediction:
        """``predict_tree_rounds`` over the rounds in chunks of ``chunk`` (memory: chunk x (N+1) x V)."""
        t = self.trees
        q = self.p if self.q is None else self.q          # the point law never reads q
        parts = [predict_tree_rounds(self.p[a:a + chunk], q[a:a + chunk], self.tokens[a:a + chunk],
                                     RowTrees(t.children[a:a + chunk], t.node_depth[a:a + chunk], t.depth), verifier,
                                     draft_law=self.draft_law, max_depth=self.max_depth[a:a + chunk])
                 for a in range(0, len(self.tokens), chunk)]    # a loop over chunks of rounds
        return TreePrediction(*[np.concatenate([np.asarray(getattr(x, k)) for x in parts]) for k in parts[0]._fields])


def load_rows(path, name: str = "record"):
    """Rows from an ``.npz`` written by ``coolsd generate --record`` (chains: keys p, q, drafts, n_drafted,
    image; static trees (``--tree``): p, q, tokens, tree_paths (JSON), image; dynamic trees: p, q (empty in release mode),
    tokens, parent, max_depth, image, dynamic (JSON)) -> Rows, TreeRows or DynamicRows.
    The whole file is read and checked now: a missing, empty, non-.npz, damaged or malformed file is one
    ValueError line naming ``name`` and the file (``checks.npz_arrays``)."""
    import json
    import os

    hint = "write it again with coolsd generate --record FILE (a speculative --method, not ar)"
    z = checks.npz_arrays(name, path, ("p", "q"), hint)
    try:
        if "dynamic" in z:   # q empty: the release's point-mass candidates (real.decode.modes.dynamic)
            return DynamicRows(z["p"], z["q"] if z["q"].size else None, z["tokens"], z["parent"], z["max_depth"],
                               int(json.loads(str(z["dynamic"]))["tree_topk"]), z["image"])
        if "tree_paths" in z:
            paths = json.loads(str(z["tree_paths"]))
            return TreeRows(z["p"], z["q"], z["tokens"], Tree(tuple(tuple(p) for p in paths)), z.get("image"))
        if "drafts" not in z:
            raise ValueError("missing arrays ['drafts']")
        return Rows(z["p"], z["q"], z["drafts"], z.get("n_drafted"), z.get("image"))
    except (ValueError, TypeError, KeyError) as e:
        msg = str(e).removeprefix("rows: ")
        raise ValueError(f"{name}: {os.fspath(path)!r} does not hold recorded rows ({msg}); {hint}") from None
