"""theory.likelihood: what a rule does to real images, from model rows (teacher-forced or recorded).

Holds ``chain`` (the exact law P^(x) of chain-drafted output, T12, and log P(x); re-exported here), ``tree`` (the
exact law of static- and dynamic-tree output, T13: ``tree_log_likelihood``, re-exported here), ``tree_mc`` (its
Monte Carlo estimate with a jackknife SE for sampled static trees at any V, T14, and for lossless dynamic trees from
sampled trees, T15; ``tree_walks``: the node walks they share), ``fidelity``
(TV and KL to the target with 95% intervals), ``recorded`` (T10-T11 predictions from recorded rounds, the recorded
row classes and their loader), ``path_bound`` (the per-image bound from an image's own path), ``tune`` (schedules
tuned on the per-round bound, section 8b), ``speed`` (tokens per call predicted from recorded vanilla rounds, as
``coolsd demo`` does), ``arrows`` (stamped AR rows and records) and, for section 8c, ``objective`` (KL(P||P^) and TV
of a rule family on AR images, exactly, with gradients) and ``exact_tune`` (schedules tuned on them). ``tune``,
``objective`` and ``exact_tune`` import scipy / JAX and are loaded on first use.

May import: ``theory.core``, ``theory.rules``, ``theory.tree``.
"""
from . import arrows, chain, fidelity, path_bound, recorded, speed, tree, tree_mc
from .chain import CONVENTIONS, check_chain_rule, log_likelihood, log_target, round_masks
from .tree import tree_log_likelihood

__all__ = ["arrows", "chain", "fidelity", "path_bound", "recorded", "speed", "tree", "tree_mc", "tune", "objective", "exact_tune",
           "CONVENTIONS", "check_chain_rule", "log_likelihood", "log_target", "round_masks", "tree_log_likelihood"]

_LAZY = ("tune", "objective", "exact_tune")      # scipy / JAX on first use


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
