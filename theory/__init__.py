"""Exact theory of relaxed speculative decoding (docs/theory.md, T0-T13), in rooms that show its layers:

* ``theory.core``       arrays (``xp``) and validation (``checks``): imports nothing of ours;
* ``theory.rules``      the verifiers: acceptance and resampling rules, schedules, LANTERN, GSD, the method
                        registry (``theory.rules.methods``), chain verification, the discrepancy T3;
* ``theory.tree``       draft trees: shapes, tree verification, dynamic-tree keys, the exact tree round;
* ``theory.markov``     exact theory on Markov chains: E[tau], the bound, the exact TV, G*, whole images,
                        optimal schedules;
* ``theory.likelihood`` from model rows: the exact law of SD output (chains T12, trees T13), fidelity (TV, KL),
                        predictions from recorded rounds, the tuner.

A room may import only the rooms listed in its ``__init__`` (tests/test_repo.py enforces it): core <- rules <- tree
<- {markov, likelihood}; ``theory`` imports nothing else of this project. The verifier constructors are
re-exported here (``theory.cool_sd(2.0)``).
"""
from . import core, likelihood, markov, rules, tree
from .rules import Verifier, cool_sd, greedy, lantern, lantern_pp, linear_rsd, typical, uniform_rsd, vanilla, verify_chain
from .tree import Tree, verify_tree

__all__ = ["core", "rules", "tree", "markov", "likelihood", "Verifier", "Tree", "verify_chain", "verify_tree", "vanilla",
           "cool_sd", "uniform_rsd", "linear_rsd", "lantern", "lantern_pp", "typical", "greedy"]
