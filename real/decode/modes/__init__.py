"""The drafting modes (``real.protocol.Drafting``) and their one registry.

A mode is a value: ``Plain()`` (no drafting), ``Chain(L)`` (a draft model's chain; an independent draft or an
EAGLE-1 feature drafter), ``StaticTree(tree, candidates)``, ``DynamicTree(total, depth, topk, sampling)``, and the
drafter-free ``Jacobi(window, init, coupling)`` and ``SJDPAC(window, tree_width, tree_depth, release)``.
``real.decode.engine.generate(..., drafting=...)`` runs any of them, and any object that follows the contract.

Each mode is declared in its own file of this package by a ``base.ModeDef`` (``chain``: plain and chains,
``static_tree``, ``dynamic``, ``jacobi``, ``sjd_pac``): its command-line options, how it is built from a frozen
config, its ``--record`` format, its likelihood hook (or why it has none), its report label and capabilities. The
registry ``REGISTRY`` (name -> ModeDef) is the one vocabulary of every command (``--mode NAME``); a user mode is one
``register`` call, model-drafted or drafter-free:

    register(MyModeDef())                                   # a full declaration
    register("ngram", lambda opts: NGram(**opts))           # drafter-free, the Jacobi window's options
"""
from __future__ import annotations

from collections.abc import MutableMapping
from typing import Callable


from theory.core.checks import brief

from ..chain import DEFAULT_L, Chain, Plain
from ..dynamic_tree import DynamicTree
from ..jacobi import Jacobi
from ..sjd_pac import SJDPAC
from ..tree import StaticTree
from .base import ModeDef, NoLikelihood, Option
from .chain import CHAIN, PLAIN
from .dynamic import DYNAMIC
from .jacobi import JACOBI
from .sjd_pac import SJD_PAC, SJD_PAC_P
from .static_tree import STATIC_TREE

__all__ = ["Plain", "Chain", "StaticTree", "DynamicTree", "Jacobi", "SJDPAC", "DEFAULT_L", "register",
           "get", "lookup", "REGISTRY", "DRAFTER_FREE", "ModeDef", "Option", "NoLikelihood", "DEFAULT_MODE"]

REGISTRY: dict[str, ModeDef] = {}
DEFAULT_MODE = CHAIN.name          # what a command runs when no mode is named


class _Registered(ModeDef):
    """A mode registered by a factory alone (``register(name, factory)``): the Jacobi window's options, the image row
    width from the model, no exact likelihood, records in the chain format."""
    options = JACOBI.options
    describes = "the registered mode's window"

    def from_facts(self, opts, facts):
        return {"width": facts["width"]} if "width" in facts else {}


def register(mode: ModeDef | str, factory: Callable[[dict], object] | None = None, *, drafter_free: bool = True,
             **attrs) -> ModeDef:
    """Register a mode: a ``ModeDef``, or a name and ``factory(options) -> Drafting`` (``drafter_free=False``: it
    drafts with the draft model ``--draft`` names; ``attrs``: ModeDef attributes). ValueError for a name taken."""
    d = mode if isinstance(mode, ModeDef) else _Registered(factory, name=mode, needs_draft=not drafter_free,
                                                           deprecated_by=None if not drafter_free else "draft", **attrs)
    if not d.name:
        raise ValueError("a mode needs a name")
    if d.name in REGISTRY:
        raise ValueError(f"drafting mode {d.name!r} is already registered")
    REGISTRY[d.name] = d
    return d


def lookup(name: str) -> ModeDef:
    """The declaration of mode ``name`` (its ``--mode`` name or its report label); ValueError naming the choices."""
    key = str(name).lower()
    d = REGISTRY.get(key) or next((m for m in REGISTRY.values() if m.label == key), None)
    if d is None:
        raise ValueError(f"unknown drafting mode {brief(name)}; registered: {sorted(REGISTRY)}")
    return d


def get(name: str, options: dict | None = None):
    """The registered mode ``name`` built with ``options`` (no model facts); ValueError naming the choices."""
    return lookup(name).build(dict(options or {}), {})


class _DrafterFree(MutableMapping):
    """The drafter-free modes of ``REGISTRY`` as {name: factory} (``real.specs.universal_drafts``; ``pop``
    unregisters): a view, not a second registry."""

    def _names(self):
        return [n for n, d in REGISTRY.items() if not d.needs_draft and d.cli]

    def __getitem__(self, name):
        if name not in self._names():
            raise KeyError(name)
        return lambda o, d=REGISTRY[name]: d.build(o, {})

    def __setitem__(self, name, factory):
        register(name, factory)

    def __delitem__(self, name):
        if name not in self._names():
            raise KeyError(name)
        del REGISTRY[name]

    def __iter__(self):
        return iter(self._names())

    def __len__(self):
        return len(self._names())


DRAFTER_FREE = _DrafterFree()


for _d in (PLAIN, CHAIN, STATIC_TREE, DYNAMIC, JACOBI, SJD_PAC, SJD_PAC_P):
    register(_d)
