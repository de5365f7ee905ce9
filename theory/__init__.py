"""Exact theory of relaxed speculative decoding (docs/theory.md, T0-T11).

Modules: ``rules`` (acceptance/resampling rules, one array-API implementation shared with ``sim`` and
``real``), ``verify`` (chain verification), ``tree`` (static draft trees and multi-candidate
verification), ``markov`` (exact E[tau], TV bound and exact TV on Markov chains), ``chains`` (synthetic
chain generators), ``optimize`` (G* confirmation, optimal schedules, the annealing study; JAX imported
on use), ``image`` (whole-image predictions and the speed-up model), ``recorded`` (T10-T11 from recorded
rounds), ``schedules`` (weight schedules, Cool-SD's normalisations), ``tune`` (schedules tuned on recorded
rounds; JAX imported on use). ``theory`` imports nothing else of this project.
"""
from . import chains, image, markov, optimize, recorded, rules, schedules, tree, tune, verify
from .rules import Verifier, cool_sd, greedy, lantern, lantern_pp, linear_rsd, typical, uniform_rsd, vanilla
from .tree import Tree, verify_tree
from .verify import verify_chain

__all__ = ["chains", "image", "markov", "optimize", "recorded", "rules", "schedules", "tree", "tune", "verify", "Verifier", "Tree",
           "verify_chain", "verify_tree", "vanilla", "cool_sd", "uniform_rsd", "linear_rsd", "lantern", "lantern_pp",
           "typical", "greedy"]
