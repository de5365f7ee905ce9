"""``coolsd train-drafter`` (issue 48): every tiny family trains a head that ``generate --drafter-dir`` loads and that
beats an untrained head by more than 3 standard errors of tokens per call (with a control that must not); bad input is
refused in one line before any work with nothing written; SIGKILL + --resume gives the uninterrupted run's weights
bitwise; two torchrun ranks give one process's losses.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from coolsd.cli import main

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _cli(*argv) -> int:
    return main(list(map(str, argv)))


def _train(tmp_path, model, *extra, steps=30, n=64, name="d"):
    out = tmp_path / name
    rc = _cli("train-drafter", "--model", model, "--data", "generate", "--num-sequences", n, "--steps", steps,
              "--eval-every", 0, "--quiet", "--out", out, *extra)
    assert rc == 0
    return out


def _speed(capsys, model, *extra, images=12, seed=0):
    capsys.readouterr()
    assert _cli("generate", "--model", model, "--draft", "eagle", "--num-images", images, "--seed", seed, "--json",
                *extra) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return r["tokens_per_target_call"], r["tokens_per_target_call_se"]


@pytest.mark.parametrize("model", ["llamagen-tiny", "chameleon-tiny", "janus-tiny", "emu3-tiny", "glm-image-tiny"])
def test_trained_head_beats_untrained(tmp_path, capsys, model):
    out = _train(tmp_path, model)
    man = json.loads((out / "coolsd_drafter.json").read_text())
    assert man["model"] == model and man["steps"] == 30 and len(man["weights_sha256"]) == 64
    trained = _speed(capsys, model, "--drafter-dir", out)
    untrained = _speed(capsys, model)
    z = (trained[0] - untrained[0]) / math.hypot(trained[1], untrained[1])
    assert z > 3, (model, trained, untrained, z)


def test_control_untrained_head_is_not_better(tmp_path, capsys):
    """Negative control of the 3-SE test: a head saved after 0 effective training (lr tiny) must NOT pass it."""
    out = _train(tmp_path, "llamagen-tiny", "--lr", "1e-9", steps=2)
    a = _speed(capsys, "llamagen-tiny", "--drafter-dir", out)
    b = _speed(capsys, "llamagen-tiny")
    assert (a[0] - b[0]) / math.hypot(a[1], b[1]) < 3


def _refused(tmp_path, capsys, *argv, match):
    out = tmp_path / "refused_out"
    capsys.readouterr()
    rc = _cli("train-drafter", *argv, "--out", out, "--quiet")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and match in err, err
    assert not out.exists() and not (tmp_path / "refused_out.work").exists()


def test_bad_input_refused_before_work(tmp_path, capsys):
    base = ("--model", "llamagen-tiny", "--steps", "2")
    _refused(tmp_path, capsys, *base, "--data", "generate", "--num-sequences", "0", match="--num-sequences")
    _refused(tmp_path, capsys, *base, "--data", "generate", match="--num-sequences")
    _refused(tmp_path, capsys, *base, "--data", "bogus", match="--data")
    _refused(tmp_path, capsys, *base, "--data", "generate", "--num-sequences", "8", "--batch-size", "0", match="--batch-size")
    _refused(tmp_path, capsys, *base, "--data", "generate", "--num-sequences", "8", "--lr", "nan", match="--lr")
    f = tmp_path / "toks.npz"
    np.savez(f, tokens=np.full((4, 64), 300), class_ids=np.zeros(4, np.int64))        # V = 256
    _refused(tmp_path, capsys, *base, "--data", "tokens", f, match="code 300 >= V = 256")
    np.savez(f, tokens=np.zeros((4, 64), np.int64), class_ids=np.full(4, 99))
    _refused(tmp_path, capsys, *base, "--data", "tokens", f, match="class id 99")
    np.savez(f, tokens=np.zeros((4, 64), np.int64), prompts=np.array(["a"] * 4))
    _refused(tmp_path, capsys, *base, "--data", "tokens", f, match="takes no text prompts")
    np.savez(f, tokens=np.zeros((4, 64), np.int64), class_ids=np.zeros(4, np.int64))
    _refused(tmp_path, capsys, "--model", "chameleon-tiny", "--data", "tokens", f, match="not class-conditional")
    # the output directory holding the input
    d = tmp_path / "holder"
    d.mkdir()
    np.savez(d / "t.npz", tokens=np.zeros((4, 64), np.int64), class_ids=np.zeros(4, np.int64))
    capsys.readouterr()
    assert _cli("train-drafter", *base, "--data", "tokens", d / "t.npz", "--out", d, "--quiet") == 2
    assert "holds the input" in capsys.readouterr().err
    assert sorted(p.name for p in d.iterdir()) == ["t.npz"]


def test_drafter_of_another_model_or_target_refused(tmp_path, capsys):
    out = _train(tmp_path, "llamagen-tiny", steps=2, n=8)
    for argv, match in ((("--model", "chameleon-tiny"), "trained for --model llamagen-tiny"),
                        (("--model", "llamagen-tiny", "--seed", "1"), "fingerprint differs")):
        capsys.readouterr()
        assert _cli("generate", *argv, "--draft", "eagle", "--drafter-dir", out, "--json") == 2
        assert match in capsys.readouterr().err
    # an altered weight file is named; a directory without our manifest is checked by shape (LANTERN's releases)
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    capsys.readouterr()
    assert _cli("generate", "--model", "llamagen-tiny", "--draft", "eagle", "--drafter-dir", out, "--json") == 2
    assert "altered" in capsys.readouterr().err
    (out / "coolsd_drafter.json").unlink()
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "hidden_size": 64}))
    assert _cli("generate", "--model", "llamagen-tiny", "--draft", "eagle", "--drafter-dir", out, "--json") == 2
    assert "hidden_size 64 (the target needs 128)" in capsys.readouterr().err


def test_resume_with_other_options_refused(tmp_path, capsys):
    out = _train(tmp_path, "llamagen-tiny", steps=2, n=8)
    capsys.readouterr()
    rc = _cli("train-drafter", "--model", "llamagen-tiny", "--data", "generate", "--num-sequences", 8, "--steps", 2,
              "--lr", "2e-3", "--quiet", "--out", out, "--resume")
    assert rc == 2 and "other train" in capsys.readouterr().err


def _cmd(out, steps, *extra):
    return [sys.executable, "-m", "coolsd", "train-drafter", "--model", "llamagen-tiny", "--data", "generate",
            "--num-sequences", "32", "--steps", str(steps), "--batch-size", "8", "--eval-every", "0", "--save-every",
            "5", "--threads", "1", "--quiet", "--out", str(out), *extra]


def test_sigkill_then_resume_is_bitwise(tmp_path):
    steps = 400
    ref = tmp_path / "ref"
    subprocess.run(_cmd(ref, steps), check=True, env=ENV, capture_output=True, timeout=600)
    out = tmp_path / "killed"
    p = subprocess.Popen(_cmd(out, steps), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "killed.work" / "state.pt"
    t0 = time.time()
    while not state.exists() and time.time() - t0 < 300:
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not out.exists(), "killed before the end: nothing written to --out"
    saved = torch.load(state, weights_only=False)["step"]
    assert 0 < saved < steps
    subprocess.run(_cmd(out, steps, "--resume"), check=True, env=ENV, capture_output=True, timeout=600)
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    # control: a different seed gives other weights (the comparison can fail)
    other = tmp_path / "other"
    subprocess.run(_cmd(other, 10, "--seed", "1"), check=True, env=ENV, capture_output=True, timeout=600)
    assert (other / "model.safetensors").read_bytes() != (ref / "model.safetensors").read_bytes()


def _losses(work) -> np.ndarray:
    return np.array(torch.load(pathlib.Path(work) / "state.pt", weights_only=False)["losses"])


def test_torchrun_two_ranks_equal_one_process(tmp_path):
    """Same global batch and seed: the 2-rank run averages the same gradients as 1 process, so the losses agree to
    float summation order. "Within noise" here: every step's loss within 1e-4 relative (reassociation over the ranks'
    halves), while another seed moves them by > 1e-2 (the control)."""
    one = tmp_path / "one"
    subprocess.run(_cmd(one, 20), check=True, env=ENV, capture_output=True, timeout=600)
    two = tmp_path / "two"
    cmd = _cmd(two, 20)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29531"]
    r = subprocess.run(torchrun + cmd[1:], env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = _losses(str(one) + ".work"), _losses(str(two) + ".work")
    assert len(a) == len(b) == 20
    assert np.max(np.abs(a - b) / np.abs(a)) < 1e-4, np.abs(a - b).max()
    assert json.loads((two / "coolsd_drafter.json").read_text())["ranks"] == 2
    ctl = tmp_path / "ctl"
    subprocess.run(_cmd(ctl, 20, "--seed", "1"), check=True, env=ENV, capture_output=True, timeout=600)
    assert np.max(np.abs(_losses(str(ctl) + ".work") - a) / np.abs(a)) > 1e-2
