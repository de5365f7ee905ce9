"""Monte-Carlo simulation of relaxed speculative decoding (imports ``theory``).

* :func:`simulate` (tables F, G; numpy or JAX) and :func:`simulate_rule` (the real rule objects through
  ``theory.rules.chain.verify_chain``): many independent rounds, x_{1:L+1} virtually extended (T7).
* :func:`simulate_sequence` / :func:`simulate_sequence_rule`: whole sequences of T tokens by successive
  rounds (section 7), the latter for any context function (e.g. the 2-D grid source).
* :func:`validate` (module :mod:`sim.validation`): statistical checks of the simulator against the exact
  theory; :mod:`sim.stats` holds the tests it uses.
* :func:`simulate_tree`: static-tree rounds with multi-candidate verification (``theory.tree``).
* :mod:`sim.sources`: image-like token sources (2-D grid, latent codebook) and the method comparison.
"""
from . import sources, stats
from .alias import alias_draw, alias_table
from .rounds import SimResult, simulate, simulate_rule
from .sequence import SequenceResult, order1_context, simulate_sequence, simulate_sequence_rule
from .trees import TreeSimResult, simulate_tree
from .validation import format_report, validate

__all__ = ["simulate", "simulate_rule", "SimResult", "simulate_sequence", "simulate_sequence_rule",
           "SequenceResult", "order1_context", "validate", "format_report", "sources", "stats",
           "alias_table", "alias_draw", "simulate_tree", "TreeSimResult"]
