"""theory.likelihood: what a rule does to real images, from model rows (teacher-forced or recorded).

Holds ``chain`` (the exact law P^(x) of chain-drafted output, T12, and log P(x); re-exported here), ``tree`` (the
exact law of static- and dynamic-tree output, T13: ``tree_log_likelihood``, re-exported here), ``fidelity``
(TV and KL to the target with 95% intervals), ``recorded`` (T10-T11 predictions from recorded rounds, the recorded
row classes and their loader), ``path_bound`` (the per-image bound from an image's own path) and ``tune``
(schedules tuned on rows; imports scipy, loaded on first use).

May import: ``theory.core``, ``theory.rules``, ``theory.tree``.
"""
from . import chain, fidelity, path_bound, recorded, tree
from .chain import CONVENTIONS, check_chain_rule, log_likelihood, log_target, round_masks
from .tree import tree_log_likelihood

__all__ = ["chain", "fidelity", "path_bound", "recorded", "tree", "tune", "CONVENTIONS", "check_chain_rule",
           "log_likelihood", "log_target", "round_masks", "tree_log_likelihood"]


def __getattr__(name):
    if name == "tune":               # scipy on first use
        import importlib

        return importlib.import_module(".tune", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
