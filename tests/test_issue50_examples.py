"""The examples of issue 50, one test each (the fuzz tests cover the classes of bad input; these pin the named cases):
a one-line error before any model is built (exit 2, nothing written) or a run that works where the input is valid.
"Before any model is built" is checked by patching the one model builder (``real.registry.build``) to fail."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import fuzz_cli as fz
from coolsd.cli import main

G = ["generate", "--model", "mnist", "--json", "--num-images", "1"]


class Built(BaseException):
    pass


def _refused(argv, named, tmp_path, monkeypatch, capsys, env=None):
    """exit 2, one error line containing ``named``, no model built, nothing written in the working directory."""
    import real.registry

    def build(*a, **k):
        raise Built()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(real.registry, "build", build)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    before = set(os.listdir(tmp_path))
    rc = main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines()
           if not ln.startswith("coolsd: warning") and "is deprecated" not in ln]
    assert rc == 2 and len(err) == 1 and err[0].startswith("coolsd: error: ") and named in err[0], (rc, err)
    assert set(os.listdir(tmp_path)) == before
    return err[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return fz.input_files(tmp_path_factory.mktemp("issue50_inputs"))


@pytest.mark.parametrize("argv,named", [
    (G + ["--tree", "dynamic", "--tree-total", "1"], "--tree-total"),
    (G + ["--num-tokens", "1"], "--num-tokens 1"),
    (G + ["--mode", "jacobi", "--window", "1"], "--window"),
    (G + ["--draft", "sjd-pac-p", "--record", "r.npz"], "--record with --draft sjd-pac-p"),
    (G + ["--mode", "sjd-pac", "--record", "r.npz"], "no round can draft the whole tree"),
    (G + ["--draft", "eagle", "--num-tokens", "2", "--L", "1", "--record", "r.npz"], "no drafted round to record"),
    (["sweep", "--model", "mnist", "--images", "4", "--unit-images", "4", "--record-images", "4", "--grid", "vanilla",
      "cool-sd:delta=2", "--predict", "--out", "o", "--tree", "dynamic", "--temperature", "0"],
     "--predict with --tree dynamic: exact likelihood of greedy tree drafting"),
    (["tune", "--model", "mnist", "--ar-images", "3", "--record-images", "4", "--tokens-per-call", "1.5"],
     "--ar-images"),
    (["tune", "--model", "mnist", "--ar-images", "100000", "--record-images", "4", "--tokens-per-call", "1.5"],
     "--max-seconds"),
    (["tune", "--model", "mnist", "--ar-images", "8", "--record-images", "4", "--kl-budget", "0.1", "--family",
      "level", "--out", "s.json"], "--family level with --out"),
])
def test_refused_before_any_model(argv, named, tmp_path, monkeypatch, capsys):
    line = _refused(argv, named, tmp_path, monkeypatch, capsys)
    if "sjd-pac-p" in argv:
        assert "--tree" not in line                  # issue 50: the message named --tree, which was not given


def test_refused_files_and_environment(files, tmp_path, monkeypatch, capsys):
    os.symlink("loop.npz", tmp_path / "loop.npz")              # a symlink to itself: a traceback before
    _refused(G + ["--save", "loop.npz"], "symbolic link that loops", tmp_path, monkeypatch, capsys)
    os.unlink(tmp_path / "loop.npz")
    _refused(G, "COOLSD_DEVICE_PATH must be a boolean", tmp_path, monkeypatch, capsys,
             env={"COOLSD_DEVICE_PATH": "banana"})
    monkeypatch.delenv("COOLSD_DEVICE_PATH", raising=False)
    rec, ar = str(files / "rec.npz"), str(files / "ar.npz")
    _refused(["tune", "--record", rec, "--ar-rows", str(files / "bomb.npz"), "--tokens-per-call", "1.8"],
             "inflates to", tmp_path, monkeypatch, capsys)
    _refused(["tune", "--record", rec, "--ar-rows", ar, "--save-ar-rows", "a.npz", "--tokens-per-call", "1.8"],
             "--save-ar-rows", tmp_path, monkeypatch, capsys)
    # the reachable range depends on the record alone: refused before any AR row is made (the target is out of it)
    _refused(["tune", "--record", rec, "--model", "mnist", "--ar-images", "4", "--tokens-per-call", "3.0"],
             "--tokens-per-call 3: tokens_per_call=3 is outside the reachable range", tmp_path, monkeypatch, capsys)


def test_bound_validate_on_a_one_image_record_is_refused_before_the_fit(tmp_path, monkeypatch, capsys):
    from theory.likelihood import tune

    rng = np.random.default_rng(0)
    V, L, R = 4, 2, 6
    np.savez(tmp_path / "one.npz", p=rng.dirichlet(np.ones(V), (R, L + 1)), q=rng.dirichlet(np.ones(V), (R, L)),
             drafts=rng.integers(0, V, (R, L)), n_drafted=np.full(R, L), image=np.zeros(R, np.int64))
    monkeypatch.setattr(tune, "tune", lambda *a, **k: pytest.fail("the fit ran"))
    _refused(["tune", "--objective", "bound", "--record", str(tmp_path / "one.npz"), "--tokens-per-call", "1.2",
              "--validate"], "--validate fits on half", tmp_path, monkeypatch, capsys)


def test_jacobi_horizon_inits_and_a_huge_sjd_pac_window_work(tmp_path, monkeypatch, capsys):
    """The SJD release's LlamaGen default (--jacobi-init repeat_horizon) runs; SJD-PAC's window is capped at the image:
    --window 100000 gives the tokens of the release default 64 (both past the image) without W-sized plans."""
    monkeypatch.chdir(tmp_path)
    for init in ("repeat_horizon", "sample_horizon"):
        assert main(G + ["--mode", "jacobi", "--jacobi-init", init]) == 0
        assert json.loads(capsys.readouterr().out)["num_images"] == 1
    toks = []
    for w in ("64", "100000"):
        assert main(G + ["--mode", "sjd-pac", "--window", w, "--save", f"w{w}.npz"]) == 0
        capsys.readouterr()
        toks.append(np.load(tmp_path / f"w{w}.npz")["tokens"])
    assert np.array_equal(toks[0], toks[1])


def test_emu3_dynamic_release_fidelity_works(capsys):
    """Documented as supported; failed after generation with a numpy broadcast error (the scorer sized the wrapped
    transformers model's cache, not BatchedImageLM's)."""
    assert main(["generate", "--model", "emu3-tiny", "--json", "--num-images", "2", "--mode", "dynamic",
                 "--tree-sampling", "release", "--fidelity"]) == 0
    fid = json.loads(capsys.readouterr().out)["fidelity"]
    assert fid["images"] == 2 and math.isfinite(fid["nll_per_token"])


def test_compile_says_it_is_compiling(monkeypatch, capsys):
    from real.nn import blocks

    monkeypatch.setattr(blocks, "compile_blocks", lambda m, mode: None)     # the message, not the compilation
    blocks.compile_models({"target": object(), "draft": None}, "default", "cpu")
    assert "compiling the decoder blocks" in capsys.readouterr().err


# --------------------------------------------------------------------------- the API examples

def _ar_rows(n=6, T=4, V=3, L=2, image=None):
    from theory.likelihood import arrows

    rng = np.random.default_rng(0)
    stamp = {"model": "chain", "draft": "table", "processing": {"temperature": 1.0}, "L": L, "convention": "eagle",
             "T": T, "V": V, "method": "vanilla", "per_row": T}
    return arrows.ARRows(rng.dirichlet(np.ones(V), (n, T)), rng.dirichlet(np.ones(V), (n, T, L)),
                         rng.integers(0, V, (n, T)), stamp, image)


def test_api_examples():
    from coolsd import validate
    from theory.likelihood import arrows, exact_tune, objective, speed, tree
    from theory.likelihood.recorded import Rows

    for call, exc, match in [
        (lambda: objective.ExactObjective(None, "free"), TypeError, "ExactObjective: rows must be ARRows"),
        (lambda: speed.SpeedModel(None), TypeError, "SpeedModel: record must be a StampedRecord"),
        (lambda: arrows.check_stamps(None, {}, "x"), TypeError, "x: the first stamp must be a stamp"),
        (lambda: validate.method_model("cool-sd", None, None, "x", None), TypeError, "params must be a dict"),
        (lambda: tree.tree_log_likelihood(None, None, np.zeros((2, 3), np.int64), None), TypeError, "p must be an"),
        (lambda: objective.rule_of("free", [1, 2], L=4), ValueError, "must hold 4 numbers"),
        (lambda: validate.check_seconds("x", float("nan"), 10, ""), ValueError, "estimated seconds"),
        (lambda: validate.check_seconds("x", 5.0, float("nan"), ""), ValueError, "--max-seconds"),
        (lambda: _ar_rows(image=np.array([0, 1, 2, 0, 1, 2])), ValueError, "image ids must be distinct"),
    ]:
        with pytest.raises(exc, match=match):
            call()
    ar = _ar_rows()
    listed = arrows.ARRows(ar.p.tolist(), ar.q.tolist(), ar.tokens.tolist(), ar.stamp)      # lists, as documented
    assert np.array_equal(listed.p, ar.p) and listed.p.dtype == np.float64
    obj = objective.ExactObjective(ar, "free")
    with pytest.raises(ValueError, match="theta must be finite"):
        obj.values([float("nan")] * 2)
    assert math.isfinite(obj.values([0.0, 0.0])["kl"])
    rec = _record(ar.stamp)
    with pytest.raises(ValueError, match="n_boot"):
        exact_tune.tune_exact(ar, rec, "free", tokens_per_call=1.5, n_boot=0)
    other = {**ar.stamp, "conditions": {"class_id": 3}}
    with pytest.raises(ValueError, match="differ in 'conditions'"):
        arrows.check_stamps({**ar.stamp, "conditions": {"class_id": "uniform"}}, other, "AR rows vs --record")
    arrows.check_stamps(ar.stamp, other, "an older stamp without conditions")      # not compared: it has none
    assert isinstance(Rows, type)


def _record(stamp, R=12, seed=1):
    from theory.likelihood import arrows
    from theory.likelihood.recorded import Rows

    rng = np.random.default_rng(seed)
    V, L = stamp["V"], stamp["L"]
    rows = Rows(rng.dirichlet(np.ones(V), (R, L + 1)), rng.dirichlet(np.ones(V), (R, L)), rng.integers(0, V, (R, L)),
                np.full(R, L), np.arange(R) // 2)
    return arrows.StampedRecord(rows, np.tile([0, 1], R // 2), stamp)


def test_engine_booleans_and_compile_backend():
    import torch

    from real.decode import engine
    from real.nn import devpath
    from real.registry import tiny_llamagen_pair
    from theory import rules
    from theory.core import checks

    assert (devpath.TRUE_WORDS, devpath.FALSE_WORDS) == (checks.TRUE_WORDS, checks.FALSE_WORDS)   # one spelling
    t, d = tiny_llamagen_pair(seed=0)
    kw = dict(num_tokens=8, verifier=rules.vanilla(), drafting=2)
    with pytest.raises(ValueError, match="device_path must be a boolean"):
        engine.generate(t, d, [0], device_path="banana", **kw)
    with pytest.raises(ValueError, match="unknown torch.compile backend 'bogus'"):
        engine.generate(t, d, [0], compile="default", compile_backend="bogus", **kw)
    off = engine.generate(t, d, [0], device_path="no", seed=3, **kw)[0].tokens
    assert torch.equal(off, engine.generate(t, d, [0], device_path=False, seed=3, **kw)[0].tokens)


def test_a_records_stamp_carries_its_conditions(tmp_path, monkeypatch, capsys):
    """A record made with --class-id 3 says so (and one of seeded random classes says "uniform"), so tune refuses AR
    rows of other conditions (check_stamps) and makes its own AR rows with the record's class."""
    monkeypatch.chdir(tmp_path)
    for extra, want in ((["--class-id", "3"], {"class_id": 3}), ([], {"class_id": "uniform"})):
        assert main(G + extra + ["--record", "r.npz"]) == 0
        capsys.readouterr()
        assert json.loads(str(np.load(tmp_path / "r.npz")["stamp"]))["conditions"] == want


