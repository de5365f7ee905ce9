"""The one parser of drafting and method options, shared by ``coolsd generate`` and ``coolsd sweep``.

Drafting: ``--L``, ``--tree`` (eagle25, eagle57, chain, JSON paths, or dynamic), ``--tree-candidates``, the dynamic
tree's ``--tree-total/-depth/-topk/-sampling``, and a drafter-free mode by ``--draft NAME`` (``jacobi``: ``--window
--jacobi-init --coupling``; ``sjd-pac`` / ``sjd-pac-p``: ``--window --pac-width --pac-depth``). Every flag defaults to
None, so "given" is one fact (``given``); the defaults come from the modes themselves (``real.decode.modes``:
``DEFAULT_L``, ``DynamicTree()``, ``Jacobi()``, ``SJDPAC()``). A flag that does not apply to the drafting asked for is
refused, in both commands, before any work.

``drafting_spec(args)`` -> ``DraftingSpec`` (a plain, JSON-ready value: the sweep stores it in its identity);
``spec.build(bundle)`` -> the ``real.protocol.Drafting`` mode for the built model (the row width of a Jacobi window
from the model's grid).

Methods: the registry's flags (``theory.rules.methods.flags``) are namespaced per method: every flag is parsed as
text, and ``method_params(args, method)`` converts the ones given by THAT method's own parameter (its type, range and
default); a flag another method owns is refused, naming the method's own flags.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["DraftingSpec", "add_drafting_args", "add_method_args", "drafting_spec", "method_params", "given", "flag",
           "DYNAMIC_FLAGS", "FREE_FLAGS"]

DYNAMIC_FLAGS = ("tree_total", "tree_depth", "tree_topk", "tree_sampling")
FREE_FLAGS = ("window", "jacobi_init", "coupling", "pac_width", "pac_depth")   # the drafter-free modes' options
_FREE_KEYS = {"window": "window", "jacobi_init": "init", "coupling": "coupling", "pac_width": "tree_width",
              "pac_depth": "tree_depth"}
PAC_FLAGS = ("pac_width", "pac_depth")                     # SJD-PAC's proactive tree
_PAC_MODES = ("sjd-pac", "sjd-pac-p")
# the flags each drafter-free mode reads (a mode registered by a user reads the Jacobi window's)
MODE_FLAGS = {**{m: ("window", *PAC_FLAGS) for m in _PAC_MODES}}
_JACOBI_FLAGS = ("window", "jacobi_init", "coupling")


def flag(dest: str) -> str:
    """The command-line spelling of an argparse dest."""
    return "--" + dest.replace("_", "-")


def given(args, dest: str) -> bool:
    """Whether option ``dest`` was given: not None and not False (an empty list IS given, and refused where it must
    not be empty; the same rule as ``real.specs.given``)."""
    v = getattr(args, dest, None)
    return v is not None and v is not False


def add_drafting_args(p) -> None:
    """The drafting flags (module docstring), all defaulting to None."""
    from real.decode.jacobi import SCD_WINDOW
    from real.decode.modes import DEFAULT_L, SJDPAC, DynamicTree, Jacobi

    d, j, pac = DynamicTree(), Jacobi(), SJDPAC()
    g = p.add_argument_group("drafting (real.decode.modes; chains by default)")
    g.add_argument("--L", type=int, default=None, help=f"chain drafts per round (default {DEFAULT_L})")
    g.add_argument("--tree", default=None,
                   help="static draft tree (EAGLE-1 / LANTERN++ setting): eagle25, eagle57, chain (the chain of --L "
                        "drafts run by the tree engine) or a JSON list of paths of child ranks, e.g. '[[0],[1],[0,0]]'; "
                        "or dynamic (EAGLE-2 dynamic trees, the LANTERN release's default: --tree-total/-depth/-topk)")
    g.add_argument("--tree-candidates", default=None, choices=["sampled", "topk"],
                   help="static trees: a node's children drawn without replacement (sampled, default) or its top-m "
                        "tokens (topk, as the EAGLE-1 / LANTERN++ releases, verified with qx = 1)")
    g.add_argument("--tree-total", type=int, default=None,
                   help=f"--tree dynamic: nodes per target call, root included (default {d.total}, the release's)")
    g.add_argument("--tree-depth", type=int, default=None,
                   help=f"--tree dynamic: expansion levels; nodes reach depth + 1 (default {d.depth})")
    g.add_argument("--tree-topk", type=int, default=None, help=f"--tree dynamic: children per node (default {d.topk})")
    g.add_argument("--tree-sampling", choices=["lossless", "release"], default=None,
                   help="--tree dynamic: lossless (default: stochastic-beam-search keys, candidates verified with their "
                        "draft law) or release (top-k candidates verified with qx = 1, as the EAGLE-2 / LANTERN release)")
    g.add_argument("--window", type=int, default=None,
                   help=f"--draft jacobi / sjd-pac / sjd-pac-p: target rows per call W (jacobi: W - 1 Jacobi drafts; "
                        f"default {j.window}, the SJD release's, or {SCD_WINDOW} with a --coupling, the SCD release's; "
                        f"sjd-pac: the proactive tree and its chain, default {pac.window} as released, may exceed the image)")
    g.add_argument("--jacobi-init", default=None, choices=["random", "repeat_horizon", "sample_horizon"],
                   help="--draft jacobi: initialisation of new window slots, as the SJD release's schemes (default random)")
    g.add_argument("--coupling", default=None, choices=["none", "scd-mc", "scd-mc-p", "scd-gs"],
                   help="--draft jacobi: couple consecutive iterations' drafts (SCD): scd-mc maximal coupling as "
                        "released (not lossless), scd-mc-p the same with the current rows as q (lossless), scd-gs Gumbel "
                        "coupling (default none: plain SJD)")
    g.add_argument("--pac-width", type=int, default=None,
                   help=f"--draft sjd-pac / sjd-pac-p: the proactive tree's branching K (the release's tree_width; "
                        f"default {pac.tree_width})")
    g.add_argument("--pac-depth", type=int, default=None,
                   help=f"--draft sjd-pac / sjd-pac-p: the proactive tree's depth D, root included (the release's "
                        f"tree_depth; default {pac.tree_depth}); the tree's (K^D - 1) / (K - 1) nodes must fit the window")


def add_method_args(p) -> None:
    """The verifier flags of every registry method, parsed as text (``method_params`` converts them per method)."""
    from theory.rules import methods as registry

    g = p.add_argument_group("verifier parameters (theory.rules.methods; each method reads its own, default: the "
                             "method's)")
    for dest, owners in registry.flag_owners().items():
        g.add_argument(flag(dest), dest=dest, default=None, metavar="V",
                       help="; ".join(f"{m.name}: {prm.help or prm.name} (default "
                                      f"{prm.default if prm.default is not None else 'derived'})" for m, prm in owners))


def method_params(args, method: str) -> dict:
    """The registry parameters of ``method`` given as flags in ``args``, converted and range-checked by the method's
    own ``Param`` (ValueError naming the flag); a flag the method does not read is refused with its own flags."""
    from theory.rules import methods as registry

    m = registry.get(method)
    own = {p.option: p for p in m.free}
    other = sorted(f for f in registry.flag_owners() if given(args, f) and f not in own)
    if other:
        raise ValueError(f"{', '.join(flag(f) for f in other)} do(es) not apply to method {m.name} (its options: "
                         f"{sorted(flag(f) for f in own) or 'none'})")
    out = {}
    for f, prm in own.items():
        if given(args, f):
            try:
                out[prm.name] = prm.check(m.name, getattr(args, f))
            except ValueError as e:
                raise ValueError(f"{flag(f)}: {e}") from None
    return out


@dataclass(frozen=True)
class DraftingSpec:
    """Drafting options parsed and checked before any model is built: ``kind`` "chain", "tree", "dynamic" or a
    registered drafter-free mode's name (``real.decode.modes.DRAFTER_FREE``); ``L`` (chains); ``tree`` (the --tree
    text) and ``candidates`` (static trees); ``dynamic`` (total, depth, topk, sampling); ``free`` (the drafter-free
    mode's options)."""
    kind: str = "chain"
    L: int | None = None
    tree: str | None = None
    candidates: str = "sampled"
    dynamic: tuple | None = None
    free: dict = field(default_factory=dict)

    @property
    def max_depth(self) -> int:
        """The most drafted levels per round (the verifiers' L)."""
        from real.decode import modes

        if self.kind == "chain":
            return int(self.L)
        if self.kind == "dynamic":
            return modes.DynamicTree(*self.dynamic).max_depth
        if self.kind == "tree":
            from theory.tree import parse_tree

            return parse_tree(self.tree, self.L or modes.DEFAULT_L).depth
        return modes.get(self.kind, self.free).max_depth

    def identity(self) -> dict:
        """What a stored sweep unit must match (plain JSON)."""
        return {"kind": self.kind, "L": self.L, "tree": self.tree, "candidates": self.candidates,
                "dynamic": None if self.dynamic is None else list(self.dynamic), "free": dict(sorted(self.free.items()))}

    def build(self, bundle=None, model: str | None = None):
        """The drafting mode for a built model (``bundle``: a ``real.registry.Bundle``; its grid gives a Jacobi
        window's row width and its image length bounds the window; ``model``: its registry name, whose spec may set
        the SJD release's plain tail, ``real.specs.ModelSpec.sjd_schedule``)."""
        from real.decode import modes
        from theory.tree import parse_tree

        if self.kind == "chain":
            return modes.Chain(int(self.L))
        if self.kind == "tree":
            return modes.StaticTree(parse_tree(self.tree, self.L or modes.DEFAULT_L), self.candidates)
        if self.kind == "dynamic":
            return modes.DynamicTree(*self.dynamic)
        opts = dict(self.free)
        if bundle is not None:
            grid = (bundle.info or {}).get("grid")
            T = int(bundle.num_tokens)
            opts["width"] = int(grid[1]) if grid else (math.isqrt(T) if math.isqrt(T) ** 2 == T else None)
            if opts.get("window", 0) > T and self.kind not in _PAC_MODES:
                raise ValueError(f"--window {opts['window']} is larger than the image ({T} tokens)")
            if opts.get("init", "random") != "random" and opts["width"] is None:
                raise ValueError(f"--jacobi-init {opts['init']} needs the image row width; --model's images have no "
                                 "known grid")
            if self.kind == "jacobi" and model is not None:
                from real.specs import spec as model_spec

                if model_spec(model).sjd_schedule == "lumina":    # SJD / SCD on Lumina-mGPT: the last codes plainly
                    from real.adapters.chameleon import sjd_plain_tail

                    opts["plain_tail"] = sjd_plain_tail(bundle.target.layout)
        return modes.get(self.kind, opts)


def drafting_spec(args, num_tokens: int | None = None) -> DraftingSpec:
    """The drafting options of ``args`` checked (ranges, flags that do not apply, combinations) into a
    ``DraftingSpec``; ``num_tokens`` (when known before building) bounds --L and --window. ValueError naming the flag."""
    from theory.core import checks
    from real.decode import modes
    from theory.tree import parse_tree

    draft = getattr(args, "draft", None)
    free = draft is not None and str(draft).lower() in modes.DRAFTER_FREE
    pac = str(draft).lower() in _PAC_MODES          # SJD-PAC's window may exceed the image (its tree is cut there)
    if str(getattr(args, "method", "")).lower() == "ar":
        wrong = [flag(d) for d in ("L", "tree", "tree_candidates", *DYNAMIC_FLAGS) if given(args, d)]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} configure{'s' if len(wrong) == 1 else ''} drafting; --method ar "
                             "drafts nothing: give a speculative --method (e.g. vanilla)")
    for d in ("L", "tree_total", "tree_depth", "tree_topk", "window", *PAC_FLAGS):
        if given(args, d):
            v = checks.integer(flag(d), getattr(args, d), lo=1)
            if d in ("L", "window") and num_tokens and v > num_tokens and not (d == "window" and pac):
                raise ValueError(f"{flag(d)} {v} is larger than the image ({num_tokens} tokens; a round never drafts "
                                 f"past it): use {flag(d)} <= {num_tokens}")
    tree = getattr(args, "tree", None)
    dynamic = tree is not None and tree.strip().lower() == "dynamic"
    wrong = [flag(d) for d in DYNAMIC_FLAGS if given(args, d)] if not dynamic else []
    if wrong:
        raise ValueError(f"{', '.join(wrong)} configure{'s' if len(wrong) == 1 else ''} dynamic trees: add --tree dynamic")
    if given(args, "tree_candidates") and (tree is None or dynamic):
        raise ValueError("--tree-candidates configures static trees: add --tree eagle25 (or another static tree)")
    if not free:
        wrong = [flag(d) for d in PAC_FLAGS if given(args, d)]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} configure{'s' if len(wrong) == 1 else ''} SJD-PAC's proactive tree, a "
                             "Jacobi-family draft: add --draft sjd-pac (or sjd-pac-p)")
        wrong = [flag(d) for d in FREE_FLAGS if given(args, d)]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} configure{'s' if len(wrong) == 1 else ''} Jacobi drafting: add --draft "
                             "jacobi")
    if free:
        for d in ("L", "tree"):
            if given(args, d):
                raise ValueError(f"--draft {draft} sets its draft length with --window, not {flag(d)}")
        if str(getattr(args, "method", "")).lower() == "ar":
            raise ValueError(f"--draft {draft} needs a speculative method (not ar)")
        own = MODE_FLAGS.get(str(draft).lower(), _JACOBI_FLAGS)
        wrong = [flag(d) for d in FREE_FLAGS if given(args, d) and d not in own]
        if wrong:
            hint = ("SJD-PAC's proactive tree: use --draft sjd-pac (or sjd-pac-p)" if set(wrong) <= {flag(d) for d in PAC_FLAGS}
                    else "Jacobi windows (SJD / SCD): use --draft jacobi")
            raise ValueError(f"{', '.join(wrong)} do(es) not apply to --draft {draft} (its options: "
                             f"{', '.join(flag(d) for d in own)}); {', '.join(wrong)} configure(s) {hint}")
        opts = {_FREE_KEYS[d]: getattr(args, d) for d in FREE_FLAGS if given(args, d)}
        spec = DraftingSpec(str(draft).lower(), free=opts)
        mode = modes.get(spec.kind, opts)
        mode.check(None, None, num_tokens or 1 << 30, None, _processing_of(args), 1)   # the mode's own checks
        return spec
    if dynamic:
        if given(args, "L"):
            raise ValueError("--tree dynamic sets its depth with --tree-depth, not --L")
        base = modes.DynamicTree()
        vals = tuple(getattr(args, d) if given(args, d) else getattr(base, d.replace("tree_", ""))
                     for d in DYNAMIC_FLAGS)
        modes.DynamicTree(*vals)            # its own checks (total within the pool, ...)
        return DraftingSpec("dynamic", dynamic=vals)
    if tree is not None:
        parse_tree(tree, args.L or modes.DEFAULT_L)
        if tree.strip().lower() != "chain" and given(args, "L"):
            raise ValueError("--L sets chain drafts; --tree sets the depth (give one of them, or --tree chain --L N)")
        return DraftingSpec("tree", L=args.L, tree=tree, candidates=getattr(args, "tree_candidates", None) or "sampled")
    return DraftingSpec("chain", L=args.L if given(args, "L") else modes.DEFAULT_L)


def _processing_of(args):
    """The processing the command will run with, as far as the drafting checks need it (greedy or not): greedy
    methods run at temperature 0 (``real.decode.methods.method_processing``)."""
    from real.decode.sampling import Processing
    from theory.rules import methods as registry

    method = str(getattr(args, "method", "vanilla") or "vanilla").lower()
    greedy = method != "ar" and method in {m.lower() for m in registry.names()} and registry.get(method).greedy_rows
    t = getattr(args, "temperature", 1.0)
    return Processing(temperature=0.0 if greedy or t == 0 else 1.0)


def add_gsd_table_arg(g) -> None:
    """``--gsd-table``: GSD's distance table (``real.decode.methods.gsd_vectors``)."""
    g.add_argument("--gsd-table", choices=["embedding", "codebook"], default=None,
                   help="GSD's distance table: rows of the target LM's input embedding table for the image tokens, "
                        "distances in bf16 (default, as released), or the raw VQ codebook vectors in float64 (our "
                        "earlier table); a model without an input embedding table uses its codebook")
