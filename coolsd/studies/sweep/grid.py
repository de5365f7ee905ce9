"""The sweep's grid: settings (method + parameters) parsed from ``--grid`` items or a TOML file and
checked against the method registry (``theory.rules.methods``).

Item syntax (one command-line argument each): ``METHOD[:NAME=V1,V2[:NAME=...]]``; the settings are the
cartesian product of the listed values, e.g. ``lantern++:lambda=2,3:resampler=lantern,optimal`` is four
settings. ``ar`` (plain autoregressive decoding) is accepted and always run: it is the speed and quality
baseline, reported apart. TOML (``--grid-file``)::

    grid = ["cool-sd:delta=2,4", "vanilla"]        # items as on the command line, and/or
    [[setting]]
    method = "uniform-rsd"
    c = [1.5, 2.0]
"""
from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass

from theory.core.checks import brief
from theory.rules import methods

__all__ = ["Setting", "parse_item", "parse_grid", "grid_from_toml", "DEFAULT_GRID", "ensure_vanilla"]

# The paper's three comparisons on one set of runs (chain drafting):
#   Figure 3: Cool-SD vs UniformRSD vs LANTERN++ at equal accepted length;
#   Figure 5: exponential (Cool-SD) vs linear decaying schedules;
#   Figure 4: LANTERN++ with its own resampler vs with G*.
DEFAULT_GRID = ("vanilla", "cool-sd:delta=1.5,2,3,4,6,8", "uniform-rsd:c=1.2,1.5,2,3",
                "linear-rsd:first=2,3,4,6,8", "lantern++:lambda=1.5,2,3,5:resampler=lantern,optimal")


@dataclass(frozen=True)
class Setting:
    """One grid point: a registry method and the parameters the grid set (canonical names, typed);
    the rest take the registry's defaults."""
    method: str
    params: tuple            # ((name, value), ...) in the registry's parameter order

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    @property
    def key(self) -> str:
        """Canonical text, e.g. ``cool-sd:delta=2`` (seeds and file names derive from it)."""
        return ":".join([self.method] + [f"{k}={_fmt(v)}" for k, v in self.params])

    @property
    def slug(self) -> str:
        """A file-system name for the key: readable part + 8 hex digits of its hash (unique)."""
        safe = re.sub(r"[^A-Za-z0-9.=_-]+", "_", self.key.replace("+", "p").replace("*", "star"))
        return f"{safe[:60]}-{hashlib.sha256(self.key.encode()).hexdigest()[:8]}"

    @property
    def family(self) -> str:
        """The frontier curve this setting belongs to: the method and every set parameter except the
        method's relaxation parameter (``theory.rules.methods.Method.relaxation``)."""
        relax = methods.get(self.method).relaxation
        rest = [f"{k}={_fmt(v)}" for k, v in self.params if k != relax]
        return " ".join([self.method] + rest)

    def verifier(self, L: int, neighbors=None, embeddings=None):
        """The setting's verifier for draft length L (LANTERN's ``neighbors`` (V, K), GSD's ``embeddings`` (V, d))."""
        return methods.build(self.method, L, neighbors, self.params_dict, embeddings=embeddings)


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse_item(item: str) -> list[Setting]:
    """``METHOD[:NAME=V1,V2[:NAME=...]]`` -> settings (cartesian product), checked against the registry:
    an unknown method or parameter, a bad value or a value out of range is a ValueError naming it."""
    if not isinstance(item, str) or not item.strip():
        raise ValueError(f"grid item must be METHOD[:NAME=V1,V2...], got {item!r}")
    head, *parts = item.strip().split(":")
    m = methods.get(head.strip())                   # unknown method: names it and the choices
    axes: list[tuple[str, list]] = []
    seen = set()
    for part in parts:
        if "=" not in part:
            raise ValueError(f"grid item {item!r}: {part!r} is not NAME=V1,V2,...")
        name, values = part.split("=", 1)
        p = m.param(name.strip())                    # unknown parameter: names it and the method's own
        if p.name in seen:
            raise ValueError(f"grid item {item!r}: parameter {p.name!r} given twice")
        seen.add(p.name)
        vals = [v.strip() for v in values.split(",")]
        if not vals or any(v == "" for v in vals):
            raise ValueError(f"grid item {item!r}: parameter {p.name!r} has an empty value")
        axes.append((p.name, vals))
    return _product(m, axes, item)


def _product(m: methods.Method, axes, where: str) -> list[Setting]:
    out = []
    for combo in itertools.product(*[vals for _, vals in axes]):
        given = dict(zip([n for n, _ in axes], combo))
        full = methods.resolve(m.name, given)        # types, ranges, choices, pinned parameters
        order = [p.name for p in m.params if p.name in given]
        out.append(Setting(m.name, tuple((n, full[n]) for n in order)))
    if not out:
        raise ValueError(f"grid item {where!r} gives no setting")
    return out


def parse_grid(items) -> tuple[list[Setting], bool]:
    """Settings of all items (in order, repeats refused) and whether ``ar`` was listed."""
    settings, ar = [], False
    for item in items:
        if str(item).strip().lower() == "ar":
            ar = True
            continue
        settings += parse_item(item) if isinstance(item, str) else _table(item)
    keys = [s.key for s in settings]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"grid lists the same setting more than once: {dup}")
    return settings, ar


def _table(t: dict) -> list[Setting]:
    if not isinstance(t, dict) or "method" not in t:
        raise ValueError(f"a [[setting]] table needs method = \"NAME\", got {brief(t)}")
    m = methods.get(t["method"])
    axes, seen = [], set()
    for k, v in t.items():
        if k == "method":
            continue
        p = m.param(k)
        if p.name in seen:
            raise ValueError(f"[[setting]] {t['method']}: parameter {p.name!r} given twice")
        seen.add(p.name)
        axes.append((p.name, list(v) if isinstance(v, list) else [v]))
    return _product(m, axes, f"[[setting]] {t['method']}")


def grid_from_toml(path) -> list:
    """Grid items of a TOML file: ``grid = [ITEM, ...]`` and/or ``[[setting]]`` tables (method = NAME,
    other keys = a value or a list of values). Unknown top-level keys are refused."""
    import tomllib

    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as e:
        raise ValueError(f"--grid-file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--grid-file {path}: not valid TOML ({e})") from None
    bad = sorted(set(doc) - {"grid", "setting"})
    if bad:
        raise ValueError(f"--grid-file {path}: unknown key(s) {bad}; use grid = [...] and/or [[setting]] tables")
    items = list(doc.get("grid", [])) + list(doc.get("setting", []))
    if not items:
        raise ValueError(f"--grid-file {path}: no grid items")
    return items


def ensure_vanilla(settings: list[Setting]) -> tuple[list[Setting], bool]:
    """The predictions (T10/T11) come from the vanilla run's recorded rows: vanilla is added first when
    the grid lacks it. Returns (settings, added)."""
    if not isinstance(settings, (list, tuple)) or not all(isinstance(s, Setting) for s in settings):
        raise TypeError(f"ensure_vanilla: settings must be a list of Setting (parse_grid's), got {brief(settings)}")
    if any(s.method == "vanilla" for s in settings):
        return settings, False
    return [Setting("vanilla", ())] + list(settings), True
