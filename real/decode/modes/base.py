"""What every drafting mode's file declares (``real.decode.modes``): ``Option`` (one command-line option) and ``ModeDef``
(a mode's declaration: its name and report label, its options, how it is built from a frozen config, its record
format, its likelihood hook and its capabilities), and the helpers several modes share (``tree_arrays``,
``window_facts``), so the modes' files stand side by side and none imports another.

A ``ModeDef`` never compares mode names: the registry holds one per mode and the command line, the sweep and the
reports ask the declaration (``label``, ``needs_draft``, ``static_tree``, ``grown_tree``, ``report``, ``record``,
``likelihood``). Options are plain values: ``opts`` is a dict {key: value} of the options given (keys are the
mode's own names, e.g. Jacobi's ``init`` for ``--jacobi-init``); ``facts`` a dict of what the built model tells
(``num_tokens`` T, ``width`` the image row width or None, ``plain_tail``: SJD's plain tail on Lumina-mGPT),
given by the caller so the decoder never imports a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Option", "ModeDef", "NoLikelihood", "flag", "tree_arrays", "window_facts"]


def flag(dest: str) -> str:
    """The command-line spelling of an argparse dest."""
    return "--" + dest.replace("_", "-")


class NoLikelihood(NotImplementedError):
    """A mode (or construction) without an exact likelihood; the message is the reason."""


@dataclass(frozen=True)
class Option:
    """One command-line option of a mode: argparse ``dest`` (flag ``--dest-with-dashes``), the mode's ``key`` for it
    (default: ``dest``), ``type`` (int, str), ``choices``, ``lo`` (integers: the least value), ``image_bound`` (an
    integer that may not exceed the image's tokens), ``help``. Every flag defaults to None on the command line (so
    "given" is one fact); the mode's own default applies when it is not given."""
    dest: str
    type: Callable = str
    help: str = ""
    choices: tuple | None = None
    key: str | None = None
    lo: int | None = None
    image_bound: bool = False

    @property
    def name(self) -> str:
        return self.key or self.dest

    @property
    def flag(self) -> str:
        return flag(self.dest)

    def check(self, value, num_tokens: int | None = None):
        """The value converted and range-checked; ValueError naming the flag."""
        from theory.core import checks

        if self.type is int:
            v = checks.integer(self.flag, value, lo=self.lo)
            if self.image_bound and num_tokens and v > num_tokens:
                raise ValueError(f"{self.flag} {v} is larger than the image ({num_tokens} tokens; a round never "
                                 f"drafts past it): use {self.flag} <= {num_tokens}")
            return v
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.flag} must be one of {', '.join(map(str, self.choices))}, got {value!r}")
        return value


