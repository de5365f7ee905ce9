"""The method registry: one place mapping a method name to its ``theory.rules`` verifier.

Each entry (``Method``) holds the factory that builds the rule from ``theory.rules``, its typed
parameters (``Param``: type, default, allowed range or choices, the flat option name used on the
command line), whether it needs a codebook neighbour table (LANTERN family), and a display label.
Used by the CLI (``coolsd generate``, ``coolsd theory table``), the demo, the simulator's validation
grid and method comparison, and ``coolsd sweep`` (through ``real.decode.methods``, which adds devices).

Adding a method or a variant is one entry::

    register(Method("my-rule", "My rule", (Param("w", float, 2.0, low=0, low_open=True),),
                    lambda p, L, nb: rules.scaled(rules.Uniform(p["w"]), name="my-rule")))

Parameter names are the rule's own (as in ``Verifier.params``: ``lantern++`` has ``lambda``, which
grids may also spell ``lam``). No torch here: ``theory`` imports nothing of the project but itself.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .. import rules
from ..core.checks import brief as _brief

__all__ = ["Param", "Method", "METHODS", "RESAMPLERS", "TYPICAL_RESAMPLERS", "register", "get", "names", "resolve", "build",
           "flag_owners", "default_lantern_k", "threshold_or_off"]

# LANTERN / LANTERN++ resamplers (docs/theory.md section 6): as released ("lantern", the default), our
# earlier variant ("renormalised") or G* ("optimal", T5); typical acceptance: argmax (vLLM) or G*
RESAMPLERS = rules.LANTERN_RESAMPLERS
TYPICAL_RESAMPLERS = rules.TYPICAL_RESAMPLERS


@dataclass(frozen=True)
class Param:
    """One typed parameter. ``low``/``high`` bound numeric values (open bounds with ``low_open`` /
    ``high_open``); ``choices`` lists the allowed strings; ``default=None`` means "derived" (stated in
    ``help``); ``flag`` is the flat option name shared across methods (``--lantern-k``)."""
    name: str
    type: type
    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    flag: str | None = None
    aliases: tuple = ()
    help: str = ""
    optional: bool = False           # None is an allowed value (derived default)

    @property
    def option(self) -> str:
        return self.flag or self.name

    def check(self, method: str, value):
        """``value`` converted to the parameter's type, or ValueError naming method and parameter."""
        if value is None:
            if self.optional:
                return None
            raise ValueError(f"{method}: parameter {self.name!r} needs a value")
        try:
            if self.type is int:
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                v = int(value)
            elif self.type is float:
                v = float(value)
            elif self.type in (str, bool):
                v = self.type(value)
            else:                        # a parser function (weights_value, threshold_or_off): its own message
                try:
                    v = self.type(value)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"{method}: parameter {self.name!r}: {e}") from None
        except (TypeError, ValueError) as e:
            if str(e).startswith(f"{method}: parameter"):
                raise
            raise ValueError(f"{method}: parameter {self.name!r} must be {self.type.__name__}, got {value!r}") from None
        if self.choices is not None and v not in self.choices:
            raise ValueError(f"{method}: parameter {self.name!r} must be one of {list(self.choices)}, got {v!r}")
        if self.type in (int, float):
            if not math.isfinite(v):
                raise ValueError(f"{method}: parameter {self.name!r} must be finite, got {v!r}")
            if self.type is float and abs(v) > FLOAT32_MAX:   # rules run in float32: inf there, NaN weights after
                raise ValueError(f"{method}: parameter {self.name!r} = {v!r} overflows float32, the compute dtype "
                                 f"(|value| must be <= {FLOAT32_MAX:.4g})")
            if self.type is int and abs(v) > INT_MAX:
                raise ValueError(f"{method}: parameter {self.name!r} = {v!r} is above {INT_MAX} (int64 indices)")
            if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
                raise ValueError(f"{method}: parameter {self.name!r} must be {'>' if self.low_open else '>='} "
                                 f"{self.low:g}, got {v!r}")
            if self.high is not None and (v > self.high or (self.high_open and v == self.high)):
                raise ValueError(f"{method}: parameter {self.name!r} must be {'<' if self.high_open else '<='} "
                                 f"{self.high:g}, got {v!r}")
        return v


FLOAT32_MAX = 3.4028234663852886e38     # the largest float32: a float parameter above it is inf in the rules
INT_MAX = 2**62


