"""The probe catalogue of issue 26: bad inputs across the CLI and the Python API, one table row each.

Every CLI probe runs in-process (``coolsd.cli.main``) in an empty working directory and must give exit 2,
one line ``coolsd: error: ...`` naming the option, no traceback, within ``CLI_SECONDS``, and leave the
directory as it was (no file written). Every API probe must raise ValueError / TypeError (or the cost
guard's SizeError) whose message names the argument, within ``API_SECONDS``. The examples of issue 26
are marked ``#26``. tests/test_bad_input.py keeps the older, more detailed cases (messages, size estimates
against measured peaks, atomic outputs); the probes here do not repeat them. A hypothesis fuzz of the API
entry points closes the file: random shapes, dtypes, NaNs, lists and None give a clean result or a
ValueError / TypeError with a message, never another exception.
"""
from __future__ import annotations

import json
import os
import pathlib
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from coolsd.cli import main
from theory.markov import chains
from theory.core import checks
from theory import markov, rules
from theory.likelihood import recorded, tune
import sim

CLI_SECONDS = 10.0     # generous for a loaded 2-core machine; the guards themselves take milliseconds
API_SECONDS = 5.0


# --------------------------------------------------------------------------- input files the probes name

def _rows_arrays(R=12, L=2, V=4, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(V), size=(R, L + 1))
    q = rng.dirichlet(np.ones(V), size=(R, L))
    return {"p": p, "q": q, "drafts": rng.integers(0, V, (R, L)), "n_drafted": np.full(R, L),
            "image": np.arange(R) // 3}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe_inputs")
    good = d / "rows.npz"
    np.savez_compressed(good, **_rows_arrays())
    raw = good.read_bytes()
    (d / "truncated.npz").write_bytes(raw[: len(raw) // 2])
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    (d / "flipped.npz").write_bytes(bytes(flipped))
    (d / "empty.npz").write_bytes(b"")
    (d / "text.npz").write_text("p,q,drafts\n1,2,3\n")
    np.save(d / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(d / "obj.npz", p=np.array([{"a": 1}], dtype=object))
    np.savez(d / "nokeys.npz", x=np.zeros(3))
    a = _rows_arrays()
    a["drafts"] = a["drafts"][:, :1]
    np.savez(d / "badshape.npz", **a)
    (d / "random.pt").write_bytes(os.urandom(256))
    (d / "manifest_dir").mkdir()
    (d / "adir").mkdir()
    os.link(good, d / "hardlink.npz")                 # outputs that are an input under another name (issue 41)
    os.symlink(good, d / "symlink.npz")
    (d / "w.json").write_text('{"weights": [2.0, 1.5, 1.0, 1.0]}')
    os.link(d / "w.json", d / "w_link.npz")
    (d / "readonly.npz").write_bytes(raw)
    os.chmod(d / "readonly.npz", 0o444)
    dyn = dict(np.load(good))
    dyn["dynamic"] = np.array('{"tree_topk": 2}')                   # marks a --tree dynamic record (keys only)
    np.savez(d / "dyn.npz", **dyn)
    os.mkfifo(d / "fifo")                             # issue 41: a FIFO must be refused, never opened (it blocks)
    (d / "level.json").write_text('{"levels": [0.1, 0.2]}')          # a tune --family level schedule
    (d / "list.json").write_text("3")                                # JSON, but not a schedule
    return d


# --------------------------------------------------------------------------- CLI probes
# (argv, the name the one-line message must contain). "{f}" is replaced by the input-file directory.

G = ["generate", "--json"]
GM = G + ["--model", "mnist"]
SW = ["sweep", "--out", "sw_out", "--model", "mnist", "--images", "2", "--unit-images", "2"]
TU = ["tune", "--objective", "bound", "--record", "{f}/rows.npz", "--tokens-per-call", "1.2"]
TB = ["theory", "table"]
AN = ["theory", "anneal", "--out", "an_out"]
SV = ["sim", "validate"]
SS = ["sim", "sources"]

CLI_PROBES = [
    # generate: numbers and types
    (GM + ["--L", "100000"], "--L"),                                        # 26
    (GM + ["--L", "0"], "--L"),
    (GM + ["--L", "-3"], "--L"),
    (GM + ["--num-images", "0"], "--num-images"),
    (GM + ["--num-images", "-2"], "--num-images"),
    (GM + ["--num-images", str(10**9)], "--num-images"),
    (GM + ["--batch-size", "0"], "--batch-size"),
    (GM + ["--batch-size", "5", "--num-images", "2"], "--batch-size"),
    (GM + ["--num-tokens", "0"], "--num-tokens"),
    (GM + ["--seed", "-1"], "--seed"),
    (GM + ["--seed", str(2**65)], "--seed"),
    (GM + ["--temperature", "-1"], "--temperature"),
    (GM + ["--temperature", "nan"], "--temperature"),
    (GM + ["--top-p", "1.5"], "--top-p"),
    (GM + ["--top-p", "-0.1"], "--top-p"),
    (GM + ["--top-k", "-1"], "--top-k"),
    (GM + ["--cfg-scale", "-5"], "--cfg-scale"),
    (GM + ["--cfg-scale", "inf"], "--cfg-scale"),
    (GM + ["--threads", "0"], "--threads"),
    (GM + ["--device", "foo"], "--device"),
    (GM + ["--device", "cuda:x"], "--device"),
    (GM + ["--method", "cool-sd", "--delta", "0"], "delta"),
    (GM + ["--method", "cool-sd", "--delta", "-2"], "delta"),
    (GM + ["--method", "cool-sd", "--nu", "-1"], "nu"),                     # 26 (CLI side of nu < 0)
    (GM + ["--method", "cool-sd", "--c", "2"], "--c"),
    (GM + ["--method", "uniform-rsd", "--c", "0"], "c"),
    (GM + ["--method", "vanilla", "--delta", "2"], "--delta"),
    (GM + ["--method", "bogus"], "--method"),
    (GM + ["--tree", "nonsense"], "tree"),
    (GM + ["--tree", "eagle25", "--method", "ar"], "--tree"),
    # generate: options of the model spec
    (GM + ["--vq-ckpt", "/etc/passwd"], "--vq-ckpt"),
    (GM + ["--target-ckpt", "/etc/passwd"], "--target-ckpt"),
    (GM + ["--prompts", "a cat"], "--prompts"),
    (GM + ["--draft", "bogus"], "--draft"),
    (GM + ["--drafter-dir", "{f}/adir"], "--drafter-dir"),
    (GM + ["--class-id", "10"], "--class-id"),
    (GM + ["--class-id", "-1"], "--class-id"),
    (G + ["--model", "nope"], "--model"),
    (G + ["--model", "llamagen-tiny-t2i", "--class-id", "3"], "--class-id"),
    (G + ["--model", "hf-llama-tiny", "--draft", "small"], "--draft"),
    (G + ["--model", "hf-llama-tiny", "--method", "lantern"], "--method lantern"),
    (G + ["--model", "hf-llama-tiny", "--batch-size", "2", "--num-images", "2"], "batch"),
    (G + ["--model", "llamagen"], "--target-ckpt"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--target-pretrained", "c2i-B-256"],
     "--target-ckpt or --target-pretrained"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "small"], "--draft-ckpt"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "eagle"], "--drafter-dir"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--draft-size", "B"],
     "--draft-size"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--target-size", "Q"],
     "--target-size"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--vq-size", "VQ-16"],
     "--vq-size"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--model-type", "t2i"],
     "--captions or --prompts"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--prompts", "x"],
     "--prompts"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--model-type", "x"],
     "--model-type"),
    (G + ["--model", "llamagen", "--target-pretrained", "nope", "--draft", "layerskip"], "--target-pretrained"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--image-size", "100"],
     "--image-size"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/random.pt", "--draft", "layerskip", "--captions",
          "{f}/random.pt", "--model-type", "t2i"], "--captions"),
    (G + ["--model", "lumina-mgpt"], "--prompts"),
    (G + ["--model", "emu3", "--prompts", "a", "--draft", "small"], "--draft"),
    (G + ["--model", "janus-pro", "--prompts", "a", "--draft", "eagle", "--draft-pretrained", "x"],
     "--draft-pretrained"),
    (G + ["--model", "lumina-mgpt", "--prompts", ""], "--prompts"),
    # generate: outputs checked first
    (GM + ["--method", "ar", "--record", "r.npz"], "--record"),             # 26
    (GM + ["--save", "/proc/x.npz"], "--save"),
    (GM + ["--save", "{f}/adir"], "--save"),
    (GM + ["--save", "nodir/x.npz"], "--save"),
    (GM + ["--record", "/proc/x.npz"], "--record"),
    (GM + ["--record", "same.npz", "--save", "same.npz"], "--record"),
    (GM + ["--save", ""], "--save"),
    (GM + ["--save", "{f}/readonly.npz"], "read-only"),                                        # 41
    (GM + ["--method", "scaled", "--weights", "{f}/w.json", "--save", "{f}/w_link.npz"], "--weights"),   # 41
    # issue 41: overflow into float32, files that are not regular files, the wrong format, cost guards
    (GM + ["--method", "cool-sd", "--nu", "1e308"], "--nu"),                             # 41 (NaN weights before)
    (GM + ["--method", "cool-sd", "--delta", "1e39"], "float32"),
    (GM + ["--method", "scaled", "--weights", "1e39,1,1,1"], "--weights"),
    (GM + ["--method", "scaled", "--weights", "{f}/fifo"], "FIFO"),                      # 41 (blocked before)
    (GM + ["--method", "scaled", "--weights", "/dev/zero"], "device"),                   # 41 (read to OOM before)
    (GM + ["--method", "scaled", "--weights", "{f}/adir"], "directory"),
    (GM + ["--method", "scaled", "--weights", "{f}/pickled.npy"], "--weights"),
    (GM + ["--method", "scaled", "--weights", "{f}/list.json"], "--weights"),
    (GM + ["--method", "scaled", "--weights", "{f}/level.json"], "level"),               # 41 (NotImplementedError)
    (GM + ["--method", "scaled", "--weights", "{f}/missing.json"], "--weights"),
    (G + ["--model", "llamagen", "--target-ckpt", "{f}/fifo", "--draft", "layerskip"], "FIFO"),
    (G + ["--model", "llamagen", "--target-ckpt", "/dev/zero", "--draft", "layerskip"], "--target-ckpt"),
    (GM + ["--tree-total", "5"], "--tree-total"),                                        # 41 (ignored before)
    (GM + ["--tree-sampling", "release"], "--tree-sampling"),                            # 41
    (GM + ["--tree-depth", "2"], "--tree-depth"),                                        # 41
    (GM + ["--temperature", "1e39"], "--temperature"),
    (GM + ["--threads", str(2**63)], "--threads"),
    (SW + ["--images", "4", "--unit-images", "64"], "--unit-images"),                    # 41 (64 generated before)
    (SW + ["--images", "10", "--unit-images", "4"], "--unit-images"),
    (SW + ["--images", "1000000"], "--max-seconds"),                                     # 41 (no guard before)
    (SW + ["--images", "64", "--max-seconds", "1"], "--max-seconds"),
    (SW + ["--max-seconds", "-1"], "--max-seconds"),
    (SW + ["--L", "100000"], "--L"),                                                     # 41 (store made before)
    (SW + ["--grid-file", "{f}/fifo"], "--grid-file"),
    (SW + ["--model", "hf-llama-tiny", "--grid", "lantern"], "--grid lantern"),
    (SW + ["--model", "hf-llama-tiny", "--grid", "vanilla", "--batch-size", "2"], "--batch-size"),          # 41 (store made before)
    (SW + ["--grid", "cool-sd:nu=1e308"], "float32"),
    (SW + ["--tree-total", "5"], "--tree-total"),
    (["tune", "--record", "{f}/fifo", "--tokens-per-call", "1.2"], "FIFO"),              # 41
    (["tune", "--record", "/dev/zero", "--tokens-per-call", "1.2"], "device"),           # 41
    (["tune", "--record", "{f}/pickled.npy", "--tokens-per-call", "1.2"], ".npy"),       # 41
    (["tune", "--record", "{f}/rows.npz", "--ar-rows", "{f}/fifo", "--tokens-per-call", "1.2"], "--ar-rows"),
    (["tune", "--record", "{f}/rows.npz", "--tokens-per-call", "1.2", "--out", "{f}/rows.npz"], "--out"),  # 41
    (["tune", "--record", "{f}/dyn.npz", "--tokens-per-call", "1.2", "--objective", "bound"], "dynamic-tree"),  # 41
    (TU + ["--frontier", "100000"], "--frontier"),                                       # 41 (no guard before)
    (TU + ["--max-seconds", "-1"], "--max-seconds"),
    (TU + ["--device", "foo"], "--device"),
    (["demo", "--L", "100", "--out", "d_out"], "--L"),
    (SV + ["--seed", str(2**65)], "--seed"),
    # sweep: the same checks as generate, and its own
    (SW + ["--cfg-scale", "-5"], "--cfg-scale"),                            # 26
    (SW + ["--vq-ckpt", "/etc/passwd"], "--vq-ckpt"),                       # 26
    (SW + ["--device", "foo"], "--device"),                                 # 26
    (SW + ["--device", "cuda:99"], "--device"),
    (SW + ["--draft", "bogus"], "--draft"),
    (SW + ["--target-ckpt", "x.pt"], "--target-ckpt"),
    (SW + ["--images", "1"], "--images"),
    (SW + ["--unit-images", "0"], "--unit-images"),
    (SW + ["--batch-size", "4"], "--batch-size"),
    (SW + ["--batch-size", "0"], "--batch-size"),
    (SW + ["--seed", "-1"], "--seed"),
    (SW + ["--L", "0"], "--L"),
    (SW + ["--threads", "0"], "--threads"),
    (SW + ["--temperature", "-1"], "--temperature"),
    (SW + ["--max-units", "-1"], "--max-units"),
    (SW + ["--record-images", "-1"], "--record-images"),
    (SW + ["--dtype", "int8"], "--dtype"),
    (SW + ["--grid", "bogus:x=1"], "bogus"),
    (SW + ["--grid", "cool-sd:delta=-1"], "delta"),
    (SW + ["--tree", "nonsense"], "tree"),
    (SW + ["--grid-file", "{f}/text.npz"], "grid"),
    (["sweep", "--out", "{f}/rows.npz", "--model", "mnist", "--images", "2", "--unit-images", "2"], "--out"),
    (SW + ["--model", "nope"], "--model"),
    (SW + ["--image-size", "8"], "--image-size"),
    # demo
    (["demo", "--device", "foo", "--out", "d_out"], "--device"),            # 26
    (["demo", "--images", "0", "--out", "d_out"], "--images"),
    (["demo", "--seed", "-1", "--out", "d_out"], "--seed"),
    (["demo", "--L", "0", "--out", "d_out"], "--L"),
    (["demo", "--threads", "0", "--out", "d_out"], "--threads"),
    (["demo", "--workers", "0", "--out", "d_out"], "--workers"),
    (["demo", "--out", "{f}/rows.npz"], "--out"),
    # tune: inputs and outputs before any tuning
    (TU + ["--out", "/proc/sched.json"], "--out"),                          # 26
    (TU + ["--out", "{f}/adir"], "--out"),                                  # 26 (a directory)
    (TU + ["--out", "nodir/s.json"], "--out"),
    (["tune", "--record", "{f}/truncated.npz", "--tokens-per-call", "1.2"], "--record"),   # 26
    (["tune", "--record", "{f}/flipped.npz", "--tokens-per-call", "1.2"], "--record"),     # 26
    (["tune", "--record", "{f}/empty.npz", "--tokens-per-call", "1.2"], "--record"),       # 26
    (["tune", "--record", "{f}/text.npz", "--tokens-per-call", "1.2"], "--record"),        # 26
    (["tune", "--record", "{f}/obj.npz", "--tokens-per-call", "1.2"], "--record"),
    (["tune", "--record", "{f}/nokeys.npz", "--tokens-per-call", "1.2"], "--record"),
    (["tune", "--record", "{f}/badshape.npz", "--tokens-per-call", "1.2"], "--record"),
    (["tune", "--record", "{f}/missing.npz", "--tokens-per-call", "1.2"], "--record"),
    (["tune", "--record", "{f}/adir", "--tokens-per-call", "1.2"], "--record"),
    (["tune", "--record", "{f}/rows.npz", "--bound-budget", "-1"], "--bound-budget"),
    (["tune", "--objective", "bound", "--record", "{f}/rows.npz", "--tokens-per-call", "1.2", "--save-record",
      "{f}/hardlink.npz"], "--save-record"),                                                    # 41: a hard link
    (["tune", "--objective", "bound", "--record", "{f}/symlink.npz", "--tokens-per-call", "1.2", "--out",
      "{f}/rows.npz"], "--out"),                                                                # 41: a symbolic link
    (["tune", "--model", "mnist", "--record-images", "4", "--ar-images", "4", "--kl-budget", "0.1", "--out", "o.npz",
      "--save-record", "o.npz"], "also --out"),                                                # 41: two outputs
    (["tune", "--objective", "bound", "--record", "{f}/rows.npz", "--tokens-per-call", "1.2", "--save-record",
      "o.npz"], "--save-record"),                                       # 50: --save-record with --record writes nothing
    (["tune", "--record", "{f}/rows.npz", "--bound-budget", "nan"], "--bound-budget"),
    (["tune", "--record", "{f}/rows.npz", "--tokens-per-call", "0.5"], "--tokens-per-call"),
    (["tune", "--record", "{f}/rows.npz", "--tokens-per-call", "inf"], "--tokens-per-call"),
    (TU + ["--max-rounds", "1"], "--max-rounds"),
    (TU + ["--frontier", "-1"], "--frontier"),
    (TU + ["--seed", "-1"], "--seed"),
    (["tune", "--objective", "bound", "--record", "{f}/rows.npz", "--tokens-per-call", "99"], "tokens_per_call"),
    # theory
    (TB + ["--V", "4", "--L", "1000000"], "--L"),                           # 26
    (TB + ["--V", "1"], "--V"),
    (TB + ["--L", "0"], "--L"),
    (TB + ["--tv", "1.5"], "--tv"),
    (TB + ["--tv", "nan"], "--tv"),
    (TB + ["--seed", "-1"], "--seed"),
    (TB + ["--V", "100000"], "--V"),
    (TB + ["--max-seconds", "-1"], "--max-seconds"),
    (AN + ["--Vs", "20000"], "--Vs"),                                       # 26
    (AN + ["--Vs", "1"], "--Vs"),
    (AN + ["--Ls", "0"], "--Ls"),
    (AN + ["--seeds", "0"], "--seeds"),
    (AN + ["--points", "1"], "--points"),
    (AN + ["--fractions", "1.5"], "--fractions"),
    (AN + ["--tvs", "-0.1"], "--tvs"),
    (AN + ["--Ls", "400", "--Vs", "200"], "--Vs"),
    (["theory", "anneal", "--out", "{f}/rows.npz"], "--out"),
    # sim
    (SV + ["--n-rounds", str(10**12)], "--n-rounds"),                       # 26
    (SV + ["--n-rounds", "0"], "--n-rounds"),
    (SV + ["--alpha", "0"], "--alpha"),
    (SV + ["--alpha", "1.5"], "--alpha"),
    (SV + ["--se", "0"], "--se"),
    (SV + ["--z-max", "-1"], "--z-max"),
    (SV + ["--tv-bias", "nan"], "--tv-bias"),
    (SV + ["--paths", "foo"], "--paths"),
    (SV + ["--seed", "-1"], "--seed"),
    (SS + ["--n-rounds", str(10**12)], "--n-rounds"),                       # 26
    (SS + ["--L", "100000"], "--n-"),                                       # 26 (the rounds of L = 10^5)
    (SS + ["--L", "0"], "--L"),
    (SS + ["--k", "0"], "--k"),
    (SS + ["--n-rounds", "1"], "--n-rounds"),
    (SS + ["--n-images", "1"], "--n-images"),
    (SS + ["--V", "1"], "--V"),
    (SS + ["--ambiguity", "0"], "--ambiguity"),
    (SS + ["--which", "nope"], "--which"),
    (SS + ["--grid-size", "1"], "--grid-size"),
    (SS + ["--figure", "/proc/f.png"], "--figure"),
    (SS + ["--seed", "-1"], "--seed"),
]


def _argv(argv, files):
    return [a.replace("{f}", str(files)) for a in argv]


def _snapshot(d: pathlib.Path) -> set:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


@pytest.mark.parametrize("argv,name", CLI_PROBES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in CLI_PROBES])
def test_cli_probe(argv, name, files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before_inputs = _snapshot(files)
    t0 = time.perf_counter()
    rc = main(_argv(argv, files))
    dt = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("coolsd: warning:")]
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("coolsd: error: "), err
    assert "Traceback" not in err
    assert name.replace("{f}", str(files)) in lines[0], (name, err)
    assert dt < CLI_SECONDS, f"{dt:.1f} s"
    assert _snapshot(tmp_path) == set(), "a refused run wrote files"
    assert _snapshot(files) == before_inputs