def test_quality_flags_that_their_metric_does_not_read_are_refused():
    from coolsd.quality import QualitySpec

    with pytest.raises(ValueError, match="--quality-captions configures CLIP score; --quality fid does not measure"):
        QualitySpec.parse("fid", captions="c.txt")
    with pytest.raises(ValueError, match="--quality-ref configures FID"):
        QualitySpec.parse("clip", reference="r.npz")
    assert QualitySpec.parse("fid,clip", captions="c.txt").captions == "c.txt"        # control: read there


def test_a_reference_of_another_feature_dimension_is_refused_when_loaded(monkeypatch):
    from coolsd.quality import reference

    ref = type("R", (), {"mu": np.zeros(3), "sigma": np.eye(3), "features": None})()
    monkeypatch.setattr(reference, "_load_reference", lambda r, ex: ref)
    ex = type("E", (), {"name": "eight", "num_features": 8})()
    with pytest.raises(ValueError, match="3-dimensional but extractor eight gives 8 features"):
        reference.load_reference("ref.npz", ex)
    ex.num_features = 3
    assert reference.load_reference("ref.npz", ex) is ref                 # control: the same dimension passes


def test_coolsd_debug_takes_its_documented_spellings(monkeypatch, capsys):
    monkeypatch.setenv("COOLSD_DEBUG", "banana")
    assert main(["theory", "table", "--V", "1"]) == 2
    assert "COOLSD_DEBUG must be a boolean" in capsys.readouterr().err