@dataclass(frozen=True)
class Method:
    """name -> factory(params: dict, L: int, neighbors (V, K) or None) -> ``rules.Verifier``.
    ``fixed`` are parameters an alias pins (``lantern+G*`` = ``lantern`` with resampler "optimal");
    ``greedy_rows`` marks rules meant for temperature-0 rows (greedy); ``needs_embeddings`` marks rules that
    take the codebook vectors (V, d) (GSD), which ``build`` passes to the factory in place of the table."""
    name: str
    label: str
    params: tuple[Param, ...]
    factory: Callable[[dict, int, Any], rules.Verifier]
    needs_neighbors: bool = False
    needs_embeddings: bool = False
    fixed: Mapping[str, Any] = field(default_factory=dict)
    greedy_rows: bool = False
    help: str = ""
    relaxation: str | None = None    # the parameter that moves the rule along its quality/speed frontier

    def param(self, name: str) -> Param:
        for p in self.params:
            if name == p.name or name in p.aliases:
                return p
        raise ValueError(f"{self.name}: unknown parameter {name!r}; its parameters: "
                         f"{[p.name for p in self.params if p.name not in self.fixed] or 'none'}")

    def verifier(self, L: int, params: Mapping[str, Any], neighbors=None, embeddings=None) -> rules.Verifier:
        """This method's verifier for draft length ``L`` with its RESOLVED parameters ``params`` (``resolve``: every
        parameter, checked); ``neighbors`` (V, K) / ``embeddings`` (V, d) as ``build``."""
        if self.needs_neighbors and neighbors is None:
            raise ValueError(f"method {self.name!r} needs a codebook neighbour table (the model has no VQ codebook "
                             "here)")
        if not (isinstance(L, int) and L >= 1):
            raise ValueError(f"L must be an int >= 1, got {_brief(L)}")
        return self.factory(params, L, embeddings if self.needs_embeddings else neighbors)

    @property
    def free(self) -> tuple[Param, ...]:
        """The parameters a user may set (not pinned by ``fixed``)."""
        return tuple(p for p in self.params if p.name not in self.fixed)


METHODS: dict[str, Method] = {}
ALIASES = {"lantern+gstar": "lantern+G*", "gsd+gstar": "gsd+G*"}      # other spellings of a registered name (lower case)


def register(m: Method) -> Method:
    key = m.name.lower()
    if key in METHODS:
        raise ValueError(f"method {m.name!r} is already registered")
    METHODS[key] = m
    return m


def names() -> tuple[str, ...]:
    return tuple(m.name for m in METHODS.values())


def get(name: str) -> Method:
    key = str(name).lower()
    m = METHODS.get(ALIASES.get(key, key).lower())
    if m is None:
        raise ValueError(f"unknown method {name!r}; choose from {list(names())}")
    return m


def resolve(name: str, params: Mapping[str, Any] | None = None) -> dict:
    """The full, checked parameter dict of ``name``: defaults, then ``params`` (canonical names or
    aliases), then the pinned ones. An unknown parameter or a value out of range is a ValueError naming it."""
    m = get(name)
    out = {p.name: p.default for p in m.params}
    for k, v in (params or {}).items():
        p = m.param(k)
        if p.name in m.fixed and v != m.fixed[p.name]:
            raise ValueError(f"{m.name}: parameter {p.name!r} is fixed to {m.fixed[p.name]!r} by this method")
        out[p.name] = v
    out.update(m.fixed)
    return {p.name: p.check(m.name, out[p.name]) for p in m.params}


def build(name: str, L: int, neighbors=None, params: Mapping[str, Any] | None = None, *, embeddings=None,
          **kw) -> rules.Verifier:
    """The verifier of method ``name`` with parameters ``params`` / ``kw`` (defaults for the rest) for
    draft length ``L``; ``neighbors`` (V, K) the codebook neighbour table (numpy or torch, LANTERN family);
    ``embeddings`` (V, d) the codebook vectors (numpy or torch, GSD's distance test). The parameters resolved
    (``resolve``), then ``Method.verifier``."""
    return get(name).verifier(L, resolve(name, {**(params or {}), **kw}), neighbors, embeddings)


def flag_owners() -> dict[str, list[tuple[Method, Param]]]:
    """The flat option names of every method's free parameters (the ``coolsd generate`` flags) -> the (method,
    parameter) pairs that read each: namespaced per method, so a flag two methods share (``--resampler``, ``--delta``)
    is converted by the selected method's own parameter (its type, range, choices and default), never another's
    (``coolsd.options.method_params``)."""
    out: dict[str, list[tuple[Method, Param]]] = {}
    for m in METHODS.values():
        for p in m.free:
            out.setdefault(p.option, []).append((m, p))
    return out