def test_catalogue_holds_enough_probes():
    assert len(CLI_PROBES) + len(API_PROBES) >= 150


def test_damaged_sweep_unit_and_manifest_named_before_work(tmp_path, monkeypatch, capsys):   # 26
    from coolsd.cli import build_parser
    from coolsd.commands.sweep import config
    from coolsd.studies.sweep.run import plan_units
    from coolsd.studies.sweep.store import Store

    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--out", "s", "--model", "mnist", "--images", "2", "--unit-images", "2", "--grid", "vanilla",
            "--no-progress"]
    cfg = config(build_parser().parse_args(argv))
    store = Store("s", cfg.identity())
    store.open(create=True)
    u = plan_units(cfg)[1]
    path = store.unit_path(u.slug, u.index)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK\x03\x04 truncated")
    before = _snapshot(tmp_path)
    t0 = time.perf_counter()
    capsys.readouterr()
    assert main(argv) == 2
    err = "\n".join(ln for ln in capsys.readouterr().err.splitlines() if "warning" not in ln) + "\n"
    assert err.count("\n") == 1 and "unit file" in err and str(path.name) in err and "delete it" in err, err
    assert time.perf_counter() - t0 < CLI_SECONDS and _snapshot(tmp_path) == before
    (tmp_path / "s" / "manifest.json").write_text("{not json")
    assert main(argv) == 2
    err = "\n".join(ln for ln in capsys.readouterr().err.splitlines() if "warning" not in ln) + "\n"
    assert err.count("\n") == 1 and "manifest" in err and "manifest.json" in err, err


