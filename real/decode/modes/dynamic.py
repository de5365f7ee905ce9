"""Dynamic draft trees (``real.decode.dynamic_tree.DynamicTree``, EAGLE-2, the LANTERN release's default):
``--mode dynamic`` with ``--tree-total/-depth/-topk/-sampling``.

Record: per-round trees (``theory.likelihood.recorded.DynamicRows``, docs/theory.md section 10): the rounds that
scored the whole block of ``total`` nodes. Likelihood (``real.decode.score_tree`` regrows each round's tree): exact
for the release construction (``--tree-sampling release``); lossless trees (stochastic-beam keys) T15's Monte Carlo
estimate with its SE ("kl_method": "mc"); greedy trees have none."""
from __future__ import annotations

import json

import numpy as np

from ..dynamic_tree import DynamicTree
from .base import ModeDef, NoLikelihood, Option

__all__ = ["DYNAMIC", "dynamic_arrays"]

_D = DynamicTree()          # the defaults (help text)


class DynamicTreeDef(ModeDef):
    name, label, describes, needs_draft, grown_tree = "dynamic", "dynamic-tree", "dynamic trees", True, True
    deprecated_by = "tree"                   # the older --tree dynamic
    record_marker = "dynamic"                # the array only its record holds
    options = (
        Option("tree_total", int, f"nodes per target call, root included (default {_D.total}, the release's; >= 2: "
                                  "the root alone drafts nothing)", key="total", lo=2),
        Option("tree_depth", int, f"expansion levels; nodes reach depth + 1 (default {_D.depth})", key="depth",
               lo=1),
        Option("tree_topk", int, f"children per node (default {_D.topk})", key="topk", lo=1),
        Option("tree_sampling", str, "lossless (default: stochastic-beam-search keys, candidates verified with their "
                                     "draft law) or release (top-k candidates verified with qx = 1, as the EAGLE-2 / "
                                     "LANTERN release)", choices=("lossless", "release"), key="sampling"),
    )
    no_likelihood = None

    def check(self, opts, num_tokens, processing):
        self.build(opts)                              # its own checks (total within the pool, ...)

    def build(self, opts, facts=None):
        return DynamicTree(**opts)

    def identity(self, opts):
        m = self.build(opts)
        return {**super().identity({}), "dynamic": [m.total, m.depth, m.topk, m.sampling]}

    def report(self, mode, opts):
        return {"tree": {"name": "dynamic", "nodes": mode.n_nodes, "depth": mode.max_depth, **mode.params()}}

    def record(self, gens, mode, stamp, chain_arrays):
        return dynamic_arrays(gens, mode)

    def likelihood(self, mode, verifier, V, processing):
        """``real.decode.score_tree.check`` (``V`` None: before the model is built, what the options show)."""
        from ..score_tree import GREEDY_REASON, check

        if V is None:
            if processing.greedy:
                raise NoLikelihood(GREEDY_REASON)
            return mode
        check(mode, verifier, V, processing)
        return mode


def dynamic_arrays(gens, mode) -> dict:
    """The rounds of ``gens`` (``real.decode.engine.Generation`` with ``record_rows``) that scored the whole block of
    ``mode.total`` nodes (rounds at an image's end score fewer: left out, as static-tree records keep only full trees):
    p, q (R, N+1, V) in the dtype they were computed in (q empty in release mode: point-mass candidates), tokens, parent (R, N+1) int64,
    max_depth (R,) the walk's depth bound, image, accepted (R,), dynamic (JSON of ``mode.params()``). ValueError when
    no round is complete."""
    full = [(i, r) for i, g in enumerate(gens) for r in g.rounds
            if r.drafted > 0 and r.parent is not None and len(r.parent) == mode.total]
    if not full:
        raise ValueError("no round scored the whole tree (images too short?)")
    arrs = {"p": np.stack([r.p for _, r in full]),
            "tokens": np.stack([r.drafts for _, r in full]).astype(np.int64),
            "parent": np.stack([r.parent for _, r in full]).astype(np.int64),
            "max_depth": np.array([r.depth for _, r in full], np.int64),
            "image": np.array([i for i, _ in full], np.int64),
            "accepted": np.array([r.accepted for _, r in full], np.int64),
            "dynamic": np.array(json.dumps(mode.params()))}
    # release mode: no draft rows (point-mass candidates: the point law never reads q, and a stored q would make
    # load_rows read the rounds under the without-replacement law), stored as an empty q (load_rows reads None)
    point = mode.draft_law == "point" or full[0][1].q is None
    arrs["q"] = np.zeros(0, arrs["p"].dtype) if point else np.stack([r.q for _, r in full])
    return arrs


DYNAMIC = DynamicTreeDef()
