"""Static draft trees (``real.decode.tree.StaticTree``, the EAGLE-1 / LANTERN++ setting): ``--mode tree`` (or
simply ``--tree NAME``), ``--tree`` eagle25, eagle57, chain (the chain of ``--L`` drafts run by the tree engine) or a
JSON list of paths, ``--tree-candidates`` sampled | topk.

Record: the rounds that drafted the whole tree (``theory.likelihood.recorded.TreeRows``). Likelihood: exact for top-k
candidates and for sampled ones within ``theory.likelihood.tree``'s cost guard (``real.decode.score_tree``); greedy
trees have none."""
from __future__ import annotations

from ..chain import DEFAULT_L
from .base import ModeDef, NoLikelihood, Option, tree_arrays

__all__ = ["STATIC_TREE"]


class StaticTreeDef(ModeDef):
    name, label, describes, needs_draft, static_tree = "tree", "tree", "static trees", True, True
    implied_by = "tree"
    options = (
        Option("tree", str, "static draft tree (EAGLE-1 / LANTERN++ setting): eagle25, eagle57, chain (the chain of "
                            "--L drafts run by the tree engine) or a JSON list of paths of child ranks, e.g. "
                            "'[[0],[1],[0,0]]'"),
        Option("tree_candidates", str, "static trees: a node's children drawn without replacement (sampled, default) "
                                       "or its top-m tokens (topk, as the EAGLE-1 / LANTERN++ releases, verified "
                                       "with qx = 1)", choices=("sampled", "topk"), key="candidates"),
        Option("L", int, "--tree chain: its drafts per round", lo=1, image_bound=True),
    )
    no_likelihood = None

    def _tree(self, opts):
        from theory.tree import parse_tree

        if opts.get("tree") is None:
            raise ValueError("--mode tree needs --tree (eagle25, eagle57, chain or a JSON list of paths)")
        return parse_tree(opts["tree"], opts.get("L") or DEFAULT_L)

    def check(self, opts, num_tokens, processing):
        self._tree(opts)
        if opts.get("L") is not None and opts["tree"].strip().lower() != "chain":
            raise ValueError("--L sets chain drafts; --tree sets the depth (give one of them, or --tree chain --L N)")

    def build(self, opts, facts=None):
        from ..tree import StaticTree

        return StaticTree(self._tree(opts), opts.get("candidates") or "sampled")

    def max_depth(self, opts):
        return int(self._tree(opts).depth)

    def identity(self, opts):
        return {**super().identity({}), "L": opts.get("L"), "tree": opts.get("tree"),
                "candidates": opts.get("candidates") or "sampled"}

    def report(self, mode, opts):
        return {"tree": {"name": opts.get("tree"), "nodes": mode.tree.n_nodes, "depth": mode.tree.depth,
                         "candidates": mode.candidates}}

    def record(self, gens, mode, stamp, chain_arrays):
        return tree_arrays(gens, mode.tree)

    def likelihood(self, mode, verifier, V, processing):
        """``real.decode.score_tree.check`` (``V`` None: before the model is built, what the options show)."""
        from ..score_tree import GREEDY_REASON, check

        if V is None:
            if processing.greedy:
                raise NoLikelihood(GREEDY_REASON)
            return mode
        check(mode, verifier, V, processing)
        return mode


STATIC_TREE = StaticTreeDef()