def test_bound_budget_zero_returns_the_vanilla_weights(files, tmp_path, capsys):               # 26
    out = tmp_path / "s.json"
    t0 = time.perf_counter()
    assert main(["tune", "--record", str(files / "rows.npz"), "--bound-budget", "0", "--out", str(out), "--json"]) == 0
    assert time.perf_counter() - t0 < CLI_SECONDS
    res = json.loads(out.read_text())
    assert res["weights"] == [1.0, 1.0] and abs(res["predicted_bound"]) < 1e-15   # T11 of vanilla: 0 (round-off)
    lv = tune.tune(recorded.load_rows(files / "rows.npz"), "level", bound_budget=0)
    assert list(lv.values) == [0.0, 0.0] and abs(lv.bound) < 1e-15
    van = tune.predict(recorded.load_rows(files / "rows.npz"), rules.vanilla())
    assert lv.tokens_per_call == pytest.approx(van["tokens_per_call"], rel=1e-12)


def test_newcomer_warnings(tmp_path, monkeypatch, capsys):
    """A sweep below the minimum image count warns (before any work) that its intervals are unreliable."""
    from coolsd.cli import build_parser
    from coolsd.commands.sweep import config
    from coolsd.quality.estimators import MIN_RELIABLE_IMAGES

    config(build_parser().parse_args(["sweep", "--out", "x", "--model", "mnist", "--images", "16"]))
    assert "unreliable" in capsys.readouterr().err
    config(build_parser().parse_args(["sweep", "--out", "x", "--model", "mnist", "--images",
                                      str(MIN_RELIABLE_IMAGES)]))
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- issue 41: the classes, each with a control

