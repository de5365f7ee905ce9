"""theory.core: arrays and validation, the floor every room stands on.

Holds ``xp`` (array-API helpers: the namespace of arrays, gathers, normalisation, inverse-CDF draws; numpy, JAX
and torch alike), ``checks`` (one-line validation of numbers, arrays, rows, tokens, files and costs, shared by
every entry point) and ``jaxtools`` (float64 JAX blocks and jitted functions built once).

May import: nothing of this project.
"""
from . import checks, xp

__all__ = ["checks", "xp"]
