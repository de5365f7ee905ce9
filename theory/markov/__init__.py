"""theory.markov: exact theory of relaxed speculative decoding on order-1 Markov chains (section 4).

Holds ``tables`` (per-position rule tables F, G; exact E[tau] T2/T8, the TV bound T3/T4/T9, the exact TV T7, G* T5;
re-exported here), ``chains`` (synthetic target/draft pairs), ``image`` (whole-image predictions and the speed-up
model, section 7), ``objectives`` (the traceable tables and objectives the optimisers differentiate), ``gstar`` (G*
confirmed against every resampling table), ``optimize`` (optimal schedules at a fixed E[tau]) and ``sizes`` (the
exact-TV size checks). ``optimize`` and ``gstar`` import scipy (~0.4 s): loaded on first use.

May import: ``theory.core``, ``theory.rules``, ``theory.tree``.
"""
from . import chains, image, tables
from .tables import *  # noqa: F401,F403  (the tables' public API: rule_tables, expected_accepted, tv_bound, ...)
from .tables import __all__ as _tables_all

__all__ = ["chains", "image", "tables", *_tables_all]   # objectives, gstar, optimize, sizes: on first use


def __getattr__(name):
    if name in ("optimize", "gstar", "objectives", "sizes"):    # scipy / JAX on first use
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