def test_input_file_refuses_what_is_not_a_regular_file_of_its_format(files, tmp_path):
    """theory.core.files.input_file (coolsd.io.check_input_file): a FIFO, a device, a directory, an empty, an
    oversized or a wrong-format file is one line naming the option, before the file is opened (a FIFO would block:
    the call must return at once); a good file of each format passes (the control)."""
    from coolsd.io import check_input_file

    (tmp_path / "s.json").write_text('{"weights": [1, 1]}')
    assert check_input_file("--weights", tmp_path / "s.json", "json") == {"weights": [1, 1]}       # controls
    assert check_input_file("--record", files / "rows.npz", "npz") == str(files / "rows.npz")
    bad = [(files / "fifo", "npz", "FIFO"), ("/dev/zero", "npz", "device"), (files / "adir", "json", "directory"),
           (files / "empty.npz", "npz", "empty"), (files / "pickled.npy", "npz", ".npy"),
           (files / "text.npz", "npz", "not an .npz"), (files / "list.json", "json", "int"),
           (files / "rows.npz", "json", "not a JSON file"), (files / "pickled.npy", "json", ".npy"),
           (files / "text.npz", "json", "not JSON"), (tmp_path / "missing.json", "json", "does not exist")]
    for path, kind, what in bad:
        t0 = time.perf_counter()
        with pytest.raises(ValueError) as e:
            check_input_file("--opt", path, kind)
        assert "--opt" in str(e.value) and what in str(e.value) and "\n" not in str(e.value), (path, e.value)
        assert time.perf_counter() - t0 < API_SECONDS
    with pytest.raises(ValueError, match="above the 10 bytes"):
        check_input_file("--opt", files / "rows.npz", "npz", max_bytes=10)


def test_float_parameters_that_overflow_float32_are_refused():
    """--nu 1e308 made the weights NaN (inf in float32) and 1.00 tokens per call; the largest float32 still passes."""
    from theory.rules import methods as registry

    nu = {p.name: p for p in registry.get("cool-sd").free}["nu"]
    with pytest.raises(ValueError, match="float32"):
        nu.check("cool-sd", 1e308)
    assert nu.check("cool-sd", 3e38) == 3e38                                                      # control
    import torch

    v = registry.build("cool-sd", 4, nu=3e38)
    p = torch.full((4, 5), 0.2)
    f = v.accept(p, p, torch.arange(1, 5)[:, None])             # float32 rows, as the engine verifies them
    assert bool(torch.isfinite(f).all()) and bool((f == 1).all())
    with pytest.raises(ValueError, match="float32"):
        registry.build("cool-sd", 4, nu=1e308)


def test_log_likelihood_caps_L_at_T_minus_one():
    """L = 10**7 on T = 6 returns the L = 5 value at once (it took a minute and 4 GB); L = 4 differs (the control:
    the cap is not a change of L that the figures would not show)."""
    from theory.likelihood.chain import log_likelihood

    rng = np.random.default_rng(0)
    T, V = 6, 5
    p, q = rng.dirichlet(np.ones(V), size=(3, T)), rng.dirichlet(np.ones(V), size=(3, T))
    x = rng.integers(0, V, (3, T))
    v = rules.cool_sd(2.0)
    t0 = time.perf_counter()
    big = log_likelihood(p, q, x, v, 10**7)
    assert time.perf_counter() - t0 < API_SECONDS
    np.testing.assert_array_equal(big, log_likelihood(p, q, x, v, T - 1))
    assert not np.allclose(log_likelihood(p, q, x, v, T - 2), big)
    qo = rng.dirichlet(np.ones(V), size=(3, T, 8))             # per-offset q of L = 8: cut to T - 1 offsets
    np.testing.assert_array_equal(log_likelihood(p, qo, x, v, 8), log_likelihood(p, qo[..., :T - 1, :], x, v, T - 1))


def test_gsd_window_capped_at_2V_gives_the_same_groups():
    """--gsd-window 100000 allocated until it failed; from 2V on every slice is the whole vocabulary, so the cap is
    exact (checked against the uncapped groups); a window below 2V differs (the control)."""
    from theory.rules.gsd import Grouped

    rng = np.random.default_rng(1)
    V = 7
    p, q = rng.dirichlet(np.ones(V) * 0.5, size=4), rng.dirichlet(np.ones(V) * 0.5, size=4)
    uncapped = type("Uncapped", (Grouped,), {"effective_window": lambda self, V: self.window})
    for w in (2 * V, 2 * V + 3, 5 * V):
        np.testing.assert_allclose(Grouped(window=w, p_threshold=0.3)(p, q, 1),
                                   uncapped(window=w, p_threshold=0.3)(p, q, 1))
    t0 = time.perf_counter()
    huge = Grouped(window=10**9, p_threshold=0.3)(p, q, 1)
    assert time.perf_counter() - t0 < API_SECONDS
    np.testing.assert_allclose(huge, Grouped(window=2 * V, p_threshold=0.3)(p, q, 1))
    assert not np.allclose(Grouped(window=1, p_threshold=0.3)(p, q, 1), huge)


def test_nan_images_are_refused_naming_the_file():
    import torch

    from coolsd.quality.evaluate import check_finite_images

    x = torch.zeros(4, 3, 8, 8)
    check_finite_images(x, "units of vanilla in 'DIR/units/vanilla'")                           # control
    x[2, 1, 3, 3] = float("nan")
    with pytest.raises(ValueError, match=r"DIR/units/vanilla.*image 12 holds NaN"):
        check_finite_images(x, "units of vanilla in 'DIR/units/vanilla'", offset=10)


def test_quality_reference_that_is_not_an_npz_is_one_line(files, tmp_path):
    """--quality-ref given a .npy, a truncated .npz or a FIFO: one line naming the flag (a raw TypeError /
    BadZipFile / a block before); an ADM npz of images reads (the control)."""
    from coolsd.quality import read_adm_npz

    good = tmp_path / "ref.npz"
    np.savez(good, arr_0=np.zeros((3, 8, 8, 3), np.uint8))
    assert read_adm_npz(good).images.shape == (3, 8, 8, 3)
    for bad in ("pickled.npy", "truncated.npz", "flipped.npz", "fifo", "text.npz"):
        with pytest.raises(ValueError) as e:
            read_adm_npz(files / bad)
        assert str(e.value).startswith("--quality-ref") and "\n" not in str(e.value), (bad, e.value)


