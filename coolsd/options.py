"""The one parser of drafting and method options, shared by ``coolsd generate`` and ``coolsd sweep``.

Drafting: ``--mode NAME`` names the mode, one vocabulary for every command (``real.decode.modes.REGISTRY``: chain,
the default; tree; dynamic; jacobi; sjd-pac; sjd-pac-p; and whatever a user registers). The flags are the modes'
own (each mode's file declares them: ``real.decode.modes.base.Option``), all defaulting to None so "given" is one
fact (``given``); a flag the mode asked for does not read is refused, naming the mode that reads it, before any
work. ``--draft`` names a draft *model*. Older spellings keep working with a one-line deprecation on stderr:
``--draft jacobi`` (use ``--mode jacobi``), ``--tree dynamic`` (use ``--mode dynamic``); ``--tree NAME`` alone selects
the static tree it names.

``drafting_spec(args)`` -> ``DraftingSpec`` (the mode's name and its checked options: a plain, JSON-ready value the
sweep stores in its identity); ``spec.build(facts)`` -> the ``real.protocol.Drafting`` mode for the built model
(``real.specs.model_facts``: the image row width, SJD's plain tail).

Methods: the registry's flags (``theory.rules.methods.flags``) are namespaced per method: every flag is parsed as
text, and ``method_params(args, method)`` converts the ones given by THAT method's own parameter (its type, range and
default); a flag another method owns is refused, naming the method's own flags.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["DraftingSpec", "add_drafting_args", "add_method_args", "drafting_spec", "method_params", "given", "flag",
           "run_processing", "drafting_dests", "add_mode_flags", "method_spec"]


def flag(dest: str) -> str:
    """The command-line spelling of an argparse dest."""
    return "--" + dest.replace("_", "-")


def given(args, dest: str) -> bool:
    """Whether option ``dest`` was given: not None and not False (an empty list IS given, and refused where it must
    not be empty; the same rule as ``real.specs.given``)."""
    v = getattr(args, dest, None)
    return v is not None and v is not False


def _registry():
    from real.decode import modes

    return modes


def drafting_dests() -> dict:
    """{dest: [(ModeDef, Option), ...]}: every mode option of the registry, by argparse dest."""
    out: dict = {}
    for d in _registry().REGISTRY.values():
        for o in d.options:
            out.setdefault(o.dest, []).append((d, o))
    return out


def add_drafting_args(p) -> None:
    """``--mode`` and the flags every registered mode declares (module docstring), all defaulting to None."""
    modes = _registry()
    names = [n for n, d in modes.REGISTRY.items() if d.cli]
    g = p.add_argument_group("drafting (real.decode.modes: one file per mode)")
    g.add_argument("--mode", default=None, metavar="MODE",
                   help=f"the drafting mode: {', '.join(names)} (default {modes.DEFAULT_MODE}; --tree NAME alone "
                        "selects a static tree)")
    for dest, owners in drafting_dests().items():
        o = owners[0][1]
        kw = {"type": int} if o.type is int else {"choices": list(o.choices)} if o.choices else {}
        g.add_argument(o.flag, dest=dest, default=None, **kw,
                       help=f"--mode {'/'.join(d.name for d, _ in owners)}: {o.help}")


def add_mode_flags(g, mode: str, dests: tuple, **help) -> None:
    """The flags ``dests`` of mode ``mode`` as its declaration has them (type, choices; ``help``: {dest: text} for a
    command's own reading): commands that run one mode (``coolsd tune``'s chains, ``coolsd demo``'s chain and tree
    runs) take the same flags, with the same meaning, as ``generate``."""
    d = _registry().lookup(mode)
    for dest in dests:
        o = d.option(dest)
        if o is None:
            raise ValueError(f"mode {d.name} has no option {dest!r}")
        kw = {"type": int} if o.type is int else {"choices": list(o.choices)} if o.choices else {}
        g.add_argument(o.flag, dest=dest, default=None, help=help.get(dest, o.help), **kw)


def run_processing(args):
    """The processing the command will run with, as far as the drafting checks need it: the one greedy predicate is
    ``Processing.greedy`` of this (greedy methods run at temperature 0: ``real.decode.methods.method_processing``)."""
    from real.decode.methods import method_processing
    from real.decode.sampling import Processing
    from theory.rules import methods as registry

    method = str(getattr(args, "method", "vanilla") or "vanilla").lower()
    t = getattr(args, "temperature", 1.0)
    proc = Processing(temperature=0.0 if t == 0 else 1.0)
    return method_processing(method, proc) if method in {m.lower() for m in registry.names()} else proc


def add_method_args(p) -> None:
    """The verifier flags of every registry method, parsed as text (``method_params`` converts them per method)."""
    from theory.rules import methods as registry

    g = p.add_argument_group("verifier parameters (theory.rules.methods; each method reads its own, default: the "
                             "method's)")
    for dest, owners in registry.flag_owners().items():
        g.add_argument(flag(dest), dest=dest, default=None, metavar="V",
                       help="; ".join(f"{m.name}: {prm.help or prm.name} (default "
                                      f"{prm.default if prm.default is not None else 'derived'})" for m, prm in owners))


def method_params(args, method: str, gave: set | None = None) -> dict:
    """The registry parameters of ``method`` given as flags in ``args``, converted and range-checked by the method's
    own ``Param`` (ValueError naming the flag); a flag the method does not read is refused with its own flags.
    ``gave``: the verifier flags given (``given``), when the caller has read them already."""
    from theory.rules import methods as registry

    if gave is None:
        gave = {f for f in registry.flag_owners() if given(args, f)}
    m = registry.get(method)
    own = {p.option: p for p in m.free}
    other = sorted(f for f in registry.flag_owners() if f in gave and f not in own)
    if other:
        raise ValueError(f"{', '.join(flag(f) for f in other)} do(es) not apply to method {m.name} (its options: "
                         f"{sorted(flag(f) for f in own) or 'none'})")
    out = {}
    for f, prm in own.items():
        if f in gave:
            try:
                out[prm.name] = prm.check(m.name, getattr(args, f))
            except ValueError as e:
                raise ValueError(f"{flag(f)}: {e}") from None
    return out


def method_spec(args) -> tuple:
    """The method ``args`` names, checked before any model is built: (its name in lower case, "ar" for plain decoding;
    its own given parameters, ``method_params``, for the registry to resolve: ``theory.rules.methods.resolve`` with
    its combined checks). An unknown method, a verifier flag with --method ar, a flag another method owns and
    --gsd-table with a method that has no distance test are refused, naming the flag."""
    from theory.rules import methods as registry

    gave = {f for f in registry.flag_owners() if given(args, f)}     # read once
    method = str(args.method).lower()
    names = registry.names()                     # read now: a rule registered after import counts
    if method not in tuple(m.lower() for m in names) + ("ar",) + tuple(registry.ALIASES):
        raise ValueError(f"--method: unknown method {args.method!r}; choose from {', '.join(names + ('ar',))}")
    if method == "ar":
        if gave:
            raise ValueError(f"{', '.join(flag(f) for f in sorted(gave))} configure(s) a verifier; --method ar has "
                             "none")
        return method, {}
    params = method_params(args, method, gave)
    if getattr(args, "gsd_table", None) is not None and not registry.get(method).needs_embeddings:
        raise ValueError(f"--gsd-table configures GSD's distance test; --method {method} has none")
    return method, params


@dataclass(frozen=True)
class DraftingSpec:
    """Drafting options parsed and checked before any model is built: ``kind`` the mode's registry name
    (``real.decode.modes.REGISTRY``), ``options`` its given options as sorted (key, value) pairs (the mode's own keys);
    ``named`` how the command line named it (for messages)."""
    kind: str = "chain"
    options: tuple = ()
    named: str = ""

    @property
    def mode(self):
        """The mode's declaration (``real.decode.modes.base.ModeDef``)."""
        return _registry().lookup(self.kind)

    @property
    def opts(self) -> dict:
        return dict(self.options)

    @property
    def max_depth(self) -> int:
        """The most drafted levels per round (the verifiers' L)."""
        return self.mode.max_depth(self.opts)

    def identity(self) -> dict:
        """What a stored sweep unit must match (plain JSON)."""
        return self.mode.identity(self.opts)

    def build(self, facts: dict | None = None):
        """The drafting mode for a built model (``facts``: ``real.specs.model_facts``); its image-bound options (--L)
        checked first against the built image (``facts["num_tokens"]``: a spec that does not know its tokens left
        them unchecked before the build, ``drafting_spec``)."""
        facts, given = facts or {}, self.opts
        for o in self.mode.options:
            if o.image_bound and o.name in given:
                o.check(given[o.name], facts.get("num_tokens"))
        return self.mode.build(given, facts)


def _deprecated(old: str, new: str) -> None:
    print(f"coolsd: {old} is deprecated: use {new}", file=sys.stderr)


def _resolve(args, gave: set) -> tuple:
    """(ModeDef, how it was named, dests consumed by the naming) of ``args``: ``--mode``; the older ``--draft NAME`` /
    ``--tree dynamic`` (a one-line deprecation each); a mode's ``implied_by`` option; else the default. ``gave``: the
    drafting dests given (``given``, read once by ``drafting_spec``)."""
    modes = _registry()
    old = next(((d.name, f"{flag(d.deprecated_by)} {getattr(args, d.deprecated_by)}", d.deprecated_by)
                for d in modes.REGISTRY.values() if d.cli and d.deprecated_by
                and str(getattr(args, d.deprecated_by, None)).strip().lower() == d.name), None)
    if "mode" in gave:
        d = modes.lookup(args.mode)
        if not d.cli:
            raise ValueError(f"--mode {args.mode}: not a --mode choice (plain AR is --method ar)")
        if old is not None and old[0] != d.name:
            raise ValueError(f"{old[1]} names mode {old[0]}; --mode {args.mode} names another: give one --mode")
        return d, f"--mode {args.mode}", {old[2]} if old else set()
    if old is not None:
        _deprecated(old[1], f"--mode {old[0]}")
        return modes.lookup(old[0]), old[1], {old[2]}
    implied = next((d for d in modes.REGISTRY.values() if d.cli and d.implied_by and d.implied_by in gave), None)
    if implied is not None:
        return implied, f"{flag(implied.implied_by)} {getattr(args, implied.implied_by)}", set()
    return modes.lookup(modes.DEFAULT_MODE), f"--mode {modes.DEFAULT_MODE}", set()


def drafting_spec(args, num_tokens: int | None = None, processing=None) -> DraftingSpec:
    """The drafting options of ``args`` checked (ranges, flags that do not apply, combinations, the mode's own
    checks) into a ``DraftingSpec``; ``num_tokens`` (when known before building) bounds the image-bound options
    (--L, Jacobi's --window); ``processing``: ``run_processing(args)`` when the caller has it. ValueError naming the
    flag. Which options were given is read once, before the mode is looked up."""
    dests = drafting_dests()
    named_by = {"mode", *dests, *(d.implied_by for d in _registry().REGISTRY.values() if d.implied_by)}
    given_now = {d for d in named_by if given(args, d)}
    proc = run_processing(args) if processing is None else processing
    mdef, named, consumed = _resolve(args, given_now)
    gave = [d for d in dests if d not in consumed and d in given_now]
    ar = str(getattr(args, "method", "")).lower() == "ar"
    if ar and ("mode" in given_now or consumed):
        raise ValueError(f"{named} needs a speculative method (not ar)")
    if ar and gave:
        raise ValueError(f"{', '.join(flag(d) for d in gave)} configure{'s' if len(gave) == 1 else ''} drafting; "
                         "--method ar drafts nothing: give a speculative --method (e.g. vanilla)")
    own = {o.dest: o for o in mdef.options}
    checked = {d: own[d].check(getattr(args, d), num_tokens) if d in own          # ranges first, each flag once, by
               else dests[d][0][1].check(getattr(args, d), None) for d in gave}   # the option that reads it
    wrong = [d for d in gave if d not in own]
    if wrong:
        owner = next(m for m, _ in dests[wrong[0]] if m.cli)
        n = len(wrong)
        what = f"{', '.join(flag(d) for d in wrong)} configure{'s' if n == 1 else ''} {owner.describes}"
        if "mode" in given_now or consumed:
            raise ValueError(f"{', '.join(flag(d) for d in wrong)} do(es) not apply to {named} (its options: "
                             f"{', '.join(o.flag for o in mdef.options) or 'none'}); {what}: use --mode {owner.name}")
        raise ValueError(f"{what}: add --mode {owner.name}")
    draft = getattr(args, "draft", None)
    if not mdef.needs_draft and draft is not None and "draft" not in consumed:
        raise ValueError(f"--draft {draft} names a draft model; {named} drafts without one: drop --draft")
    opts = {o.name: checked[o.dest] for o in mdef.options if o.dest in checked}
    mdef.check(opts, num_tokens, proc)
    spec = DraftingSpec(mdef.name, tuple(sorted(opts.items())), named)
    if mdef.chain and num_tokens is not None and spec.max_depth > num_tokens:   # defaults included (--L 4)
        n = getattr(args, "num_tokens", None)
        raise ValueError(f"{'--num-tokens ' + str(n) if n is not None else 'the image'} is shorter than the "
                         f"{spec.max_depth} drafts per round of {named} (--L, default {spec.max_depth}): a round never "
                         f"drafts past the image; give --L <= {num_tokens}")
    return spec


def add_gsd_table_arg(g) -> None:
    """``--gsd-table``: GSD's distance table (``real.decode.methods.gsd_vectors``)."""
    g.add_argument("--gsd-table", choices=["embedding", "codebook"], default=None,
                   help="GSD's distance table: rows of the target LM's input embedding table for the image tokens, "
                        "distances in bf16 (default, as released), or the raw VQ codebook vectors in float64 (our "
                        "earlier table); a model without an input embedding table uses its codebook")
