"""The model spec (real.specs, issue 24 item 2): one place per model, read by the registry, the CLI, the sweep
and the README; checked here against what the builders actually build."""
from __future__ import annotations

import contextlib
import io
import json
import pathlib

import pytest

from real import registry, specs
from real.specs import OPTIONS, SPECS, ModelSpec, check_options, flag

CHEAP = ["llamagen-tiny", "llamagen-tiny-t2i", "chameleon-tiny", "janus-tiny", "emu3-tiny", "mnist", "natural256",
         "hf-llama-tiny", "llama-tiny-fast"]


def test_every_registered_model_has_a_spec_and_no_spec_is_orphaned():
    assert set(registry.MODELS) == set(SPECS)


@pytest.mark.parametrize("name", CHEAP)
def test_spec_matches_the_built_bundle(name):
    """What the spec declares is what the built model does: a batched model generates two images in one engine batch
    (per-row caches), an unbatched one refuses it; the tokens per image; LANTERN's table exists iff the spec says
    the model has its own codebook; and the CFG / top-k defaults are the published samplers' (``PUBLISHED``, facts from
    the releases, not read from the spec) and reach the processing ``coolsd generate`` runs with."""
    from coolsd.cli import main
    from real.decode import engine
    from real.decode.sampling import Processing

    s = SPECS[name]
    b = registry.build(name, num_images=2)
    T = min(b.num_tokens, 4)
    run = lambda: engine.generate(b.target, None, b.conds[:2], num_tokens=T, batch_size=2,   # noqa: E731
                                  processing=Processing(cfg_scale=b.cfg_scale))
    if s.batched:
        assert [g.tokens.shape for g in run()] == [(T,), (T,)]
    else:
        with pytest.raises(ValueError, match="one image at a time"):
            run()
    assert s.tokens is None or b.num_tokens == s.tokens
    assert (b.neighbors is not None) == (s.codebook == "own")
    assert (b.cfg_scale, b.top_k) == PUBLISHED[name]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["generate", "--model", name, "--num-tokens", "8", "--json"]) == 0
    assert json.loads(out.getvalue())["processing"]["cfg_scale"] == PUBLISHED[name][0]


# the samplers' defaults as their releases publish them (tiny random configs: the family's default; MNIST: ours)
PUBLISHED = {"llamagen-tiny": (2.0, 0), "llamagen-tiny-t2i": (2.0, 0), "hf-llama-tiny": (1.0, 0),
             "llama-tiny-fast": (1.0, 0), "chameleon-tiny": (3.0, 0), "janus-tiny": (5.0, 0), "emu3-tiny": (3.0, 0),
             "mnist": (2.0, 0), "natural256": (2.0, 0)}


@pytest.mark.parametrize("name", ["mnist", "natural256", "llamagen-tiny"])
def test_every_declared_draft_kind_builds_and_the_default_is_the_specs(name):
    s = SPECS[name]
    for kind in s.drafts:
        assert registry.build(name, draft=kind).info["draft"] == kind
    assert registry.build(name).info["draft"] == s.default_draft


@pytest.mark.parametrize("name", sorted(SPECS))
def test_an_option_the_model_does_not_read_is_refused_by_the_generic_check(name):
    s = SPECS[name]
    foreign = [d for d in OPTIONS if d not in s.options]
    for d in foreign:
        value = [" a"] if OPTIONS[d].type is list else (1 if OPTIONS[d].type is int else "x")
        with pytest.raises(ValueError, match=f"^{flag(d)} does not apply to --model {name}"):
            check_options(name, {d: value})
    if "draft" in s.options:
        undeclared = [k for k in specs.DRAFT_KINDS if k not in s.drafts]
        for k in undeclared:
            with pytest.raises(ValueError, match="^--draft must be one of"):
                check_options(name, {"draft": k, **{d: v for d, v in (("prompts", ["a"]), ("target_ckpt", "t"))
                                                    if d in s.options}})


def test_a_newly_registered_model_is_checked_too():
    """No table to forget: register() needs a spec, and build() checks the options against it (control:
    the same option on a spec that reads it passes)."""
    with pytest.raises(ValueError, match="has no spec"):
        registry.register("ghost", lambda o: None)
    built = []
    registry.register("ghost", lambda o: built.append(o) or registry.build("mnist"),
                      spec=ModelSpec("ghost", frozenset({"class_id"}), cfg_scale=1.5))
    try:
        with pytest.raises(ValueError, match="^--vq-ckpt does not apply to --model ghost"):
            registry.build("ghost", vq_ckpt="x.pt")
        assert not built
        b = registry.build("ghost", class_id=3)
        assert built[0].class_id == 3 and b.cfg_scale == 1.5
    finally:
        registry.MODELS.pop("ghost")
        SPECS.pop("ghost")


def test_cli_flags_are_the_spec_options():
    from coolsd.cli import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if a.dest == "command").choices
    gen = {a.dest for a in sub["generate"]._actions}
    swp = {a.dest for a in sub["sweep"]._actions}
    assert set(OPTIONS) <= gen and set(OPTIONS) - {"class_id"} <= swp


def test_docs_model_table_is_the_specs():
    # the full table lives on the Models page of the documentation site (docs/guide/models.md)
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide" / "models.md").read_text()
    assert specs.markdown_table() in page


def test_readme_names_every_model_and_method():
    # the README's short table of supported models and methods names every registered model and method
    from theory.rules import methods

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("## Supported models and methods"):readme.index("## Headline results")]
    missing = [n for n in (*SPECS, *methods.names()) if f"`{n}`" not in table]
    assert missing == []