def _store_with_units(tmp_path, seed=0, images=4):
    """A sweep store of the config the CLI would build (mnist, vanilla, 2-image units) with every planned unit
    written as the sweep writes it (synthetic tokens: no model runs)."""
    from coolsd.cli import build_parser
    from coolsd.commands.sweep import config
    from coolsd.studies.sweep.run import plan_units, unit_expectation
    from coolsd.studies.sweep.store import Store

    argv = ["sweep", "--out", str(tmp_path / f"s{seed}"), "--model", "mnist", "--images", str(images),
            "--unit-images", "2", "--grid", "vanilla", "--seed", str(seed), "--no-progress"]
    cfg = config(build_parser().parse_args(argv))
    store = Store(tmp_path / f"s{seed}", cfg.identity())
    store.open(create=True)
    for u in plan_units(cfg):
        lo = u.index * cfg.unit_images
        store.write_unit(u.slug, u.index, {"tokens": np.zeros((2, 49), np.int64), "image_index": np.arange(lo, lo + 2)},
                         {**unit_expectation(cfg, u), "code_version": "test"})
    return cfg, store, argv


def _mutations():
    """(name, f(path, store, other_store)) damaging, replacing or editing one stored unit; each must be refused."""
    import json as _json

    def edit_meta(key, value):
        def f(path, store, other):
            z = dict(np.load(path))
            meta = _json.loads(str(z.pop("meta")))
            meta[key] = value
            np.savez(path, meta=np.array(_json.dumps(meta)), **z)
        return f

    def edit_array(key, value):
        def f(path, store, other):
            z = dict(np.load(path))
            z[key] = value
            np.savez(path, **z)
        return f

    def foreign(path, store, other):           # the same unit of a --seed 1 sweep, copied in
        path.write_bytes(other.unit_path(*path.relative_to(store.root / "units").parts[:1], 1).read_bytes())

    return [("truncated", lambda path, s, o: path.write_bytes(path.read_bytes()[:100])),
            ("flipped", lambda path, s, o: path.write_bytes(bytes(b ^ 0xFF if i == 200 else b
                                                                  for i, b in enumerate(path.read_bytes())))),
            ("empty", lambda path, s, o: path.write_bytes(b"")),
            ("foreign seed", foreign),
            ("base seed", edit_meta("base_seed", 7)), ("unit seed", edit_meta("seed", 12345)),
            ("setting", edit_meta("key", "cool-sd:delta=2")), ("block", edit_meta("index", 0)),
            ("image range", edit_meta("images", [0, 2])), ("identity", edit_meta("identity", "0" * 16)),
            ("no meta", lambda path, s, o: np.savez(path, tokens=np.zeros((2, 49)))),
            ("image indices", edit_array("image_index", np.arange(2))),
            ("image count", edit_array("tokens", np.zeros((5, 49), np.int64)))]


def test_sweep_store_fuzz_refuses_damaged_foreign_and_mismatched_units(tmp_path):
    """Store units carry setting, seed, base seed, image range and the sweep's identity; Store.check_units opens
    and compares every one before the first new unit. The untouched store passes (control); every mutation of the
    second block's units is refused naming the file; and a check without the expectations (how the store was
    read before issue 41) misses the foreign unit: the negative control that the fuzz can fail."""
    import shutil

    from coolsd.studies.sweep.run import plan_units, unit_expectation

    cfg, store, _ = _store_with_units(tmp_path, seed=0)
    _, other, _ = _store_with_units(tmp_path, seed=1)
    units = plan_units(cfg)
    expect = lambda u: unit_expectation(cfg, u)      # noqa: E731
    assert store.check_units(units, expect) == len(units)                                     # control: all good
    clean = tmp_path / "clean"
    shutil.copytree(store.root, clean)
    rng = np.random.default_rng(0)
    for name, mutate in _mutations():
        shutil.rmtree(store.root)
        shutil.copytree(clean, store.root)
        u = [v for v in units if v.index == 1][int(rng.integers(2))]        # AR or vanilla, block 1
        path = store.unit_path(u.slug, u.index)
        mutate(path, store, other)
        with pytest.raises(ValueError) as e:
            store.check_units(units, expect)
        msg = str(e.value)
        assert "\n" not in msg and path.name in msg and "unit file" in msg, (name, msg)
        if name == "foreign seed":
            assert store.check_units(units) == len(units)      # the negative control: undetected without them


def test_sweep_seed_copied_unit_refused_before_work_and_L49_works(tmp_path, monkeypatch, capsys):
    """The issue's examples end to end: sweep --images 2 --L 49 (valid for generate) works and writes its report
    (it failed in the merge, and --images 2 in the report); a unit from a --seed 1 sweep copied in is refused before
    any new unit is generated, nothing written (it was merged without a word)."""
    import json as _json

    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--out", "s", "--model", "mnist", "--images", "2", "--unit-images", "2", "--grid", "vanilla",
            "--L", "49", "--no-progress"]
    assert main(argv) == 0
    assert (tmp_path / "s" / "report.json").exists()
    rep = _json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["config"]["L"] == 49 and rep["config"]["images"] == 2
    unit = next((tmp_path / "s" / "units").glob("vanilla*/u000000.npz"))
    z = dict(np.load(unit))
    meta = _json.loads(str(z.pop("meta")))
    meta["base_seed"] = 1                        # as a --seed 1 sweep's unit carries
    np.savez(unit, meta=np.array(_json.dumps(meta)), **z)
    before = _snapshot(tmp_path)
    capsys.readouterr()
    assert main([*argv[:6], "4", *argv[7:]]) == 2        # --images 4: one new block to make
    err = [ln for ln in capsys.readouterr().err.splitlines() if "warning" not in ln]
    assert len(err) == 1 and "base_seed 1" in err[0] and unit.name in err[0], err
    assert _snapshot(tmp_path) == before


# --------------------------------------------------------------------------- API probes

def _ll(*a):
    from theory.likelihood.chain import log_likelihood

    return log_likelihood(*a)


_LL = (np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3), np.array([0, 1]))

P4, Q4 = chains.random_pair(4, seed=0)
F4, G4 = markov.rule_tables(P4, Q4, 2, rules.vanilla())
_A = _rows_arrays()
ROWS = recorded.Rows(_A["p"], _A["q"], _A["drafts"], _A["n_drafted"], _A["image"])
_p, _q, _d = _A["p"], _A["q"], _A["drafts"]


def _tiny():
    from real.registry import tiny_llamagen_pair

    global _TINY
    if "_TINY" not in globals():
        _TINY = tiny_llamagen_pair(0)
    return _TINY


def _gen(**kw):
    from real.decode import engine

    t, d = _tiny()
    args = dict(num_tokens=4, verifier=rules.vanilla(), drafting=2)
    args.update(kw)
    draft = args.pop("draft", d)
    target = args.pop("target", t)
    return engine.generate(target, draft, [1], **args)


def _build(**kw):
    from real.registry import build

    return build(kw.pop("model", "mnist"), **kw)