def default_lantern_k(V: int) -> int:
    """LANTERN's k = 1000 neighbours of 16384 codes (about V/16), capped at 1000."""
    return int(min(1000, max(1, V // 16)))


# --------------------------------------------------------------------------- the entries

def _lantern(p: dict, L: int, nb) -> rules.Verifier:
    V, K = nb.shape
    k = p["k"] if p["k"] is not None else default_lantern_k(V)
    need = k if p["resampler"] == "optimal" else k + 1      # LANTERN's resamplers zero k + 1 neighbours
    name = "lantern" if "delta" in p else "lantern++"
    if need > K:
        raise ValueError(f"{name}: k={k} needs {need} neighbours per code, the table has {K}")
    if "delta" in p:
        return rules.lantern(nb, k, p["delta"], resample=p["resampler"])
    return rules.lantern_pp(nb, k, p["lambda"], resample=p["resampler"])


_K = Param("k", int, None, low=1, flag="lantern_k", optional=True,
           help="neighbourhood size k (default ~V/16, <= 1000, as LANTERN's 1000 of 16384)")
_RES = Param("resampler", str, "lantern", choices=RESAMPLERS, flag="resampler",
             help="LANTERN/LANTERN++ resampling after a rejection: as released (lantern), our earlier variant "
                  "(renormalised: neighbourhood always removed, draft row renormalised) or G* (optimal)")
_LANTERN_DELTA = Param("delta", float, 0.2, low=0, flag="lantern_delta", help="LANTERN absolute mass threshold")

register(Method("vanilla", "vanilla SD", (), lambda p, L, nb: rules.vanilla(), help="lossless speculative decoding (T1)"))
register(Method("cool-sd", "Cool-SD", (
    Param("delta", float, 2.0, low=0, low_open=True, help="Cool-SD relaxation budget delta (w_1 = delta)"),
    Param("nu", float, 0.7, low=0, help="Cool-SD decay nu (>= 0: a decaying schedule)"),
    Param("mu", float, None, optional=True,
          help="Cool-SD explicit offset mu: w_i = delta exp(-nu i - mu) (default: the normalisation --cool-sd-norm)"),
    Param("norm", str, None, choices=rules.COOL_SD_NORMS, flag="cool_sd_norm", optional=True,
          help=f"Cool-SD normalisation of the schedule (docs/theory.md section 5; default {rules.COOL_SD_NORM}: "
               "w_i = 1 + (delta - 1) exp(-nu (i - 1)))")),
    lambda p, L, nb: rules.cool_sd(p["delta"], p["nu"], p["mu"], norm=p["norm"], L=L),
    help="exponentially decaying weights, G* (T5)", relaxation="delta"))
register(Method("uniform-rsd", "UniformRSD", (
    Param("c", float, 1.5, low=0, low_open=True, help="UniformRSD weight c"),),
    lambda p, L, nb: rules.uniform_rsd(p["c"]), help="constant weight c, G* (T5)", relaxation="c"))
register(Method("linear-rsd", "linear RSD", (
    Param("first", float, 3.0, low=0, low_open=True, flag="linear_first", help="linear schedule w_1"),
    Param("last", float, 1.0, low=0, low_open=True, flag="linear_last", help="linear schedule w_L")),
    lambda p, L, nb: rules.linear_rsd(p["first"], p["last"], L), help="linearly decaying weights, G* (T5)", relaxation="first"))
register(Method("lantern", "LANTERN", (_K, _LANTERN_DELTA, _RES), _lantern, needs_neighbors=True,
                help="latent-neighbourhood acceptance, absolute delta (section 6)", relaxation="delta"))
register(Method("lantern++", "LANTERN++", (
    _K, Param("lambda", float, 2.0, low=1, flag="lam", aliases=("lam",), help="LANTERN++ relative threshold lambda"),
    _RES), _lantern, needs_neighbors=True, help="latent-neighbourhood acceptance, relative lambda (section 6)",
                relaxation="lambda"))
register(Method("lantern+G*", "LANTERN+G*", (_K, _LANTERN_DELTA, _RES), _lantern, needs_neighbors=True,
                fixed={"resampler": "optimal"}, help="LANTERN's acceptance with the G* resampler (T5)",
                relaxation="delta"))
register(Method("typical", "typical acceptance", (
    Param("eps", float, 0.09, low=0, help="typical acceptance epsilon"),
    Param("alpha", float, 0.3, low=0, help="typical acceptance alpha"),
    Param("resampler", str, "argmax", choices=TYPICAL_RESAMPLERS, flag="resampler",
          help="correction after a rejection: argmax p (as vLLM's release) or G*")),
    lambda p, L, nb: rules.typical(p["eps"], p["alpha"], resample=p["resampler"]),
    help="typical acceptance as vLLM / Medusa release it (entropy with +1e-5, argmax correction)", relaxation="eps"))
def threshold_or_off(spec) -> float:
    """GSD's distance threshold: a number > 0, or "off" / "none" / "inf" (inf: no distance test)."""
    if isinstance(spec, str) and spec.strip().lower() in ("off", "none", "inf"):
        return math.inf
    try:
        v = float(spec)
    except (TypeError, ValueError):
        raise ValueError(f"need a number > 0 or 'off', got {spec!r}") from None
    if not (v > 0):                                           # also refuses NaN
        raise ValueError(f"need a number > 0 or 'off', got {spec!r}")
    return v


def _gsd(p: dict, L: int, embeddings) -> rules.Verifier:
    off = math.isinf(p["d_threshold"])
    if not off and embeddings is None:
        raise ValueError(f"gsd: the embedding-distance test (--gsd-d-threshold {p['d_threshold']:g}) needs the codebook "
                         "vectors (embeddings, V x d); the model has none here: give them, or --gsd-d-threshold off")
    return rules.gsd(None if off else embeddings, window=p["window"], p_threshold=p["p_threshold"],
                     d_threshold=None if off else p["d_threshold"], resample=p["resampler"])


_GSD_PARAMS = (
    Param("window", int, rules.GSD_WINDOW, low=0, flag="gsd_window",
          help="GSD rank window: sorted positions [r - w, r + w) around the draft's rank r (as released: 7)"),
    Param("p_threshold", float, rules.GSD_P_THRESHOLD, low=0, low_open=True, flag="gsd_p_threshold",
          help="GSD probability test |p(y) - p(x)| < threshold (as released: 0.15)"),
    Param("d_threshold", threshold_or_off, rules.GSD_D_THRESHOLD, flag="gsd_d_threshold",
          help="GSD squared embedding distance < threshold (as released: 0.5), or off"),
    Param("resampler", str, "residual", choices=rules.GSD_RESAMPLERS, flag="resampler",
          help="GSD after a rejection: the vanilla residual Norm([p - q]_+) (residual, as released) or G* (optimal)"))
register(Method("gsd", "GSD", _GSD_PARAMS, _gsd, needs_embeddings=True, relaxation="p_threshold",
                help="grouped acceptance min(1, P(G)/Q(G)) over the draft's rank/probability/embedding group "
                     "(section 6b), vanilla residual, as released"))
register(Method("gsd+G*", "GSD+G*", _GSD_PARAMS, _gsd, needs_embeddings=True, fixed={"resampler": "optimal"},
                relaxation="p_threshold", help="GSD's grouped acceptance with the G* resampler (T5)"))


def _schedule_file(spec, what: str, writer: str):
    """The JSON held by the file ``spec`` names (a schedule written by ``writer``), or None when ``spec`` names no
    existing file; a file that is not JSON is a one-line ValueError starting with ``what``."""
    import os

    from theory.core.files import input_file

    if not (isinstance(spec, str) and os.path.lexists(spec)):
        return None
    # a FIFO / device refused unopened, the size bounded, the JSON parsed: one line (theory.core.files)
    return input_file(what, spec, "json", hint=f"write a schedule with {writer}")


def weights_value(spec) -> tuple:
    """Weights w_1..w_L of the ``scaled`` method: a sequence, comma-separated numbers ("3,1.2,1,1") or the
    path of a schedule.json written by ``coolsd tune`` (key "weights")."""
    if (d := _schedule_file(spec, "weights", "coolsd tune")) is not None:
        if isinstance(d, dict) and "weights" not in d and "levels" in d:
            raise ValueError(f"weights: {spec} holds a 'level' schedule (coolsd tune --family level); running level "
                             "rules as a method is not implemented: tune with --family free, exponential, linear or "
                             "uniform for --method scaled")
        if isinstance(d, dict) and d.get("rule") == "row-scaled":
            raise ValueError(f"weights: {spec} holds a row-conditioned schedule (its weights depend on the target row): "
                             f"run it with --method row-scaled --schedule {spec}")
        spec = d.get("weights") if isinstance(d, dict) else d
    if isinstance(spec, str):
        try:
            spec = [float(x) for x in spec.split(",")]
        except ValueError:
            raise ValueError(f"weights must be a schedule.json path or comma-separated numbers, got {spec!r}") from None
    try:
        w = tuple(float(x) for x in spec)
    except (TypeError, ValueError):
        raise ValueError(f"weights: need a list of numbers, got {spec!r}") from None
    if not w or not all(math.isfinite(x) and 0 < x <= FLOAT32_MAX for x in w):
        raise ValueError(f"weights: need a non-empty list of finite weights > 0 (<= {FLOAT32_MAX:.4g}, float32), "
                         f"got {spec!r}")
    return w


def _scaled(p: dict, L: int, nb) -> rules.Verifier:
    if len(p["weights"]) != L:
        raise ValueError(f"scaled: {len(p['weights'])} weights given for draft length L={L}")
    return rules.scaled(rules.Explicit(p["weights"]))


register(Method("scaled", "scaled (explicit weights)", (
    Param("weights", weights_value, None, help="w_1..w_L: a schedule.json from coolsd tune, or 3,1.2,1,1"),),
    _scaled, help="explicit per-position weights min(1, w_i p/q), G* (T5): the schedules of coolsd tune"))


@dataclasses.dataclass(frozen=True)
class RowSchedule:
    """The parameters of the ``row-scaled`` method: c_1..c_L (``weights``), the slope b and the row feature."""
    weights: tuple
    slope: float = 0.0
    feature: str = "entropy"


def row_schedule_value(spec) -> RowSchedule:
    """The ``row-scaled`` method's schedule (docs/theory.md section 8c): the path of a schedule.json written by
    ``coolsd tune --family entropy|maxp`` (keys "weights", "slope", "feature"), a dict with those keys, or inline
    "FEATURE:SLOPE:W1,W2,..." (e.g. "entropy:0.5:2,1.2,1,1")."""
    if isinstance(spec, RowSchedule):
        return spec
    if (d := _schedule_file(spec, "schedule", "coolsd tune --family entropy")) is not None:
        spec = d
        if not isinstance(spec, dict) or "slope" not in spec or "weights" not in spec:
            raise ValueError("schedule: the file holds no row-conditioned schedule (keys 'weights', 'slope', 'feature'; "
                             "coolsd tune --family entropy or maxp writes one); a scalar schedule runs with --method "
                             "scaled --weights")
    elif isinstance(spec, str):
        parts = spec.split(":")
        if len(parts) != 3:
            raise ValueError(f"schedule must be a schedule.json path or FEATURE:SLOPE:W1,W2,..., got {spec!r}")
        spec = {"feature": parts[0], "slope": parts[1], "weights": parts[2]}
    if not isinstance(spec, dict):
        raise ValueError(f"schedule: need a schedule.json path, a dict or FEATURE:SLOPE:W1,W2,..., got {spec!r}")
    feature = spec.get("feature", "entropy")
    if feature not in rules.ROW_FEATURES:
        raise ValueError(f"schedule: feature must be one of {list(rules.ROW_FEATURES)}, got {feature!r}")
    try:
        slope = float(spec["slope"])
    except (TypeError, ValueError):
        raise ValueError(f"schedule: slope must be a number, got {spec['slope']!r}") from None
    if not math.isfinite(slope):
        raise ValueError(f"schedule: slope must be finite, got {slope!r}")
    return RowSchedule(weights_value(spec["weights"]), slope, feature)


def _row_scaled(p: dict, L: int, nb) -> rules.Verifier:
    s = p["schedule"] or RowSchedule((1.0,) * L)          # unset: c_i = 1, b = 0 (vanilla's law)
    if len(s.weights) != L:
        raise ValueError(f"row-scaled: {len(s.weights)} weights given for draft length L={L}")
    return rules.row_scaled(rules.Explicit(s.weights), s.slope, s.feature)


register(Method("row-scaled", "row-conditioned scaled", (
    Param("schedule", row_schedule_value, None, flag="schedule", optional=True,
          help="row-scaled: a schedule.json from coolsd tune --family entropy|maxp, or FEATURE:SLOPE:W1,... "
               "(unset: c_i = 1, b = 0, vanilla's law)"),),
    _row_scaled, help="min(1, c_i exp(b phi(p)) p/q), phi the target row's entropy or max probability, G* (T5): "
                      "the row-conditioned schedules of coolsd tune"))
register(Method("greedy", "greedy", (), lambda p, L, nb: rules.greedy(), greedy_rows=True,
                help="accept iff the draft is the target's argmax (temperature 0)"))
