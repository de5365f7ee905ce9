"""The drafting modes (``real.protocol.Drafting``) and their registry.

A mode is a value: ``Plain()`` (no drafting), ``Chain(L)`` (a draft model's chain; an independent draft or an
EAGLE-1 feature drafter), ``StaticTree(tree, candidates)``, ``DynamicTree(total, depth, topk, sampling)``, and the
drafter-free ``Jacobi(window, init, coupling)`` and ``SJDPAC(window, tree_width, tree_depth, release)``.
``real.decode.engine.generate(..., drafting=...)`` runs any of them, and any object that follows the contract (a new
mode is one file: propose, advance).

The registry names the modes a command line can ask for by ``--draft NAME`` without a draft model (``jacobi``,
``sjd-pac``, ``sjd-pac-p``, and whatever a user registers: ``register("ngram", lambda opts: NGram(...),
drafter_free=True)``); model-drafted modes are chosen by the draft model's kind plus ``--L`` / ``--tree``
(``coolsd.options``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from theory.tree import Tree

from .chain import DEFAULT_L, Chain, Plain
from .dynamic_tree import DynamicTree
from .jacobi import Jacobi
from .sjd_pac import SJDPAC
from .tree import StaticTree

__all__ = ["Plain", "Chain", "StaticTree", "DynamicTree", "Jacobi", "SJDPAC", "DEFAULT_L", "as_drafting", "register", "get",
           "DRAFTER_FREE"]

# name -> factory(options: dict) -> Drafting, for the drafter-free modes a command line selects with --draft NAME
DRAFTER_FREE: dict[str, Callable[[dict], object]] = {}


def register(name: str, factory: Callable[[dict], object], *, drafter_free: bool = True) -> None:
    """Register a drafting mode under ``name`` (``factory(options) -> Drafting``); ValueError for a name taken. Only
    drafter-free modes are selected by name (model-drafted ones follow the draft model)."""
    if not drafter_free:
        raise NotImplementedError("model-drafted modes are chosen by the draft model and --L / --tree, not by name; "
                                  "register a drafter-free mode, or pass your mode as generate(drafting=...)")
    key = str(name).lower()
    if key in DRAFTER_FREE:
        raise ValueError(f"drafting mode {name!r} is already registered")
    DRAFTER_FREE[key] = factory


def get(name: str, options: dict | None = None):
    """The registered drafter-free mode ``name`` built with ``options``; ValueError naming the choices."""
    key = str(name).lower()
    if key not in DRAFTER_FREE:
        raise ValueError(f"unknown drafting mode {name!r}; registered: {sorted(DRAFTER_FREE)}")
    return DRAFTER_FREE[key](dict(options or {}))


def as_drafting(x):
    """``generate``'s ``drafting`` argument as a mode: None -> ``Plain()``, an int L -> ``Chain(L)``, a
    ``theory.tree.Tree`` -> ``StaticTree(tree)``, a mode (anything with ``propose``) -> itself; else TypeError."""
    if x is None:
        return Plain()
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return Chain(int(x))
    if isinstance(x, Tree):
        return StaticTree(x)
    if all(callable(getattr(x, m, None)) for m in ("propose", "advance", "start", "check")) and hasattr(x, "max_depth"):
        return x
    raise TypeError(f"drafting must be None (plain AR), an int L (chain), a theory.tree.Tree (static tree) or a "
                    f"real.protocol.Drafting mode, got {type(x).__name__}")


register("jacobi", lambda o: Jacobi(**o))
register("sjd-pac", lambda o: SJDPAC(**o, release=True))        # SJD-PAC as released (not lossless)
register("sjd-pac-p", lambda o: SJDPAC(**o, release=False))     # ours: the release's drafting, made lossless