E = (ValueError, TypeError)
API_PROBES = [
    # verifier objects (26): None, a method name, a class, a number
    ("rule_tables verifier None", lambda: markov.rule_tables(P4, Q4, 2, None), TypeError, "verifier"),
    ("rule_tables verifier str", lambda: markov.rule_tables(P4, Q4, 2, "cool-sd"), TypeError, "verifier"),
    ("rule_tables verifier class", lambda: markov.rule_tables(P4, Q4, 2, rules.Verifier), TypeError, "verifier"),
    ("rule_tables verifier int", lambda: markov.rule_tables(P4, Q4, 2, 3), TypeError, "verifier"),
    ("simulate_rule verifier None", lambda: sim.simulate_rule(P4, Q4, None, 2, 0, 10), TypeError, "verifier"),
    ("simulate_rule verifier str", lambda: sim.simulate_rule(P4, Q4, "cool-sd", 2, 0, 10), TypeError, "verifier"),
    ("predict_rounds verifier None", lambda: recorded.predict_rounds(_p, _q, _d, None), TypeError, "verifier"),
    ("predict_rounds verifier str", lambda: recorded.predict_rounds(_p, _q, _d, "cool-sd"), TypeError, "verifier"),
    ("engine verifier None", lambda: _gen(verifier=None), TypeError, "verifier"),
    ("engine verifier str", lambda: _gen(verifier="cool-sd"), TypeError, "verifier"),
    ("tune rows None", lambda: tune.tune(None, tokens_per_call=1.2), TypeError, "rows"),
    ("tune rows str", lambda: tune.tune("rows.npz", tokens_per_call=1.2), TypeError, "rows"),
    # integers that must be integers (26)
    ("engine num_tokens 2.7", lambda: _gen(num_tokens=2.7), E, "num_tokens"),
    ("engine num_tokens '16'", lambda: _gen(num_tokens="16"), E, "num_tokens"),
    ("engine num_tokens 0", lambda: _gen(num_tokens=0), E, "num_tokens"),
    ("engine num_tokens True", lambda: _gen(num_tokens=True), E, "num_tokens"),
    ("engine seed -1", lambda: _gen(seed=-1), E, "seed"),
    ("engine seed 1.5", lambda: _gen(seed=1.5), E, "seed"),
    ("engine seed None", lambda: _gen(seed=None), E, "seed"),
    ("engine L 2.7", lambda: _gen(drafting=2.7), E, "L"),
    ("engine L 0", lambda: _gen(drafting=0), E, "L"),
    ("engine L 10**5", lambda: _gen(drafting=10**5), E, "L"),
    ("engine batch_size 0", lambda: _gen(batch_size=0), E, "batch_size"),
    ("engine batch_size 1.5", lambda: _gen(batch_size=1.5), E, "batch_size"),
    ("engine target is draft", lambda: _gen(draft=_tiny()[0]), E, "draft"),             # 26
    ("engine target None", lambda: _gen(target=None), E, "target"),
    ("engine conds str", lambda: __import__("real.decode.engine", fromlist=["x"]).generate(
        *_tiny(), ["cat"], num_tokens=4, verifier=rules.vanilla(), drafting=2), E, "conds[0]"),                # 26
    ("engine conds float", lambda: __import__("real.decode.engine", fromlist=["x"]).generate(
        *_tiny(), [1.5], num_tokens=4, verifier=rules.vanilla(), drafting=2), E, "conds[0]"),
    ("engine conds None", lambda: __import__("real.decode.engine", fromlist=["x"]).generate(
        _tiny()[0], None, [None], num_tokens=4), E, "conds[0]"),
    ("rule_tables L 2.7", lambda: markov.rule_tables(P4, Q4, 2.7, rules.vanilla()), E, "L"),
    ("rule_tables L '2'", lambda: markov.rule_tables(P4, Q4, "2", rules.vanilla()), E, "L"),
    ("rule_tables L 0", lambda: markov.rule_tables(P4, Q4, 0, rules.vanilla()), E, "L"),
    ("simulate n_rounds 2.5", lambda: sim.simulate(P4, Q4, F4, G4, 0, 2.5), E, "n_rounds"),
    ("simulate n_rounds '10'", lambda: sim.simulate(P4, Q4, F4, G4, 0, "10"), E, "n_rounds"),
    ("simulate n_rounds 0", lambda: sim.simulate(P4, Q4, F4, G4, 0, 0), E, "n_rounds"),
    ("simulate seed -1", lambda: sim.simulate(P4, Q4, F4, G4, 0, 10, -1), E, "seed"),
    ("simulate_rule L 0", lambda: sim.simulate_rule(P4, Q4, rules.vanilla(), 0, 0, 10), E, "L"),
    ("simulate_rule chunk 0", lambda: sim.simulate_rule(P4, Q4, rules.vanilla(), 2, 0, 10, chunk=0), E, "chunk"),
    ("tune n_random -1", lambda: tune.tune(ROWS, tokens_per_call=1.2, n_random=-1), E, "n_random"),        # 26
    ("tune n_random 1.5", lambda: tune.tune(ROWS, tokens_per_call=1.2, n_random=1.5), E, "n_random"),
    ("tune seed -1", lambda: tune.tune(ROWS, tokens_per_call=1.2, seed=-1), E, "seed"),
    ("tune maxiter 0", lambda: tune.tune(ROWS, tokens_per_call=1.2, maxiter=0), E, "maxiter"),
    ("tune search_rounds 1", lambda: tune.tune(ROWS, tokens_per_call=1.2, search_rounds=1), E, "search_rounds"),
    ("tune family", lambda: tune.tune(ROWS, "nope", tokens_per_call=1.2), E, "family"),
    ("tune both", lambda: tune.tune(ROWS, tokens_per_call=1.2, bound_budget=0.1), E, "tokens_per_call"),
    ("tune neither", lambda: tune.tune(ROWS), E, "tokens_per_call"),
    ("tune budget -1", lambda: tune.tune(ROWS, bound_budget=-1), E, "bound_budget"),
    ("tune budget nan", lambda: tune.tune(ROWS, bound_budget=float("nan")), E, "bound_budget"),
    ("tune target nan", lambda: tune.tune(ROWS, tokens_per_call=float("nan")), E, "tokens_per_call"),
    ("tune target str", lambda: tune.tune(ROWS, tokens_per_call="1.2"), E, "tokens_per_call"),
    # ranges (26)
    ("cool_sd nu -1", lambda: rules.cool_sd(2.0, nu=-1), E, "nu"),
    ("cool_sd nu nan", lambda: rules.cool_sd(2.0, nu=float("nan")), E, "nu"),
    ("cool_sd nu str", lambda: rules.cool_sd(2.0, nu="0.7"), E, "nu"),
    ("cool_sd delta 0", lambda: rules.cool_sd(0.0), E, "delta"),
    ("cool_sd delta -1", lambda: rules.cool_sd(-1.0), E, "delta"),
    ("cool_sd delta None", lambda: rules.cool_sd(None), E, "delta"),
    ("level 1.5", lambda: rules.level([1.5, .5, .5, .5]), E, "levels"),                  # 26
    ("level -0.1", lambda: rules.level([-0.1]), E, "levels"),
    ("level nan", lambda: rules.level([float("nan")]), E, "levels"),
    ("level empty", lambda: rules.level([]), E, "levels"),
    ("level str", lambda: rules.level("abc"), E, "levels"),
    ("level None", lambda: rules.level(None), E, "levels"),
    ("level ragged", lambda: rules.level([[0.1], [0.1, 0.2]]), E, "levels"),
    ("uniform_rsd 0", lambda: rules.uniform_rsd(0.0), E, "c"),
    ("uniform_rsd str", lambda: rules.uniform_rsd("1.5"), E, "c"),
    ("linear_rsd L 0", lambda: rules.linear_rsd(2.0, 1.0, 0), E, "L"),
    ("typical eps -1", lambda: rules.typical(eps=-1), E, "eps"),
    ("scaled explicit empty", lambda: rules.scaled(rules.Explicit(())), E, "weight"),
    # arrays: None, lists, NaN, shapes
    ("rule_tables P None", lambda: markov.rule_tables(None, Q4, 2, rules.vanilla()), E, "P"),
    ("rule_tables P str", lambda: markov.rule_tables("P", Q4, 2, rules.vanilla()), E, "P"),
    ("rule_tables P nan", lambda: markov.rule_tables(np.full((4, 4), np.nan), Q4, 2, rules.vanilla()), E, "P"),
    ("rule_tables P not stochastic", lambda: markov.rule_tables(P4 * 2, Q4, 2, rules.vanilla()), E, "P"),
    ("rule_tables Q shape", lambda: markov.rule_tables(P4, Q4[:3], 2, rules.vanilla()), E, "Q"),
    ("rule_tables ragged list", lambda: markov.rule_tables([[1.0], [0.5, 0.5]], Q4, 2, rules.vanilla()), E, "P"),
    ("rule_tables complex", lambda: markov.rule_tables(P4 + 0j, Q4, 2, rules.vanilla()), E, "P"),
    ("simulate F shape", lambda: sim.simulate(P4, Q4, F4[:, :3], G4, 0, 10), E, "F"),
    ("simulate F > 1", lambda: sim.simulate(P4, Q4, F4 * 2, G4, 0, 10), E, "acceptance"),
    ("simulate G nan", lambda: sim.simulate(P4, Q4, F4, G4 * np.nan, 0, 10), E, "G"),
    ("simulate init 9", lambda: sim.simulate(P4, Q4, F4, G4, 9, 10), E, "init"),
    ("simulate init nan", lambda: sim.simulate(P4, Q4, F4, G4, np.full(4, np.nan), 10), E, "init"),
    ("simulate backend", lambda: sim.simulate(P4, Q4, F4, G4, 0, 10, backend="tpu"), E, "backend"),
    ("predict_rounds p None", lambda: recorded.predict_rounds(None, _q, _d, rules.vanilla()), E, "p"),
    ("predict_rounds p nan", lambda: recorded.predict_rounds(_p * np.nan, _q, _d, rules.vanilla()), E, "p"),
    ("predict_rounds drafts float", lambda: recorded.predict_rounds(_p, _q, _d * 1.0, rules.vanilla()), E, "drafts"),
    ("predict_rounds drafts V", lambda: recorded.predict_rounds(_p, _q, _d + 9, rules.vanilla()), E, "drafts"),
    ("predict_rounds shape", lambda: recorded.predict_rounds(_p[:, :2], _q, _d, rules.vanilla()), E, "p"),
    ("predict_rounds ragged", lambda: recorded.predict_rounds([[[1.0]], [[0.5, 0.5]]], _q, _d, rules.vanilla()),
     E, "p"),
    ("load_rows missing", lambda: recorded.load_rows("/nonexistent.npz"), E, "record"),
    ("load_rows /etc/passwd", lambda: recorded.load_rows("/etc/passwd"), E, "record"),
    ("Rows R=1", lambda: recorded.Rows(_p[:1], _q[:1], _d[:1], None, None), E, "rows"),
    # cost before work (26)
    ("rule_tables L 10**7", lambda: markov.rule_tables(P4, Q4, 10**7, rules.vanilla()), checks.SizeError, "L="),
    ("rule_tables V 2000", lambda: markov.rule_tables(np.full((2000, 2000), 1 / 2000), np.full((2000, 2000), 1 / 2000),
                                                       100, rules.vanilla()), checks.SizeError, "V=2000"),
    ("simulate 10**12", lambda: sim.simulate(P4, Q4, F4, G4, 0, 10**12), checks.SizeError, "rounds"),   # 26
    ("simulate_rule 10**12", lambda: sim.simulate_rule(P4, Q4, rules.vanilla(), 2, 0, 10**12), checks.SizeError,
     "rounds"),
    ("simulate_rule L 10**5", lambda: sim.simulate_rule(P4, Q4, rules.vanilla(), 10**5, 0, 10**5), checks.SizeError,
     "rounds"),
    ("exact_tv huge", lambda: markov.exact_tv(P4, Q4, *markov.rule_tables(P4, Q4, 300, rules.vanilla()), 0),
     E, "max_sequences"),
    ("engine conds 10**7", lambda: _gen(num_tokens=4, drafting=2, target=_tiny()[0]) if False else
     __import__("real.decode.checks", fromlist=["x"]).generate_args(_tiny()[0], _tiny()[1], list(range(10**7)),
     num_tokens=4, verifier=rules.vanilla(), mode=__import__("real.decode.chain", fromlist=["x"]).Chain(2), seed=0,
     batch_size=None,
     processing=__import__("real.decode.sampling", fromlist=["x"]).Processing()), E, "conds"),
    # the model spec at the API (registry.build runs the same generic check as the CLI)
    ("build vq_ckpt mnist", lambda: _build(vq_ckpt="/etc/passwd"), E, "--vq-ckpt"),
    ("build unknown model", lambda: _build(model="nope"), E, "model"),
    ("build draft bogus", lambda: _build(draft="bogus"), E, "--draft"),
    ("build class_id -1", lambda: _build(class_id=-1), E, "--class-id"),
    ("build class_id 1.5", lambda: _build(class_id=1.5), E, "--class-id"),
    ("build prompts mnist", lambda: _build(prompts=["a"]), E, "--prompts"),
    ("build unknown option", lambda: _build(colour="red"), E, "colour"),
    ("build opts type", lambda: __import__("real.registry", fromlist=["x"]).build("mnist", {"draft": "small"}),
     TypeError, "opts"),
    ("build hf draft", lambda: _build(model="hf-llama-tiny", draft="eagle"), E, "--draft"),
    ("build llamagen no ckpt", lambda: _build(model="llamagen", draft="layerskip"), E, "--target-ckpt"),
    ("build t2i class_id", lambda: _build(model="llamagen-tiny-t2i", class_id=1), E, "--class-id"),
    ("register no spec", lambda: __import__("real.registry", fromlist=["x"]).register("ghost", lambda o: None),
     E, "spec"),
    # theory.rules.methods and friends
    ("methods.build unknown", lambda: __import__("theory.rules.methods", fromlist=["x"]).build("nope", 4), E, "nope"),
    ("image batch rounds B 0", lambda: __import__("theory.markov.image", fromlist=["x"]).expected_batch_rounds([3, 4], 0),
     E, "B"),
    ("checks.verifier list", lambda: checks.verifier([rules.vanilla()]), TypeError, "verifier"),
    ("checks.array dict", lambda: checks.array("x", {"a": 1}), TypeError, "x"),
    ("checks.unit_interval 2", lambda: checks.unit_interval("w", 2.0), E, "w"),
    ("checks.npz_arrays dir", lambda: checks.npz_arrays("--record", "/tmp"), E, "--record"),
    # issue 41: wrong types at log_likelihood, files at the npz reader
    ("log_likelihood p None", lambda: _ll(None, _LL[1], _LL[2], rules.vanilla(), 2), TypeError, "p"),
    ("log_likelihood tokens str", lambda: _ll(_LL[0], _LL[1], "01", rules.vanilla(), 2), TypeError, "tokens"),
    ("log_likelihood verifier None", lambda: _ll(*_LL, None, 2), E, "verifier"),
    ("log_likelihood verifier name", lambda: _ll(*_LL, "cool-sd", 2), E, "verifier"),
    ("log_likelihood L str", lambda: _ll(*_LL, rules.vanilla(), "2"), E, "L"),
    ("checks.npz_arrays device", lambda: checks.npz_arrays("--record", "/dev/zero"), E, "device"),
    ("quality.fid ref None", lambda: __import__("coolsd.quality.metrics", fromlist=["x"]).fid(None, np.zeros((3, 2))),
     TypeError, "ref"),
    ("quality.kid ref path", lambda: __import__("coolsd.quality.metrics", fromlist=["x"]).kid("ref.npz", np.zeros((3, 2))),
     TypeError, "ref"),
    ("methods.build nu overflow", lambda: __import__("theory.rules.methods", fromlist=["x"]).build("cool-sd", 4, nu=1e308),
     E, "float32"),
]


