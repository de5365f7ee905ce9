"""The method registry (theory.rules.methods) and the typed build options (real.registry.BuildOptions)."""
from __future__ import annotations

import numpy as np
import pytest

from theory.rules import methods
from theory import rules


def test_every_method_builds_the_rule_of_theory_rules():
    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(10, 2)))
    needs = {"scaled": {"weights": (3.0, 1.5, 1.0)}}                       # a method with a required parameter
    emb = np.random.default_rng(1).normal(size=(10, 2))
    for name in methods.names():
        v = methods.build(name, 3, nb, k=2) if methods.get(name).needs_neighbors else \
            methods.build(name, 3, embeddings=emb) if methods.get(name).needs_embeddings else \
            methods.build(name, 3, **needs.get(name, {}))
        assert isinstance(v, rules.Verifier)
        assert v.name == name or (name, v.name) == ("lantern+G*", "lantern+G*")
    v = methods.build("cool-sd", 4, delta=3.0)
    assert v.params == rules.cool_sd(3.0).params and v.accept == rules.cool_sd(3.0).accept
    g = methods.build("lantern+gstar", 4, nb, k=2, delta=0.4)              # alias spelling, resampler pinned
    assert g.name == "lantern+G*" and isinstance(g.resample, rules.Optimal) and g.params == {"k": 2, "delta": 0.4, "resampler": "optimal"}
    assert methods.build("lantern++", 4, nb, k=2, lam=3.0).params["lambda"] == 3.0     # grid alias of lambda
    wide = (np.arange(10)[:, None] + 1 + np.arange(9)[None, :]) % 10               # a valid (10, 9) table
    assert methods.build("lantern", 4, wide).params["k"] == methods.default_lantern_k(10)


@pytest.mark.parametrize("call, match", [
    (lambda: methods.build("nope", 4), "unknown method 'nope'"),
    (lambda: methods.build("cool-sd", 4, dleta=2.0), "cool-sd: unknown parameter 'dleta'"),
    (lambda: methods.build("cool-sd", 4, delta=0.0), "'delta' must be > 0"),
    (lambda: methods.build("cool-sd", 4, delta="x"), "'delta' must be float"),
    (lambda: methods.build("lantern++", 4, np.zeros((4, 3), np.int64), k=1, lam=0.5), "'lambda' must be >= 1"),
    (lambda: methods.build("lantern", 4, np.zeros((4, 3), np.int64), k=1.5), "'k' must be int"),
    (lambda: methods.build("lantern", 4, np.zeros((4, 3), np.int64), k=3), "needs 4 neighbours"),
    (lambda: methods.build("lantern", 4, np.zeros((4, 3), np.int64), k=1, resampler="x"), "one of"),
    (lambda: methods.build("lantern+G*", 4, np.zeros((4, 3), np.int64), resampler="lantern"), "is fixed"),
    (lambda: methods.build("lantern", 4), "neighbour table"),
    (lambda: methods.build("vanilla", 0), "L must be"),
    (lambda: methods.build("gsd", 4), r"gsd: the embedding-distance test \(--gsd-d-threshold 0.5\) needs the codebook"),
    (lambda: methods.build("gsd", 4, d_threshold="near"), "'d_threshold': need a number > 0 or 'off'"),
    (lambda: methods.build("gsd", 4, d_threshold=0.0), "'d_threshold': need a number > 0 or 'off'"),
    (lambda: methods.build("gsd", 4, d_threshold="off", window=-1), "'window' must be >= 0"),
    (lambda: methods.build("gsd", 4, d_threshold="off", p_threshold=0.0), "'p_threshold' must be > 0"),
    (lambda: methods.build("gsd", 4, d_threshold="off", resampler="lantern"), "one of"),
    (lambda: methods.build("gsd+G*", 4, d_threshold="off", resampler="residual"), "is fixed"),
])
def test_bad_methods_and_parameters_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_gsd_entries_build_the_release_rule_and_our_g_star_variant():
    emb = np.random.default_rng(0).normal(size=(12, 3))
    v = methods.build("gsd", 4, embeddings=emb)
    assert v.name == "gsd" and isinstance(v.resample, rules.Residual) and isinstance(v.accept, rules.Grouped)
    assert v.params == {"window": 7, "p_threshold": 0.15, "d_threshold": 0.5, "resampler": "residual"}
    assert np.array_equal(v.accept.close, rules.gsd_close(emb, 0.5))
    g = methods.build("gsd+gstar", 4, embeddings=emb, window=3)       # alias spelling, resampler pinned
    assert g.name == "gsd+G*" and isinstance(g.resample, rules.Optimal) and g.params["window"] == 3
    off = methods.build("gsd", 4, d_threshold="off")                   # no distance test: no embeddings needed
    assert off.accept.close is None and off.params["d_threshold"] is None
    owners = methods.flag_owners()
    assert {prm.type for _, prm in owners["gsd_d_threshold"]} == {methods.threshold_or_off}
    assert {m.name for m, _ in owners["resampler"]} >= {"gsd", "lantern", "lantern++", "typical"}


def test_method_flags_are_namespaced_per_method():
    """A flag several methods read is converted by the selected method's own parameter: its choices (gsd takes no
    --resampler argmax, typical does), its type (a method registered with a text parameter on an existing numeric
    flag keeps text), and a flag of another method is refused, naming the method's own flags."""
    from argparse import Namespace

    from coolsd.options import method_params

    def args(**kw):
        return Namespace(**{f: None for f in methods.flag_owners()} | kw)

    assert method_params(args(resampler="argmax"), "typical") == {"resampler": "argmax"}
    with pytest.raises(ValueError, match="--resampler: gsd: parameter 'resampler' must be one of"):
        method_params(args(resampler="argmax"), "gsd")
    assert method_params(args(lantern_k="3", lantern_delta="0.1"), "lantern") == {"k": 3, "delta": 0.1}
    with pytest.raises(ValueError, match="--delta do.es. not apply to method lantern"):
        method_params(args(delta="5"), "lantern")       # cool-sd's --delta is not LANTERN's --lantern-delta
    assert method_params(args(delta="2.5"), "cool-sd") == {"delta": 2.5}
    m = methods.register(methods.Method("test-flag-rule", "t", (methods.Param("delta", str, "a", flag="delta"),),
                                        lambda p, L, nb: rules.vanilla()))
    try:
        assert method_params(args(delta="2.5"), "test-flag-rule") == {"delta": "2.5"}     # its own type: text
        assert method_params(args(delta="2.5"), "cool-sd") == {"delta": 2.5}
    finally:
        del methods.METHODS[m.name.lower()]


def test_cli_refuses_options_of_another_method(capsys):
    from coolsd.cli import main

    assert main(["generate", "--method", "cool-sd", "--c", "2", "--json"]) == 2
    assert "--c do(es) not apply to method cool-sd" in capsys.readouterr().err


def test_build_options_are_typed():
    from real.registry import BuildOptions, _o, build

    with pytest.raises(ValueError, match=r"unknown build option\(s\) \['num_imags'\]"):
        build("llamagen-tiny", num_imags=2)
    with pytest.raises(TypeError, match="BuildOptions"):
        build("llamagen-tiny", object())
    with pytest.raises(AttributeError):
        _o(BuildOptions(), "num_imags", 1)               # a misspelt read is an error, not the default
    with pytest.raises(Exception):
        BuildOptions().seed = 1                          # frozen
    b = build("llamagen-tiny", BuildOptions(num_images=3, seed=1), num_tokens=5)
    assert len(b.conds) == 3 and b.num_tokens == 5
