"""Exact theory of relaxed speculative decoding (docs/theory.md, T0-T11).

Modules: ``rules`` (acceptance/resampling rules, one array-API implementation shared with ``sim`` and
``real``), ``verify`` (chain verification), ``markov`` (exact E[tau], TV bound and exact TV on Markov
chains), ``chains`` (synthetic chain generators). ``theory`` imports nothing else of this project.
"""
from . import chains, markov, rules, verify
from .rules import Verifier, cool_sd, greedy, lantern, lantern_pp, linear_rsd, typical, uniform_rsd, vanilla
from .verify import verify_chain

__all__ = ["chains", "markov", "rules", "verify", "Verifier", "verify_chain", "vanilla", "cool_sd",
           "uniform_rsd", "linear_rsd", "lantern", "lantern_pp", "typical", "greedy"]