@pytest.mark.parametrize("case", API_PROBES, ids=[c[0] for c in API_PROBES])
def test_api_probe(case):
    label, call, exc, name = case
    if label.startswith("engine"):
        _tiny()                      # the models are built once, outside the timed call
    t0 = time.perf_counter()
    with pytest.raises(exc) as ei:
        call()
    msg = str(ei.value)
    assert msg and "\n" not in msg and name in msg, msg
    assert isinstance(ei.value, (ValueError, TypeError))
    assert time.perf_counter() - t0 < API_SECONDS


def test_api_examples_that_now_work():
    """The right result, not an error: lists are converted, a budget of 0 is vanilla."""
    F, G = markov.rule_tables(P4.tolist(), Q4.tolist(), 2, rules.cool_sd(2.0))
    F2, G2 = markov.rule_tables(P4, Q4, 2, rules.cool_sd(2.0))
    np.testing.assert_array_equal(F, F2)
    pr = recorded.predict_rounds(_p.tolist(), _q.tolist(), _d.tolist(), rules.vanilla())
    np.testing.assert_allclose(pr.accepted, recorded.predict_rounds(_p, _q, _d, rules.vanilla()).accepted)
    assert rules.level([0.0, 1.0]).accept.levels.weights == (0.0, 1.0)


