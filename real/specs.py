"""What each registered model accepts, in one place: its options, draft kinds, codebook, batching and
sampling defaults (issue 24, "one model spec"). ``real.registry`` refuses a model without a spec; the CLI
(``coolsd generate`` / ``coolsd sweep``: their model arguments are made from ``OPTIONS``), the sweep and
the model table of docs/guide/models.md (``markdown_table``; tests/test_specs.py checks the page against it) read it.

* ``OPTIONS``: every model-specific option (dest name -> :class:`Option`: type, help, choices, which
  draft kind it belongs to, which option it configures). Options not listed here (device, dtype, seed,
  num_images, num_tokens, draft_layers, neighbors_k, lantern_neighbors) apply to every model.
* ``SPECS``: model name -> :class:`ModelSpec`.
* :func:`check_options` is the one generic check: an option a model does not read, an unknown draft
  kind, a value outside its choices, a missing or conflicting option (the spec's :class:`Rule` s) is a
  ValueError naming the flag, before anything is built. ``real.registry.build`` runs it too, so the
  Python API refuses the same inputs.

Adding an option: add an ``Option`` to ``OPTIONS`` (the CLI flag ``--name-with-dashes`` appears in
``coolsd generate`` and ``coolsd sweep`` by itself), add its dest to the ``options`` of the models
that read it, and a field to ``real.registry.BuildOptions`` when the builders take it. Adding a model:
a ``ModelSpec`` in ``SPECS`` (or ``register(name, builder, help, spec=ModelSpec(...))``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["Option", "Rule", "ModelSpec", "OPTIONS", "SPECS", "DRAFT_KINDS", "universal_drafts", "CODEBOOKS", "spec",
           "flag", "given", "check_options", "resolved", "attach", "prepare", "conditions_of", "model_facts",
           "markdown_table"]

DRAFT_KINDS = ("layerskip", "small", "eagle")
def universal_drafts() -> tuple:
    """Draft kinds every model takes: the drafter-free modes of ``real.decode.modes`` (Jacobi; any a user registers)."""
    from real.decode.modes import DRAFTER_FREE

    return tuple(DRAFTER_FREE)
CODEBOOKS = ("own", "vq", "none")     # a codebook of its own / only with --vq-ckpt / none (text LMs)


def _names(module: str, attr: str) -> Callable[[], tuple]:
    """Choices read lazily from ``module.attr`` (a tuple or the keys of a dict): one place for the names."""
    return lambda: tuple(getattr(importlib.import_module(module), attr))


@dataclass(frozen=True)
class Option:
    """A model option. ``type``: int, str or list (of str; nargs '*'); ``kind``: "file" / "dir" (an input
    path, checked before work by the CLI) or None; ``choices``: a tuple or a callable returning one;
    ``kind`` "path": a file or a directory; ``draft``: the draft kind it belongs to (given with another kind it is refused); ``needs``: the
    option it configures (refused without it)."""
    dest: str
    type: type = str
    help: str = ""
    choices: tuple | Callable[[], tuple] | None = None
    kind: str | None = None
    draft: str | None = None
    needs: str | None = None

    def allowed(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices


OPTIONS: dict[str, Option] = {o.dest: o for o in (
    Option("draft", str, "draft kind: layerskip, small, eagle (model-dependent default), or a drafter-free mode (any "
                         "model: jacobi, Speculative Jacobi Decoding, real.decode.jacobi)",
           lambda: DRAFT_KINDS + universal_drafts()),
    Option("class_id", int, "c2i class (default: seeded random per image)"),
    Option("model_type", str, "llamagen: c2i (default) or t2i", ("c2i", "t2i")),
    Option("image_size", int, "image side in pixels (a multiple of 16; default: the model's)"),
    Option("target_ckpt", str, "target checkpoint file", kind="file"),
    Option("target_size", str, "B, L, XL, XXL (default XL)", _names("real.models.llamagen", "CONFIGS")),
    Option("target_pretrained", str, "download a published checkpoint (real.models.llamagen_io.PRETRAINED; "
                                     "transformers models: a hub id or local directory)"),
    Option("draft_ckpt", str, "small-draft checkpoint file", kind="file", draft="small"),
    Option("draft_size", str, "B, L, XL, XXL (default B)", _names("real.models.llamagen", "CONFIGS"), draft="small"),
    Option("draft_pretrained", str, "published small-draft checkpoint", draft="small"),
    Option("drafter_dir", str, "EAGLE drafter directory (LANTERN release layout)", kind="dir", draft="eagle"),
    Option("vq_ckpt", str, "VQ tokenizer checkpoint (LANTERN's codebook, decoded images; lumina-mgpt: "
                            "the Chameleon tokenizer directory)", kind="path"),
    Option("vq_size", str, "VQ config: VQ-16 (default), VQ-8, tiny", _names("real.models.vq", "VQ_CONFIGS"),
           needs="vq_ckpt"),
    Option("captions", str, "t2i: .pt list of {'embedding': (120, 2048), 'mask': (120,)}", kind="file"),
    Option("prompts", list, "t2i / multimodal prompts"),
)}


@dataclass(frozen=True)
class Rule:
    """A cross-option constraint of one model. When every ``when`` option (dest -> allowed values; the
    model's defaults fill unset ones) holds: each group of ``need`` has one option given, the options of
    ``refuse`` are not given, and each group of ``exclusive`` has at most one given."""
    when: Mapping[str, tuple] = field(default_factory=dict)
    need: tuple[tuple[str, ...], ...] = ()
    refuse: tuple[str, ...] = ()
    exclusive: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    """One registered model. ``options``: the ``OPTIONS`` it reads (``draft`` only when it has more than one
    kind); ``drafts`` / ``default_draft``: its draft kinds; ``codebook``: "own", "vq" (only with --vq-ckpt)
    or "none" (no LANTERN neighbours); ``batched``: several images per engine batch (False: the
    transformers adapters, batch size 1); ``cfg_scale`` (a number, or {model_type: number}) and ``top_k``:
    the published sampler's defaults; ``defaults``: option defaults the rules and builders read; ``choices``:
    per-model choices of an option (dest -> callable), over the option's own;
    ``tokens``: tokens per image when fixed (None: set by the options); ``rules``: :class:`Rule` s;
    ``sjd_schedule``: "lumina" where the SJD / SCD releases sample the image's last codes plainly
    (``real.adapters.chameleon.sjd_plain_tail``; ``--draft jacobi`` follows it), None elsewhere; ``compiles``: its
    target and every draft kind are built of ``real.nn.blocks`` decoder layers (LlamaGen, EAGLE-1), which
    ``--compile`` (``real.nn.blocks.compile_blocks``) can compile."""
    name: str
    options: frozenset = frozenset()
    drafts: tuple = ("layerskip",)
    default_draft: str = "layerskip"
    codebook: str = "own"
    batched: bool = True
    cfg_scale: float | Mapping[str, float] = 1.0
    top_k: int = 0
    defaults: Mapping[str, Any] = field(default_factory=dict)
    tokens: int | None = None
    rules: tuple = ()
    choices: Mapping[str, Callable[[], tuple]] = field(default_factory=dict)   # per-model choices of an option
    sjd_schedule: str | None = None
    no_cfg: str | None = None          # why --cfg-scale other than 1 is refused (GLM-Image's AR stage has no CFG)
    compiles: bool = False

    def __post_init__(self):
        unknown = sorted(set(self.options) - set(OPTIONS))
        bad_drafts = [d for d in self.drafts if d not in DRAFT_KINDS]
        if unknown or bad_drafts or self.default_draft not in self.drafts or self.codebook not in CODEBOOKS:
            raise ValueError(f"ModelSpec {self.name!r}: unknown options {unknown} or drafts {bad_drafts}, default draft "
                             f"{self.default_draft!r} not in {self.drafts}, or codebook {self.codebook!r} not in "
                             f"{CODEBOOKS}")
        if "draft" in self.options and len(self.drafts) < 2:
            raise ValueError(f"ModelSpec {self.name!r}: option draft needs two or more draft kinds")

    def default(self, dest: str):
        return self.default_draft if dest == "draft" else self.defaults.get(dest)

    def cfg_default(self, model_type: str | None = None) -> float:
        if isinstance(self.cfg_scale, Mapping):
            return float(self.cfg_scale[model_type or self.defaults.get("model_type")])
        return float(self.cfg_scale)


_LLAMAGEN_FILES = frozenset({"model_type", "image_size", "target_ckpt", "target_size", "target_pretrained",
                             "draft_ckpt", "draft_size", "draft_pretrained", "drafter_dir", "vq_ckpt", "vq_size",
                             "captions", "prompts", "class_id", "draft"})
_PROMPTED = (Rule(need=(("prompts",),)),)
_GLM_NO_CFG = ("GLM-Image's autoregressive stage has no classifier-free guidance (its guidance_scale belongs to the "
               "diffusion decoder, which this toolkit does not run)")
_TINY = dict(drafts=("layerskip", "small", "eagle"), default_draft="layerskip", tokens=64)
_LG = dict(compiles=True)        # LlamaGen targets (their drafts: LlamaGen or EAGLE-1)

SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("llamagen-tiny", frozenset({"class_id", "draft", "drafter_dir"}), cfg_scale=2.0, **_TINY, **_LG),
    ModelSpec("llamagen-tiny-t2i", frozenset({"draft", "drafter_dir"}), cfg_scale=2.0, **_TINY, **_LG),
    ModelSpec("llamagen", _LLAMAGEN_FILES, ("small", "layerskip", "eagle"), "small", codebook="vq", **_LG,
              cfg_scale={"c2i": 4.0, "t2i": 7.5},
              defaults={"model_type": "c2i", "target_size": "XL", "draft_size": "B", "vq_size": "VQ-16"},
              choices={"target_pretrained": _names("real.models.llamagen_io", "PRETRAINED"),
                       "draft_pretrained": _names("real.models.llamagen_io", "PRETRAINED")},
              rules=(Rule(need=(("target_ckpt", "target_pretrained"),),
                          exclusive=(("target_ckpt", "target_pretrained"), ("draft_ckpt", "draft_pretrained"),
                                     ("captions", "prompts"))),
                     Rule(when={"model_type": ("c2i",)}, refuse=("captions", "prompts")),
                     Rule(when={"model_type": ("t2i",)}, need=(("captions", "prompts"),), refuse=("class_id",)),
                     Rule(when={"draft": ("small",)}, need=(("draft_ckpt", "draft_pretrained"),)),
                     Rule(when={"draft": ("eagle",)}, need=(("drafter_dir",),)))),
    ModelSpec("hf-llama-tiny", batched=False, codebook="none", tokens=64),
    ModelSpec("llama-tiny-fast", batched=True, codebook="none", tokens=64),
    ModelSpec("chameleon-tiny", frozenset({"draft", "drafter_dir"}), cfg_scale=3.0, **_TINY),
    ModelSpec("janus-tiny", frozenset({"draft", "drafter_dir"}), cfg_scale=5.0, **_TINY),
    ModelSpec("glm-image-tiny", frozenset({"draft", "drafter_dir"}), ("layerskip", "eagle"), "layerskip", codebook="none",
              tokens=80, no_cfg=_GLM_NO_CFG),
    ModelSpec("glm-image", frozenset({"target_pretrained", "prompts", "draft", "drafter_dir", "image_size"}),
              ("layerskip", "eagle"), "layerskip", codebook="none", rules=_PROMPTED, no_cfg=_GLM_NO_CFG),
    ModelSpec("emu3-tiny", frozenset({"draft", "drafter_dir"}), cfg_scale=3.0, **_TINY),
    # the real-size tier (real.realsize.SHALLOW): the tiny builders at the published vocabularies and grids
    ModelSpec("chameleon-realsize", frozenset({"draft", "drafter_dir"}), ("layerskip", "small", "eagle"), "layerskip",
              cfg_scale=3.0, tokens=48 * 48),
    ModelSpec("janus-realsize", frozenset({"draft", "drafter_dir"}), ("layerskip", "small", "eagle"), "layerskip",
              cfg_scale=5.0, tokens=24 * 24),
    ModelSpec("emu3-realsize", frozenset({"draft", "drafter_dir"}), ("layerskip", "small", "eagle"), "layerskip",
              cfg_scale=3.0, tokens=90 * 90),
    ModelSpec("glm-image-realsize", frozenset({"draft", "drafter_dir"}), ("layerskip", "eagle"), "layerskip",
              codebook="none", tokens=16 * 16 + 32 * 32, no_cfg=_GLM_NO_CFG),
    ModelSpec("lumina-mgpt", frozenset({"target_pretrained", "prompts", "draft", "drafter_dir", "image_size",
                                        "vq_ckpt"}), ("eagle", "layerskip"), "eagle", codebook="vq",
              cfg_scale=3.0, top_k=2000, rules=_PROMPTED, sjd_schedule="lumina"),
    ModelSpec("janus-pro", frozenset({"target_pretrained", "draft_pretrained", "prompts", "draft", "drafter_dir"}),
              ("small", "eagle", "layerskip"), "small", cfg_scale=5.0, top_k=0, rules=_PROMPTED),
    ModelSpec("emu3", frozenset({"target_pretrained", "prompts", "draft", "drafter_dir"}), ("eagle", "layerskip"),
              "eagle", cfg_scale=3.0, top_k=2048, rules=_PROMPTED),
    ModelSpec("mnist", frozenset({"class_id", "draft", "drafter_dir"}), ("small", "eagle", "layerskip"), "small", cfg_scale=2.0,
              tokens=49, **_LG),
    ModelSpec("natural256", frozenset({"class_id", "draft", "drafter_dir"}), ("small", "eagle", "layerskip"), "small",
              cfg_scale=2.0,
              tokens=256, **_LG),
)}


def spec(model: str) -> ModelSpec:
    """The spec of a registered model (ValueError naming --model otherwise)."""
    if model not in SPECS:
        raise ValueError(f"--model: unknown model {model!r}; choose from {sorted(SPECS)} (--list-models)")
    return SPECS[model]


def attach(name: str, model_spec: ModelSpec | None) -> None:
    """``real.registry.register``'s side: ``model_spec`` becomes ``SPECS[name]``; None: ``SPECS`` must hold one."""
    if model_spec is not None:
        if not isinstance(model_spec, ModelSpec) or model_spec.name != name:
            raise TypeError(f"register: spec must be a real.specs.ModelSpec named {name!r}, got {model_spec!r}")
        SPECS[name] = model_spec
    elif name not in SPECS:
        raise ValueError(f"register: model {name!r} has no spec; pass spec=real.specs.ModelSpec({name!r}, ...) "
                         "(its options, draft kinds, codebook, batching and defaults)")


def prepare(name: str, opts):
    """``real.registry.build``'s side: the generic check of ``opts`` (a BuildOptions), then ``opts`` with the
    spec's defaults filled in for unset options. Returns (spec, opts)."""
    import dataclasses

    s = check_options(name, vars(opts))
    fill = {d: s.default(d) for d in OPTIONS if hasattr(opts, d) and getattr(opts, d) is None
            and s.default(d) is not None}
    return s, dataclasses.replace(opts, **fill)


def conditions_of(opts, conds) -> dict:
    """How the images' conditions were chosen (``real.registry.build`` puts it in ``Bundle.info``), for the stamps of
    records and AR rows (issue 50: rows of one condition are not fitted against rounds of another), from the filled
    ``real.registry.BuildOptions`` ``opts`` and the built conditions ``conds``: {"class_id": c} (every image of class
    c), {"class_id": "uniform"} (seeded uniform classes), {"prompts": sha256} / {"captions": sha256} of the texts or
    caption file, else {}."""
    import hashlib

    import numpy as np

    if opts.class_id is not None:
        return {"class_id": int(opts.class_id)}
    if opts.prompts:
        return {"prompts": hashlib.sha256("\n".join(map(str, opts.prompts)).encode()).hexdigest()[:16]}
    if opts.captions:
        with open(opts.captions, "rb") as fh:
            return {"captions": hashlib.sha256(fh.read()).hexdigest()[:16]}
    if conds and all(isinstance(c, (int, np.integer)) for c in conds):
        return {"class_id": "uniform"}
    return {}


def model_facts(bundle, model: str | None = None) -> dict:
    """What a built model (``real.registry.Bundle``) tells the modes (``real.decode.modes.base``), read from the
    model's spec here once it is built: ``num_tokens`` T, ``width`` the image row
    width (its grid, else the side of a square image, else None) and, where the model's spec runs SJD with the
    release's plain tail (``real.specs.ModelSpec.sjd_schedule``), ``plain_tail``."""
    import math

    grid = (bundle.info or {}).get("grid")
    T = int(bundle.num_tokens)
    out = {"num_tokens": T, "width": int(grid[1]) if grid else (math.isqrt(T) if math.isqrt(T) ** 2 == T else None)}
    if model is not None:
        if spec(model).sjd_schedule == "lumina":     # SJD / SCD on Lumina-mGPT: the last codes plainly
            from real.adapters.chameleon import sjd_plain_tail

            out["plain_tail"] = sjd_plain_tail(bundle.target.layout)
    return out


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def given(values: Mapping[str, Any], dest: str) -> bool:
    v = values.get(dest)
    return v is not None and v is not False      # an empty --prompts list is given (and refused as empty)


def resolved(model: str, values: Mapping[str, Any]) -> dict:
    """The model options of ``values`` with the spec's defaults filled in for unset ones."""
    s = spec(model)
    return {d: (values.get(d) if given(values, d) else s.default(d)) for d in OPTIONS}


def _list(dests) -> str:
    return ", ".join(flag(d) for d in dests)


def check_options(model: str, values: Mapping[str, Any]) -> ModelSpec:
    """The one generic check of the model options in ``values`` (dest -> value; None / [] = not given) against
    ``SPECS[model]``: applicability, types, choices, draft kind, ``needs`` and the spec's rules. Returns
    the spec; raises ValueError naming the flag (the message says what to do)."""
    from theory.core import checks

    s = spec(model)
    universal = values.get("draft") in universal_drafts()        # --draft jacobi: every model, no drafter
    extra = [d for d in OPTIONS if given(values, d) and d not in s.options and not (d == "draft" and universal)]
    if extra:
        ok = _list(sorted(s.options, key=list(OPTIONS).index)) or "none of the model options"
        raise ValueError(f"{_list(extra)} {'does' if len(extra) == 1 else 'do'} not apply to --model {model} "
                         f"(it would be ignored); {model} reads {ok}")
    v = resolved(model, values)
    for d in (d for d in OPTIONS if given(values, d)):
        o, x = OPTIONS[d], values[d]
        if o.type is int:
            checks.integer(flag(d), x, lo=0)
        elif o.type is list:
            if isinstance(x, str) or not x or not all(isinstance(e, str) and e.strip() for e in x):
                raise ValueError(f"{flag(d)} needs one or more non-empty strings, got {x!r}")
        elif not isinstance(x, str) or not x:
            raise ValueError(f"{flag(d)} must be a non-empty string, got {x!r}")
        allowed = s.choices[d]() if d in s.choices else o.allowed()
        if allowed is not None and x not in allowed:
            raise ValueError(f"{flag(d)} must be one of {', '.join(map(str, allowed))}, got {x!r}")
        if o.needs is not None and not given(values, o.needs):
            raise ValueError(f"{flag(d)} configures {flag(o.needs)}; give {flag(o.needs)} too")
    if v["draft"] not in s.drafts + universal_drafts():
        raise ValueError(f"--draft must be one of {', '.join(s.drafts)} for --model {model}, got {v['draft']!r}")
    for d in (d for d in OPTIONS if given(values, d) and OPTIONS[d].draft not in (None, v["draft"])):
        raise ValueError(f"{flag(d)} belongs to a {OPTIONS[d].draft!r} draft (--draft {OPTIONS[d].draft}); "
                         f"the draft is {v['draft']!r}")
    for r in s.rules:
        if not all(v.get(k) in vals for k, vals in r.when.items()):
            continue
        where = f"--model {model}" + "".join(f" {flag(k)} {v[k]}" for k in r.when)
        for group in r.exclusive:
            both = [d for d in group if given(values, d)]
            if len(both) > 1:
                raise ValueError(f"give {' or '.join(flag(d) for d in both)}, not both ({where})")
        for group in r.need:
            if not any(given(values, d) for d in group):
                raise ValueError(f"{where} needs {' or '.join(flag(d) for d in group)}")
        bad = [d for d in r.refuse if given(values, d)]
        if bad:
            raise ValueError(f"{_list(bad)} {'does' if len(bad) == 1 else 'do'} not apply with {where}")
    return s


def markdown_table() -> str:
    """The model table of docs/guide/models.md, made from ``SPECS`` (tests/test_specs.py checks the page holds it)."""
    rows = ["| model | draft kinds (default first) | codebook | batched | CFG | top-k | options |",
            "|---|---|---|---|---|---|---|"]
    for name in sorted(SPECS):
        s = SPECS[name]
        kinds = [s.default_draft] + [d for d in s.drafts if d != s.default_draft]
        cfg = (", ".join(f"{k} {x:g}" for k, x in s.cfg_scale.items()) if isinstance(s.cfg_scale, Mapping)
               else f"{s.cfg_scale:g}")
        opts = " ".join(f"`{flag(d)}`" for d in OPTIONS if d in s.options) or "—"
        rows.append(f"| `{name}` | {', '.join(kinds)} | {s.codebook} | {'yes' if s.batched else 'no (1)'} | {cfg} "
                    f"| {s.top_k} | {opts} |")
    return "\n".join(rows)
