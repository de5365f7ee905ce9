"""`coolsd generate` (the contract the external checks call) and the GPU check script's CPU smoke mode."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from coolsd.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTRACT_METHODS = ["vanilla", "cool-sd", "uniform-rsd", "lantern", "lantern++", "typical", "greedy"]


def _run(capsys, *argv) -> dict:
    assert main(["generate", *argv, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out          # ONE JSON object on stdout
    return json.loads(out[0])


def test_contract_command_subprocess():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "coolsd.cli", "generate", "--model", "llamagen-tiny", "--method", "vanilla",
                        "--json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["tokens_per_target_call"] >= 1 and d["seconds"] > 0 and d["tokens"] == 64


def test_json_is_strict_for_plain_decoding(capsys):
    """Plain decoding has no acceptance rate: the JSON says null, never the non-JSON token NaN."""
    assert main(["generate", "--model", "llamagen-tiny", "--method", "ar", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    d = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in the output"))
    assert d["acceptance_rate"] is None and d["tokens_per_target_call"] == 1.0


@pytest.mark.parametrize("method", CONTRACT_METHODS)
def test_every_contract_method(capsys, method):
    d = _run(capsys, "--model", "llamagen-tiny", "--method", method)
    for k in ("tokens_per_target_call", "seconds", "accepted_mean", "accepted_se", "rounds", "verify_share",
              "time_draft_s", "time_target_s", "time_verify_s", "params", "processing"):
        assert k in d, k
    assert d["tokens"] == 64 and d["rounds"] == d["target_forwards"]
    assert 1.0 <= d["tokens_per_target_call"] <= d["L"] + 1
    assert d["tokens_per_target_call"] == pytest.approx(64 / d["rounds"])
    assert d["accepted_mean"] == pytest.approx(d["tokens_per_target_call"] - 1)
    if method == "greedy":
        assert d["processing"]["temperature"] == 0.0
    again = _run(capsys, "--model", "llamagen-tiny", "--method", method)       # seeded: reproducible
    assert again["rounds"] == d["rounds"]


def test_flags_models_record_and_errors(capsys, tmp_path):
    d = _run(capsys, "--model", "llamagen-tiny", "--method", "cool-sd", "--delta", "3", "--L", "3", "--temperature",
             "0.8", "--top-k", "50", "--top-p", "0.9", "--cfg-scale", "1.5", "--num-images", "2", "--num-tokens", "20",
             "--record", str(tmp_path / "r.npz"), "--save", str(tmp_path / "s.npz"), "--baseline")
    assert d["params"]["delta"] == 3.0 and d["L"] == 3 and d["num_images"] == 2 and d["tokens"] == 40
    assert d["processing"] == {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "cfg_scale": 1.5}
    assert d["speedup"] > 0 and d["baseline"]["seconds"] > 0
    rec = np.load(tmp_path / "r.npz")
    assert rec["p"].shape[1:] == (4, 256) and rec["q"].shape[1:] == (3, 256) and len(rec["accepted"]) == len(rec["n_drafted"])
    saved = np.load(tmp_path / "s.npz")
    assert saved["tokens"].shape == (2, 20) and "images" not in saved       # 20 tokens: not a whole image
    full = _run(capsys, "--model", "llamagen-tiny", "--method", "ar", "--save", str(tmp_path / "f.npz"))
    assert full["tokens_per_target_call"] == 1.0
    assert np.load(tmp_path / "f.npz")["images"].shape == (1, 3, 16, 16)
    t2i = _run(capsys, "--model", "llamagen-tiny-t2i", "--method", "lantern++", "--num-tokens", "16")
    assert t2i["tokens"] == 16
    e = _run(capsys, "--model", "llamagen-tiny", "--method", "vanilla", "--draft", "eagle", "--num-tokens", "16")
    assert e["rounds"] >= 2
    hf = _run(capsys, "--model", "hf-llama-tiny", "--method", "greedy", "--num-tokens", "24")
    assert hf["tokens"] == 24 and hf["tokens_per_target_call"] > 1
    fast = _run(capsys, "--model", "llama-tiny-fast", "--method", "greedy", "--num-tokens", "24")
    assert fast["rounds"] == hf["rounds"]            # same weights, same greedy path
    assert main(["generate", "--model", "nope", "--json"]) == 2
    assert main(["generate", "--method", "nope", "--json"]) == 2
    assert main(["generate", "--model", "hf-llama-tiny", "--method", "lantern", "--json"]) == 2   # no codebook
    err = capsys.readouterr().err
    assert "unknown model" in err and "unknown method" in err and "neighbour table" in err
    assert main(["generate", "--list-models"]) == 0
    assert "llamagen-tiny" in capsys.readouterr().out


def test_llamagen_from_checkpoint_files(capsys, tmp_path):
    """The --model llamagen path (published-checkpoint loading) end to end, with tiny files in the
    upstream layouts: GPT state dicts under "model" / raw, VQ under "model"."""
    from real.models import llamagen as lg
    from real.models.vq import VQModel, vq_config

    t = lg.LlamaGen(lg.config("tiny")).random_init(0, std=0.05, output_std=0.2, embed_std=1.0)
    torch.save({"model": t.state_dict()}, tmp_path / "t.pt")
    torch.save(lg.LlamaGen(lg.config("tiny-draft")).random_init(1).state_dict(), tmp_path / "d.pt")
    torch.save({"model": VQModel(vq_config("tiny")).random_init(0).state_dict()}, tmp_path / "vq.pt")
    d = _run(capsys, "--model", "llamagen", "--method", "lantern", "--target-ckpt", str(tmp_path / "t.pt"),
             "--target-size", "tiny", "--draft-ckpt", str(tmp_path / "d.pt"), "--draft-size", "tiny-draft", "--image-size",
             "128", "--vq-ckpt", str(tmp_path / "vq.pt"), "--vq-size", "tiny", "--save", str(tmp_path / "o.npz"))
    assert d["tokens"] == 64 and d["processing"]["cfg_scale"] == 4.0 and d["params"]["k"] == 16
    assert np.load(tmp_path / "o.npz")["images"].shape == (1, 3, 16, 16)
    torch.save({"model": {"output.weight": torch.zeros(3)}}, tmp_path / "bad.pt")
    assert main(["generate", "--model", "llamagen", "--target-ckpt", str(tmp_path / "bad.pt"), "--target-size", "tiny",
                 "--draft-ckpt", str(tmp_path / "d.pt"), "--draft-size", "tiny-draft", "--json"]) == 2
    assert "missing keys" in capsys.readouterr().err


def test_gpu_check_forward_cpu_smoke():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--forward", "--cpu-smoke"], capture_output=True,
                       text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHON=sys.executable), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "target forward" in r.stdout and "per-round overhead" in r.stdout


def _gpu_check(*args, timeout=600):
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHON=sys.executable), timeout=timeout)


def test_gpu_check_dry_run_on_cpu(tmp_path):
    """``scripts/gpu_check.sh --device cpu --dry-run`` (issue 42): every model x mode x (eager, compiled) timed,
    the compiled greedy tokens equal eager's, ops and syncs counted, predictions made, one JSON file and a table."""
    out = tmp_path / "g.json"
    r = _gpu_check("--device", "cpu", "--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["dry_run"] and d["compile"]["skipped"] is None and set(d["models"]) == {"tiny", "XL"}
    modes = ("ar", "chain", "eagle25", "dynamic")
    for name, m in d["models"].items():
        for mode in modes:
            e, c, n = m["runs"][f"{mode} eager"], m["runs"][f"{mode} compiled"], m["counts"][mode]
            assert e["tokens_per_s"] > 0 and c["tokens_per_s"] > 0 and e["speedup_measured"] > 0
            assert c["tokens_equal_eager"] is True and c["fell_back_to_eager"] is False
            assert e["speedup_predicted"] > 0 and n["ops_per_token"] > 10 and n["syncs_per_round"] >= 0
            assert (mode == "ar") == (e["tokens_per_call"] == 1.0)
            assert f"\n{name:6s} {mode:8s}" in r.stdout
        assert m["runs"]["eagle25 eager"]["tokens_per_call"] > 1       # drafts were accepted
    assert "SU pred" in r.stdout and f"wrote {out}" in r.stdout
    assert not list(tmp_path.glob("*.tmp*"))                             # written atomically: no leftovers


def test_gpu_check_refuses_a_missing_gpu_and_honours_the_budget(tmp_path):
    out = tmp_path / "g.json"
    if not torch.cuda.is_available():
        r = _gpu_check("--device", "cuda", "--out", str(out))
        assert r.returncode == 2 and "no CUDA device" in r.stderr and not out.exists()
    r = _gpu_check("--cpu-smoke", "--models", "tiny", "--budget-s", "0", "--no-compile", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["compile"]["skipped"] == "--no-compile"
    runs = d["models"]["tiny"]["runs"]
    assert set(runs) == {"ar eager", "chain eager", "eagle25 eager", "dynamic eager"}
    assert all("time budget" in v["skipped"] for v in runs.values())


def test_gpu_check_reports_a_failing_leg_and_still_writes_its_json(tmp_path, monkeypatch, capsys):
    """A leg that raises on a first GPU (here the counts, made to raise) is recorded as an error in the JSON and the
    check goes on: the timed runs are there and the file is written."""
    from scriptload import load

    mod = load("scripts/gpu_check.py", "gpu_check_mod")

    def broken(*a, **k):
        raise RuntimeError("counter exploded")

    monkeypatch.setattr(mod, "counts", broken)
    out = tmp_path / "g.json"
    threads = torch.get_num_threads()
    try:
        assert mod.main(["--cpu-smoke", "--models", "tiny", "--no-compile", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)                  # (the script sets 1 thread for its dry run)
    d = json.loads(out.read_text())["models"]["tiny"]
    assert all(v == {"error": "RuntimeError: counter exploded"} for v in d["counts"].values())
    assert all(v["tokens_per_s"] > 0 for v in d["runs"].values())
    assert "counter exploded" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["jacobi", "sjd-pac", "sjd-pac-p"])
def test_drafter_free_modes_on_a_llamagen_checkpoint(capsys, tmp_path, mode):
    """A drafter-free mode needs no draft model on --model llamagen (SJD's release targets these checkpoints): a
    checkpoint written here, no --draft-ckpt, runs; the small draft's own requirement still holds for --draft small
    (the control)."""
    from real.models import llamagen as lg

    t = lg.LlamaGen(lg.config("tiny")).random_init(0, std=0.05, output_std=0.2, embed_std=1.0)
    torch.save({"model": t.state_dict()}, tmp_path / "t.pt")
    base = ["--model", "llamagen", "--target-ckpt", str(tmp_path / "t.pt"), "--target-size", "tiny", "--image-size",
            "128", "--method", "vanilla", "--num-tokens", "32"]
    extra = ["--window", "16"] if mode != "jacobi" else []
    for spelling in (["--mode", mode], ["--draft", mode]):      # the mode's name, and the deprecated --draft NAME
        d = _run(capsys, *base, *spelling, *extra)
        assert d["tokens"] == 32
    assert main(["generate", *base, "--draft", "small", "--json"]) == 2
    assert "--draft-ckpt" in capsys.readouterr().err
    assert main(["generate", *base, "--mode", "chain", "--json"]) == 2     # a drafted mode still needs its draft
    assert "--draft-ckpt" in capsys.readouterr().err