# --------------------------------------------------------------------------- fuzz of the API entry points

def _arrays():
    shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
    dtypes = st.sampled_from([np.float64, np.float32, np.int64, np.bool_, np.complex128])
    specials = st.sampled_from([None, 0.0, np.nan, np.inf, -1.0])

    @st.composite
    def arr(draw):
        kind = draw(st.sampled_from(["array", "list", "none", "scalar", "str"]))
        if kind == "none":
            return None
        if kind == "str":
            return "cool-sd"
        if kind == "scalar":
            return draw(st.floats(allow_nan=True, allow_infinity=True))
        shape = draw(shapes)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        a = rng.dirichlet(np.ones(shape[-1]), size=shape[:-1]) if shape and shape[-1] > 0 else rng.random(shape)
        sp = draw(specials)
        if sp is not None and a.size:
            a.flat[rng.integers(a.size)] = sp
        if draw(st.booleans()):
            with np.errstate(invalid="ignore"):     # NaN / inf cast to an integer dtype: any value will do
                a = a.astype(draw(dtypes))
        return a.tolist() if kind == "list" else a
    return arr()


VERIFIERS = st.sampled_from([rules.vanilla(), rules.cool_sd(2.0), None, "cool-sd", 3])
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _clean(call):
    try:
        call()
    except (ValueError, TypeError) as e:
        assert str(e), f"{type(e).__name__} without a message"


@SETTINGS
@given(P=_arrays(), Q=_arrays(), L=st.sampled_from([1, 2, 0, 2.5, "2", None]), v=VERIFIERS)
def test_fuzz_rule_tables(P, Q, L, v):
    _clean(lambda: markov.rule_tables(P, Q, L, v))


@SETTINGS
@given(P=_arrays(), F=_arrays(), init=st.sampled_from([0, 1, -1, 9, None, 0.5, [0.5, 0.5]]),
       n=st.sampled_from([1, 7, 0, -1, 2.5, None, 10**13]))
def test_fuzz_simulate(P, F, init, n):
    _clean(lambda: sim.simulate(P if P is not None else P4, Q4, F if F is not None else F4, G4, init, n))


@SETTINGS
@given(p=_arrays(), q=_arrays(), d=_arrays(), v=VERIFIERS)
def test_fuzz_predict_rounds(p, q, d, v):
    _clean(lambda: recorded.predict_rounds(p, q, d, v))


@SETTINGS
@given(levels=_arrays(), nu=st.one_of(st.floats(allow_nan=True), st.none(), st.just("x")),
       delta=st.one_of(st.floats(allow_nan=True), st.none()))
def test_fuzz_rule_constructors(levels, nu, delta):
    _clean(lambda: rules.level(levels))
    _clean(lambda: rules.cool_sd(delta, nu=nu))


@SETTINGS
@given(p=_arrays(), v=VERIFIERS, n=st.sampled_from([1, 5, 0, -1, 2.5, None, 10**13]))
def test_fuzz_simulate_rule(p, v, n):
    _clean(lambda: sim.simulate_rule(p if p is not None else P4, Q4, v, 2, 0, n))


def test_fuzz_control_catches_other_exceptions():
    """Negative control: the fuzz's check fails on an exception other than ValueError / TypeError (the
    AttributeError a verifier given as None used to raise) and on an empty message."""
    with pytest.raises(AttributeError):
        _clean(lambda: None.accept)
    with pytest.raises(AssertionError):
        _clean(lambda: (_ for _ in ()).throw(ValueError("")))


def test_batch_note_finds_where_sd_stops_paying():
    """stops_paying on hand-made unit costs: a round costing L + 1 AR steps from B = 8 on (compute-bound)
    stops paying there; costs that stay memory-bound pay at every B (the control); one noisy slow B in the
    middle is no verdict."""
    from coolsd.studies.batching import note, stops_paying

    T, L = 49, 4
    rounds = np.full(20, 16)          # 49 tokens in 16 rounds: about 3 tokens per round
    cheap = {"ar_step": 1.0, "draft_step": 0.05, "verify_pass": 1.2, "verifier": 0.01}
    dear = {"ar_step": 1.0, "draft_step": 0.3, "verify_pass": 5.0, "verifier": 0.01}
    r = stops_paying(rounds, {1: cheap, 4: cheap, 8: dear, 16: dear}, T, L)
    assert r["stops_paying_at"] == 8 and r["predicted"][1] == pytest.approx(49 / (16 * 1.41))
    assert stops_paying(rounds, {1: cheap, 16: cheap}, T, L)["stops_paying_at"] is None
    assert stops_paying(rounds, {1: cheap, 4: dear, 16: cheap}, T, L)["stops_paying_at"] is None
    assert "from B = 8" in note({"vanilla": r}, 16, "cpu")


def test_api_log_target_and_build_options_check_types():
    """log_target and registry.build refuse None / wrongly typed arguments with one line naming them (an
    AttributeError / a deep int() failure before); the controls (lists, numpy integers) are accepted."""
    import numpy as np

    from real.build_options import BuildOptions
    from theory.likelihood.chain import log_target

    p = np.full((4, 3), 1 / 3)
    for bad, name in ((None, "p"), ("abc", "p")):
        with pytest.raises(TypeError, match=f"log_target: {name} must be an array"):
            log_target(bad, np.zeros(4, int))
    with pytest.raises(TypeError, match="log_target: tokens must be an array"):
        log_target(p, None)
    assert log_target(p.tolist(), [0, 1, 2, 0]) == pytest.approx(4 * np.log(1 / 3))      # lists: converted
    with pytest.raises(TypeError, match="build option num_images .--num-images. must be Integral"):
        BuildOptions(num_images="2")
    with pytest.raises(TypeError, match="build option seed"):
        BuildOptions(seed=True)
    assert BuildOptions(num_images=np.int64(2), prompts=["a"]).num_images == 2                # numpy ints: fine
