"""Teacher-forced rows of tree drafting and exact likelihoods of tree-drafted images (docs/theory.md sections 9, 9b,
11b; T13 is ``theory.likelihood.tree_log_likelihood``).

For images x (B, T) and a tree drafting mode, ``tree_rows`` gives what the engine's rounds would have read had they
walked each image's own path, for every possible round start n (the round that starts with n tokens committed; the
root is x_{n-1}; every tree mode starts with the target's prefill alone, so n >= 1: ``convention="eagle"``):

* ``p`` (B, T, V): the target's rows P(. | x_<t) (``real.decode.score.teacher_forced_rows``);
* static trees (``StaticTree``): ``q`` the drafter's row at the path node of depth d of round n, the row that
  predicts token n + d: an independent / layer-skip draft's row ignores the round, q (B, T, V) = Q(. | x_<t); an
  EAGLE-1 drafter's row depends on its own features since the round began, and the path node at depth d of round n
  is the d-th draft of a chain round starting at n, so q (B, T, D, V) with q[:, n, d] = the chain rows' q[:, n + d, d]
  (``real.decode.forced_rows._eagle_rows``: same positions root + d, same features, same ancestors). The candidates
  (top-m, or a draw without replacement) are the likelihood's business (``StaticTree.candidates``);
* release-mode dynamic trees (``DynamicTree(sampling="release")``): the tree itself, REGROWN at every round start n
  with the engine's construction (``real.decode.dynamic_tree.grow_tree``: the root's top-k children by processed
  draft probability, ``depth`` expansions of the k best frontier nodes by cumulative log-probability, float64 keys,
  ties to the lower index by ``top_m`` and ``select_nodes``, the image's own depth cap D'(n) = min(depth + 1,
  T - n - 1) ranking deeper nodes last): ``trees`` (``theory.tree.RowTrees``, children (B, T, N+1, k)),
  ``node_tokens`` and ``parent`` (B, T, N+1). Every expansion level is ONE drafter forward over the frontiers of a
  chunk of round starts of every image (the k frontier nodes of each start attend to the committed entries before
  their start and to their own ancestors: per-row masks), so growing ~T trees per image costs ``depth`` forwards per
  chunk; the drafter's cache is rolled back after each chunk. Nodes below an image's depth cap may be selected (the
  pool's deeper levels rank last): the walk never reaches them, as in the engine at batch size > 1.

* lossless dynamic trees (stochastic-beam keys, the default ``DynamicTree``): ``LOSSLESS_TREES`` independent trees
  per round start, regrown the same way with Gumbel noise from the scorer's own generator (``seed``): children (B, T,
  M, N+1, k), ``node_tokens`` and ``parent`` (B, T, M, N+1), and ``q`` (B, T, D, V) by round start as for static trees
  (the rows the path nodes' children are drawn from). The tree's shape depends on the keys of off-path nodes, so
  log P^ is estimated (T15, ``theory.likelihood.tree_mc.dynamic_log_likelihood_mc``: each round's emissions exact
  given its tree, averaged over the trees; unbiased P^_hat, its log jackknife-corrected, with a Monte Carlo SE).

Greedy processing has no likelihood: ``check`` raises NotImplementedError (``--fidelity`` and the sweep refuse it).
Sampled static candidates are exact within ``theory.likelihood.tree``'s cost guard and estimated above it
(``theory.likelihood.tree_mc``, T14: an unbiased P^_hat per image, its log jackknife-corrected, with a Monte Carlo
SE), lossless dynamic trees always (T15, validated against the known log P of vanilla images: docs/theory/likelihood.md
11d): ``method`` says which, and ``score_trees`` reports it ("kl_method": "exact" | "mc").

``score_trees`` turns the rows into per-image log P^(x) and log P(x), batch by batch (``tree_scores``: the same from the
models ``real.decode.forced_rows.scoring_inputs`` read once, as ``real.decode.score.score`` calls it). This module
imports no model and calls none itself: the rows come from ``forced_rows.chain_rows`` and ``regrow.dynamic_trees``,
which feed the models through ``forced_rows.Forced.rows``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from theory.tree import RowTrees, Tree

from real.nn.layers import inference_weights
from .forced_rows import Forced, chain_rows, scoring_inputs
from .sampling import Processing
from .regrow import LOSSLESS_TREES, dynamic_trees

__all__ = ["TreeRows", "scored", "tree_mode", "check", "method", "tree_rows", "tree_likelihood", "score_trees", "tree_scores",
           "LOSSLESS_TREES", "LOSSLESS_GROUPS", "MASK_BUDGET"]

LOSSLESS_GROUPS = 4      # ... in groups, for the jackknife of log P^ and its Monte Carlo SE
GREEDY_REASON = ("exact likelihood of greedy tree drafting is not available: greedy trees draft each node's top-m "
                 "tokens by guided logits, which the one-hot rows of temperature 0 cannot rank (and greedy output is "
                 "deterministic: there is no law to measure)")
MASK_BUDGET = 1 << 21   # attention-mask elements per dynamic-tree growth forward (chunks of round starts; at
#                         B = 50 with CFG, 2^19..2^21 ran 2.25 s, 2^23 2.7 s, 2^25 3.8 s: the masked keys cost)


@dataclass
class TreeRows:
    """Teacher-forced rows of B images for a tree mode (module docstring): ``p`` (B, T, V); static trees: ``q``
    (B, T, V) or (B, T, D, V) indexed by round start; dynamic trees: ``trees`` (RowTrees over (B, T)),
    ``node_tokens`` and ``parent`` (B, T, N+1) int64; ``mode`` the drafting mode they were made for; lossless dynamic
    trees: M trees per round start ((B, T, M, ...)) and their importance ``weights`` (B, T, M) float64 (T15)."""
    p: torch.Tensor
    q: torch.Tensor | None
    mode: object
    trees: RowTrees | None = None
    node_tokens: torch.Tensor | None = None
    parent: torch.Tensor | None = None
    convention: str = "eagle"
    weights: torch.Tensor | None = None


def tree_mode(drafting):
    """``drafting`` when it is a tree mode (a ``StaticTree`` / ``DynamicTree``: ``scored_as`` says), else None (a bare
    ``theory.tree.Tree`` included: ``real.decode.score.score`` reads it as ``StaticTree(tree)``, as ``engine.generate``
    does)."""
    return drafting if _static(drafting) or _grown(drafting) else None


def scored(drafting, draft) -> tuple:
    """How scoring reads ``drafting`` (as ``real.decode.engine.generate`` does; ``real.decode.score.score`` reads a
    ``theory.tree.Tree`` as ``StaticTree(tree)`` first): (L, None) for chains of L drafts (an int L, or a mode scored
    as a chain: a ``Chain``), (None, mode) for a tree mode (``tree_mode``), (None, None) for None. ValueError for
    anything else, and for a tree mode without the ``draft`` model it was drafted with."""
    if getattr(drafting, "scored_as", None) == "chain":
        return int(drafting.max_depth), None
    if isinstance(drafting, (int, np.integer)) and not isinstance(drafting, bool):
        return int(drafting), None
    if drafting is None:
        return None, None
    return None, _drafted_tree(drafting, draft, "an int L, a Chain or a tree mode (StaticTree, DynamicTree, "
                                                "theory.tree.Tree)", "tree scoring needs")


def _drafted_tree(drafting, draft, what: str, who: str):
    """``tree_mode(drafting)``; ValueError naming ``what`` drafting must be when it is no tree mode, and ``who`` needs
    the draft model when ``draft`` is None."""
    mode = tree_mode(drafting)
    if mode is None:
        raise ValueError(f"drafting must be {what}, got {type(drafting).__name__}")
    if draft is None:
        raise ValueError(f"{who} the draft model the trees were drafted with")
    return mode


def _static(mode) -> bool:
    """A mode whose rounds draft one static tree (``mode.tree``, ``mode.candidates``)."""
    return getattr(mode, "scored_as", None) == "static-tree"


def _grown(mode) -> bool:
    """A mode whose rounds grow their tree (``total``, ``depth``, ``topk``, ``sampling``, ``params()``)."""
    return getattr(mode, "scored_as", None) == "grown-tree"


def check(mode, verifier, V: int, processing: Processing) -> None:
    """Refuse, before any model call, what has no likelihood: NotImplementedError for greedy processing; ValueError
    for a verifier without a chain rule or a mode that is not a tree. (Sampled static candidates above the exact
    path's cost guard, and lossless dynamic trees, are estimated: ``method``.)"""
    from theory.likelihood import check_chain_rule

    if tree_mode(mode) is None or isinstance(mode, Tree):
        raise ValueError(f"tree scoring needs a StaticTree or DynamicTree mode, got {type(mode).__name__}")
    check_chain_rule(verifier, "score")
    if not isinstance(processing, Processing):
        raise ValueError(f"processing must be a real.decode.sampling.Processing, got {type(processing).__name__}")
    if processing.greedy:
        raise NotImplementedError(GREEDY_REASON)
    if _grown(mode):
        if mode.topk > V:
            raise ValueError(f"tree topk = {mode.topk} exceeds the vocabulary size V = {V}")


def method(mode, verifier, V: int) -> str:
    """The likelihood's method: "exact" (T13), or "mc" (``theory.likelihood.tree_mc``): T14 for sampled static
    candidates above ``theory.likelihood.tree``'s cost guard at vocabulary V, T15 for lossless dynamic trees."""
    from theory.likelihood.tree import check_sampled_cost

    if _grown(mode) and mode.sampling != "release":
        return "mc"
    if _static(mode) and mode.candidates == "sampled":
        try:
            check_sampled_cost(mode.tree, V, verifier)
        except NotImplementedError:
            return "mc"
    return "exact"


# ----------------------------------------------------------------------------- rows

@torch.no_grad()
def tree_rows(target, draft, conds, tokens, drafting, *, processing: Processing = Processing(),
              mask_budget: int = MASK_BUDGET, seed: int = 0, trees: int = LOSSLESS_TREES) -> TreeRows:
    """The rows of B images ``tokens`` (B, T) with conditions ``conds`` for the tree mode ``drafting`` (module
    docstring); all B images in one batch (``score_trees`` splits larger sets); ``mask_budget`` bounds the attention
    mask of a dynamic tree's growth forward (elements; chunks of round starts); ``seed``: the Gumbel noise of the
    lossless trees sampled at every round start; ``trees``: how many (a multiple of ``LOSSLESS_GROUPS``, the
    jackknife's groups)."""
    mode = _drafted_tree(drafting, draft, "a tree mode (StaticTree, DynamicTree; a theory.tree.Tree as "
                                          "StaticTree(tree))", "tree rows need")
    if not isinstance(processing, Processing):
        raise ValueError(f"processing must be a real.decode.sampling.Processing, got {type(processing).__name__}")
    if processing.greedy:
        raise NotImplementedError(GREEDY_REASON)
    m, conds, tok = scoring_inputs(target, draft, conds, tokens, processing)
    B = tok.shape[0]
    for model in (target, draft):
        if B > 1 and _static(mode) and not model.batched:
            raise ValueError(f"{type(model).__name__} scores one image at a time (its cache has no per-row lengths): "
                             f"got {B} images")
        if B > 1 and not _static(mode) and not (model.batched and model.row_masks):
            raise ValueError(f"{type(model).__name__} cannot take per-row tree masks: dynamic-tree rows one image at a "
                             f"time (got {B})")
    from theory.core import checks

    seed = checks.integer("tree_rows: seed", seed, lo=0)
    trees = checks.integer("tree_rows: trees", trees, lo=LOSSLESS_GROUPS)
    if trees % LOSSLESS_GROUPS:
        raise ValueError(f"tree_rows: trees must be a multiple of {LOSSLESS_GROUPS} (the jackknife's groups), got "
                         f"{trees}")
    return _tree_rows(m, conds, tok, mode, int(mask_budget), seed, trees)


@torch.no_grad()
def _tree_rows(m: Forced, conds: list, tok: torch.Tensor, mode, budget: int, seed: int = 0,
               trees: int = LOSSLESS_TREES) -> TreeRows:
    """``tree_rows`` of inputs its callers checked (``forced_rows.scoring_inputs``; a tree mode with rows): ``m`` the
    models, ``conds`` a list of B conditions, ``tok`` (B, T) int64."""
    drawn = _static(mode) or mode.sampling != "release"       # candidates drawn from q: its rows are read
    q = None
    if drawn:
        rows = chain_rows(m, conds, tok, int(mode.tree.depth if _static(mode) else mode.max_depth), by_start=True)
        q = rows.q
    if _static(mode):
        return TreeRows(rows.p, q, mode)
    gen = torch.Generator(device=m.dev)
    gen.manual_seed(seed)
    with inference_weights(), torch.inference_mode():
        p, grown = dynamic_trees(m, conds, tok.to(m.dev), mode, budget, gen, trees)
    with torch.inference_mode(False):
        out = [x.clone() for x in (p, *grown)]
    p, children, depth, node_tokens, parent, weight = out
    return TreeRows(p, q, mode, RowTrees(children, depth, mode.max_depth), node_tokens, parent,
                    weights=None if mode.sampling == "release" else weight)


# ----------------------------------------------------------------------------- likelihood

def tree_likelihood(rows: TreeRows, tokens, verifier, mode, *, seed: int = 0, detail: bool = False):
    """(B,) float64 log P^(x) of the images ``tokens`` (B, T) under ``mode`` and ``verifier`` from their rows
    (``theory.likelihood.tree_log_likelihood``, on the host; sampled static candidates above its cost guard:
    ``theory.likelihood.tree_mc``'s jackknife estimate, draws seeded by ``seed``). ``detail``: a dict instead,
    {"log_p_hat" (B,), "kl_method" "exact" | "mc", "se" (B,) the Monte Carlo SE of each log P^ (zeros when exact),
    "samples", "groups" (None when exact)}. ValueError, before the recursion, when the rows were made for another mode:
    node count, depth or dynamic configuration."""
    from theory.likelihood import tree_log_likelihood
    from theory.likelihood.tree_mc import MC_GROUPS, tree_log_likelihood_mc

    def out(lph, how="exact", se=None, mc=None):
        if not detail:
            return lph
        return {"log_p_hat": lph, "kl_method": how, "se": np.zeros_like(lph) if se is None else se,
                "samples": None if mc is None else mc["samples"], "groups": None if mc is None else mc["groups"]}

    mode = tree_mode(mode)
    if not isinstance(rows, TreeRows):
        raise ValueError(f"rows must be a TreeRows (real.decode.score_tree.tree_rows), got {type(rows).__name__}")
    x = np.asarray(torch.as_tensor(tokens).cpu())
    p = rows.p.cpu().numpy()
    how = method(mode, verifier, p.shape[-1])
    if _grown(mode):
        if rows.trees is None:
            raise ValueError("these rows hold no regrown trees (static-tree rows): score them with their StaticTree")
        N1 = int(rows.trees.children.shape[-2])
        if N1 != mode.total:
            raise ValueError(f"the rows' trees have {N1} nodes (root included) but the dynamic tree scores "
                             f"total = {mode.total}: rows made for another tree")
        if not _grown(rows.mode) or rows.mode.params() != mode.params():
            got = rows.mode.params() if _grown(rows.mode) else type(rows.mode).__name__
            raise ValueError(f"the rows were regrown with dynamic configuration {got}, not {mode.params()}")
        tree, rt = None, RowTrees(rows.trees.children.cpu().numpy(), rows.trees.node_depth.cpu().numpy(),
                                  rows.trees.depth)
        q = rows.q.cpu().numpy() if how == "mc" else None      # the lossless trees' draws read q; the release's not
        nt, cands, conv = rows.node_tokens.cpu().numpy(), "topk", rows.convention if how == "mc" else "eagle"
    else:
        if rows.q is None:
            raise ValueError("these rows hold no draft rows q (dynamic-tree rows): score them with their DynamicTree")
        D = int(mode.tree.depth)
        if rows.q.ndim == 4 and rows.q.shape[2] != D:
            raise ValueError(f"the rows have draft rows for {rows.q.shape[2]} depths but the tree has depth {D}: rows "
                             "made for another tree")
        if _static(rows.mode) and rows.mode.tree.n_nodes != mode.tree.n_nodes:
            raise ValueError(f"the rows were made for a tree of {rows.mode.tree.n_nodes} nodes, not "
                             f"{mode.tree.n_nodes}")
        tree, rt, q, nt, cands, conv = mode.tree, None, rows.q.cpu().numpy(), None, mode.candidates, rows.convention
    if how == "mc":      # T15 (lossless dynamic trees) or T14 (sampled static candidates above the cost guard)
        mc = tree_log_likelihood_mc(p, q, x, verifier, tree, seed=seed, convention=conv, row_trees=rt,
                                    node_tokens=nt, groups=MC_GROUPS if rt is None else LOSSLESS_GROUPS,
                                    weights=None if rt is None else rows.weights.cpu().numpy())
        return out(mc["log_p_hat"], "mc", mc["se"], mc)
    return out(tree_log_likelihood(p, q, x, verifier, tree, candidates=cands, convention=conv, row_trees=rt,
                                   node_tokens=nt))


def score_trees(target, draft, conds, tokens, *, verifier, drafting, processing: Processing = Processing(),
                batch_size: int = 64) -> dict:
    """Exact per-image log-likelihoods of already-generated ``tokens`` (n, T) under the target and under tree
    speculative decoding (``drafting``: a ``StaticTree`` or a ``DynamicTree``) with
    ``draft`` and ``verifier``: {"log_p": (n,), "log_p_hat": (n,)} float64, "kl_method" ("exact", or "mc": sampled
    static candidates above the exact path's cost guard and lossless dynamic trees, ``method``) and, with "mc", "log_p_hat_se" (n,) the Monte
    Carlo SE of each log P^ and "mc" {"samples", "groups"} (batch a's draws seeded by a). What has no likelihood is
    refused before any model call (``check``)."""
    mode = tree_mode(drafting)
    if mode is None:
        raise ValueError(f"drafting must be a tree mode, got {type(drafting).__name__}")
    if draft is None:
        raise ValueError("tree scoring needs the draft model the trees were drafted with")
    m, conds, tok = scoring_inputs(target, draft, conds, tokens, processing)
    return tree_scores(m, conds, tok, verifier, mode, batch_size)


def tree_scores(m: Forced, conds: list, tok: torch.Tensor, verifier, mode, batch_size: int) -> dict:
    """``score_trees`` of the inputs ``forced_rows.scoring_inputs`` gave (``m`` the models, ``conds`` a list of n
    conditions, ``tok`` (n, T) int64) and a tree mode with a draft model; what has no likelihood is refused here, before
    any model call (``check``), then a bad ``batch_size``."""
    from theory.likelihood import log_target

    check(mode, verifier, int(m.target.vocab_size), m.proc)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not (m.batched and (m.row_masks or _static(mode))):
        batch_size = 1
    lp, lph, se = [], [], []
    for a in range(0, len(conds), batch_size):   # a loop over batches of images
        x = tok[a:a + batch_size]
        rows = _tree_rows(m, conds[a:a + batch_size], x, mode, MASK_BUDGET, seed=a)
        lp.append(log_target(rows.p.cpu().numpy(), x.numpy()))
        d = tree_likelihood(rows, x, verifier, mode, seed=a, detail=True)     # (its "kl_method": ``method``'s)
        lph.append(d["log_p_hat"])
        se.append(d["se"])
    out = {"log_p": np.concatenate(lp), "log_p_hat": np.concatenate(lph), "kl_method": d["kl_method"]}
    if d["kl_method"] == "mc":
        out |= {"log_p_hat_se": np.concatenate(se), "mc": {"samples": d["samples"], "groups": d["groups"]}}
    return out
