"""SJD-PAC (``real.decode.sjd_pac.SJDPAC``): Jacobi windows with a proactive tree, drafter-free. ``--mode sjd-pac``
(as released, not lossless) and ``--mode sjd-pac-p`` (ours: the release's drafting made lossless), with ``--window``
(may exceed the image: the tree is cut there), ``--pac-width``, ``--pac-depth``.

Record: the window's static tree (``theory.likelihood.recorded.TreeRows``) plus ``verdict`` ("longest": the release
decides a round by the longest accepted path; "walk": the tree walk). Likelihood: none (a Jacobi-family draft)."""
from __future__ import annotations

import numpy as np

from ..jacobi import JACOBI_REASON
from ..sjd_pac import DEFAULT_TREE_DEPTH, DEFAULT_TREE_WIDTH, DEFAULT_WINDOW, SJDPAC, tree_nodes
from .base import ModeDef, Option, tree_arrays, window_facts

__all__ = ["SJD_PAC", "SJD_PAC_P"]


class SJDPACDef(ModeDef):
    deprecated_by = "draft"                # the older --draft NAME
    describes = "SJD-PAC's proactive tree, a Jacobi-family draft"
    options = (
        Option("window", int, f"target rows per call W: the proactive tree and its chain (default {DEFAULT_WINDOW}, as "
                              "released; may exceed the image)", lo=1),
        Option("pac_width", int, f"the proactive tree's branching K (the release's tree_width; default "
                                 f"{DEFAULT_TREE_WIDTH})", key="tree_width", lo=1),
        Option("pac_depth", int, f"the proactive tree's depth D, root included (the release's tree_depth; default "
                                 f"{DEFAULT_TREE_DEPTH}); the tree's (K^D - 1) / (K - 1) nodes must fit the window",
               key="tree_depth", lo=1),
    )
    no_likelihood = JACOBI_REASON + " (SJD-PAC's windows are Jacobi-family drafts)"
    sweep_reason = ("the sweep records and predicts chain-shaped Jacobi windows; SJD-PAC's windows are trees: run coolsd "
                    "generate per rule, or benchmarks/bench_jacobi.py (predictions from one recorded run)")
    release = True

    def build(self, opts, facts=None):
        return SJDPAC(**self.capped(opts, facts or {}), release=self.release,
                      **window_facts(opts, facts or {}, bounded=False))

    @staticmethod
    def capped(opts: dict, facts: dict) -> dict:
        """``opts`` with the window capped at the image (issue 50): past W = T + tree nodes - D the main branch
        already spans the T-token image, so a larger window drafts, verifies and reports exactly the same (the tree
        is cut at the image end every round) but would build W-sized plans (--window 100000: out of memory)."""
        T, W = facts.get("num_tokens"), opts.get("window")
        if T is None or W is None:
            return dict(opts)
        K, D = opts.get("tree_width", DEFAULT_TREE_WIDTH), opts.get("tree_depth", DEFAULT_TREE_DEPTH)
        return dict(opts) | {"window": min(int(W), int(T) + tree_nodes(K, D) - D)}

    def record(self, gens, mode, stamp, chain_arrays):
        # the release decides its rounds by the longest accepted path, not the walk TreeRows predicts
        return tree_arrays(gens, mode.tree()) | {"verdict": np.array("longest" if mode.release else "walk")}


SJD_PAC = SJDPACDef(name="sjd-pac")
SJD_PAC_P = SJDPACDef(name="sjd-pac-p", release=False)
