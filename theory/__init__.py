"""Exact theory of relaxed speculative decoding (docs/theory.md, T0-T11).

Modules: ``rules`` (acceptance/resampling rules, one array-API implementation shared with ``sim`` and
``real``), ``verify`` (chain verification), ``tree`` (static draft trees and multi-candidate
verification), ``methods`` (the method registry: name -> rule, typed parameters), ``markov`` (exact
E[tau], TV bound and exact TV on Markov chains), ``chains`` (synthetic chain generators),
``objectives`` (the traceable rule tables and objectives the optimisers differentiate), ``gstar`` (G*
confirmation: B or exact TV minimised over all resampling tables), ``optimize`` (schedule search:
optimal schedules, named schedules tuned to E[tau], equal-E[tau] trade-off curves; re-exports
``gstar`` and ``objectives``), ``image`` (whole-image predictions and the speed-up model), ``recorded``
(T10-T11 from recorded rounds; the recorded rows and their loader), ``schedules`` (weight schedules,
Cool-SD's normalisations), ``tune`` (schedules tuned on recorded rounds), ``likelihood`` (the exact law
P^(x) of a chain-drafted sequence, T12) and ``fidelity`` (TV and KL to the target with intervals, the
per-image T11 bound). JAX is imported on use (``_optim``: JAX plumbing and size checks shared by
``gstar``, ``optimize`` and ``tune``). ``theory`` imports nothing else of this project.
"""
from . import chains, checks, fidelity, gstar, image, likelihood, markov, methods, objectives, recorded, rules, schedules, tree, verify
from .rules import Verifier, cool_sd, greedy, lantern, lantern_pp, linear_rsd, typical, uniform_rsd, vanilla
from .tree import Tree, verify_tree
from .verify import verify_chain

__all__ = ["chains", "checks", "fidelity", "gstar", "image", "likelihood", "markov", "methods", "objectives", "optimize", "recorded", "rules",
           "schedules", "tree", "tune", "verify", "Verifier", "Tree",
           "verify_chain", "verify_tree", "vanilla", "cool_sd", "uniform_rsd", "linear_rsd", "lantern", "lantern_pp",
           "typical", "greedy"]


def __getattr__(name):
    # theory.optimize imports scipy.optimize (~0.4 s): loaded on first use, so that commands that
    # refuse bad input (or never optimise) start fast
    if name in ("optimize", "tune"):    # tune imports optimize
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