class ModeDef:
    """A drafting mode's declaration (module docstring). Subclasses set the class attributes and override what
    differs; the defaults describe a drafter-free mode without an exact likelihood.

    ``name``: the value of ``--mode``; ``label``: how reports name it; ``options``: its ``Option`` s; ``describes``:
    what its options configure (error messages: "--window configures Jacobi drafting"); ``needs_draft``: drafted by a
    draft model; ``chain``: rounds draft one chain from the draft model (the chain predictions apply); ``static_tree``: rounds draft a fixed tree (``mode.tree``; records keep the rounds that drafted it
    all); ``grown_tree``: rounds grow their own tree (per-round records); ``sweep_reason``: why ``coolsd sweep``
    refuses it (None: the sweep runs it); ``cli``: a ``--mode`` choice; ``record_marker``: an array name only its record format holds (readers tell the
    format by it); ``implied_by``: the dest of an option
    that selects the mode when no mode is named (``--tree eagle25``: a static tree); ``deprecated_by``: the dest of
    an older option whose value, the mode's name, selected it (``--draft jacobi``, ``--tree dynamic``); ``no_likelihood``: why it has no exact likelihood (None: ``likelihood``
    says)."""
    name: str = ""
    label: str = ""
    options: tuple = ()
    describes: str = ""
    needs_draft: bool = False
    chain: bool = False
    static_tree: bool = False
    grown_tree: bool = False
    sweep_reason: str | None = None
    cli: bool = True
    record_marker: str | None = None
    implied_by: str | None = None
    deprecated_by: str | None = None
    no_likelihood: str | None = "no exact likelihood is declared for this mode"

    def __init__(self, factory: Callable[[dict], object] | None = None, name: str | None = None, **attrs):
        """``factory(opts) -> Drafting`` builds the mode (``build`` calls it with the options and the model's facts
        that the mode's constructor takes); ``attrs`` override the class attributes (a one-line registration)."""
        self._factory = factory
        if name is not None:
            self.name = str(name).lower()
        for k, v in attrs.items():
            if not hasattr(type(self), k):
                raise TypeError(f"ModeDef has no attribute {k!r}")
            setattr(self, k, v)
        self.label = self.label or self.name

    # ------------------------------------------------------------------ building
    def option(self, dest: str) -> Option | None:
        return next((o for o in self.options if o.dest == dest), None)

    def check(self, opts: dict, num_tokens: int | None, processing) -> None:
        """Checks across options, before any model is built (ValueError naming the flag); by default the mode is
        built and runs its own ``check`` (no model, ``num_tokens`` or a large bound)."""
        mode = self.build(opts, {})
        if self.needs_draft:                 # its own check needs the draft model: the build's checks only
            return
        mode.check(None, None, num_tokens or 1 << 30, None, processing, 1)

    def build(self, opts: dict, facts: dict | None = None):
        """The ``real.protocol.Drafting`` value for ``opts`` and the model's ``facts`` (module docstring)."""
        if self._factory is None:
            raise NotImplementedError(f"mode {self.name} declares no factory")
        return self._factory(dict(opts) | self.from_facts(opts, facts or {}))

    def from_facts(self, opts: dict, facts: dict) -> dict:
        """The constructor arguments the model's facts give (none by default)."""
        return {}

    def max_depth(self, opts: dict) -> int:
        """The most drafted levels per round (the verifiers' L)."""
        return int(self.build(opts, {}).max_depth)

    def identity(self, opts: dict) -> dict:
        """What a stored sweep unit must match (plain JSON)."""
        return {"kind": self.name, "L": None, "tree": None, "candidates": "sampled", "dynamic": None,
                "free": dict(sorted(opts.items()))}

    # ------------------------------------------------------------------ after a run
    def report(self, mode, opts: dict) -> dict:
        """Entries of ``coolsd generate``'s JSON result describing the mode (merged at the top level)."""
        return {"draft": self.name, self.name: {k: v for k, v in mode.params().items() if k not in ("draft", "L")}
                | {"width": getattr(mode, "width", None)}}

    def record(self, gens: list, mode, stamp: dict, chain_arrays: Callable) -> dict:
        """``--record``: the arrays to write (``theory.likelihood.recorded.load_rows`` reads them back).
        ``chain_arrays(gens, L, stamp)`` makes the chain format (rounds with their starts and the run's ``stamp``);
        by default the rounds are written as a chain of ``max_depth`` drafts, stamped with the mode's name."""
        return chain_arrays(gens, int(mode.max_depth), {**stamp, "draft": self.name})

    def likelihood(self, mode, verifier, V: int, processing):
        """--fidelity / the sweep's exact KL: the ``drafting`` argument of ``real.decode.score.score`` for ``mode``
        (an int L: chains), after refusing, before any model call, what has no exact likelihood (``NoLikelihood``:
        a NotImplementedError whose message is the reason)."""
        raise NoLikelihood(self.no_likelihood)


def tree_arrays(gens: list, tree) -> dict:
    """The record of a mode whose rounds draft one static tree (``theory.likelihood.recorded.TreeRows``): the rounds
    that drafted the whole ``tree`` (``theory.tree.Tree``): p, q (R, N+1, V), tokens (R, N+1), image, accepted (R,),
    tree_paths (JSON). ValueError when no round drafted it all."""
    import json

    import numpy as np

    full = [(i, r) for i, g in enumerate(gens) for r in g.rounds if r.depth == tree.depth]
    if not full:
        raise ValueError("no round drafted the whole tree (images too short?)")
    return {"p": np.stack([r.p for _, r in full]), "q": np.stack([r.q for _, r in full]),
            "tokens": np.stack([r.drafts for _, r in full]), "image": np.array([i for i, _ in full], dtype=np.int64),
            "accepted": np.array([r.accepted for _, r in full]),
            "tree_paths": np.array(json.dumps([list(p) for p in tree.paths]))}


def window_facts(opts: dict, facts: dict, *, bounded: bool = True) -> dict:
    """A window mode's constructor arguments from the model's facts: ``width`` (the image row width, None unknown);
    ValueError when the window exceeds the image (``bounded``) or an initialisation needs a width it lacks."""
    if not facts:
        return {}
    T = facts.get("num_tokens")
    if bounded and T is not None and opts.get("window", 0) > T:
        raise ValueError(f"--window {opts['window']} is larger than the image ({T} tokens)")
    if opts.get("init", "random") != "random" and facts.get("width") is None:
        raise ValueError(f"--jacobi-init {opts['init']} needs the image row width; --model's images have no known grid")
    return {"width": facts.get("width")}
