"""The real-size tier (issue 54; marker ``realsize``, deselect with ``-m 'not realsize'``): every command on random
weights at a published checkpoint's vocabulary and grid (``real.realsize``), LlamaGen first: V = 16,384 with VQ-16's
(16,384 x 8) codebook, at 256 and 576 tokens. Each command runs in a fresh subprocess whose peak resident memory
(``ru_maxrss``) is printed and written to ``peaks.json`` beside its outputs (``-s`` shows them).

Covered: ``generate`` in every drafting mode with ``--record`` (and ``--fidelity`` where the mode has a
likelihood: exact, or the Monte Carlo estimate of sampled static trees (T14), also with Cool-SD on 2 images; where it
has none the refusal comes before any work, checked too); ``sweep --predict`` (its report and
figures) and ``sweep --predict --measured``; ``tune --objective bound`` on a 256-token chain record, under 2 GB (the
speed model's renewal recursion was unrolled over the T positions: 18 GB on a 576-token record while JAX compiled;
``theory.likelihood.speed`` now scans). Not covered: the exact-law objectives (``tune --model`` takes no checkpoint
files).
The other families (``--model chameleon-realsize``, ``janus-realsize``, ``emu3-realsize``, ``glm-image-realsize``:
``real.realsize.SHALLOW``, built at run time at Lumina-mGPT's 8,192 codes in 65,536 ids, Janus-Pro's 16,384,
Emu3's 32,768 visual tokens in 184,622 ids and GLM-Image's 16,384): AR, a chain with --fidelity and --record, and
one tree mode with both (``test_family_at_its_published_vocabulary``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.realsize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEAK = ("import resource, sys; from coolsd.cli import main; rc = main(sys.argv[1:]); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr); sys.exit(rc)")
V = 16384


@pytest.fixture(scope="module")
def lg(tmp_path_factory):
    from real.realsize import llamagen_files

    d = tmp_path_factory.mktemp("realsize")
    return d, {256: llamagen_files(d, 256), 576: llamagen_files(d, 576)}


def coolsd(folder, label: str, *argv, expect: int = 0) -> tuple[dict | None, str]:
    """``coolsd argv`` in a subprocess (one thread): (its JSON output or None, its stderr); its peak memory is
    printed and added to ``folder/peaks.json`` under ``label``."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == expect, r.stderr[-3000:]
    peak = [int(ln.split()[1]) for ln in r.stderr.splitlines() if ln.startswith("PEAK")]
    if peak:
        f = folder / "peaks.json"
        peaks = json.loads(f.read_text()) if f.exists() else {}
        peaks[label] = peak[0]
        f.write_text(json.dumps(peaks, indent=1))
        print(f"\n[realsize] {label}: peak {peak[0] / 2**20:.0f} MiB")
    out = r.stdout.strip().splitlines()
    return (json.loads(out[-1]) if out and out[-1].startswith("{") else None), r.stderr


GEN = ["generate", "--method", "vanilla", "--num-images", "1", "--seed", "0", "--json", "--threads", "1"]
# tree records hold a V-wide row per node and round until their batch ends: at 256 tokens one image's static top-k
# record peaked at 2.7 GB and the release dynamic tree's at 6.7 GB (docs/guide/records.md), over the suite's ~2 GB
# per test, so the trees run the first 64 tokens of the 16 x 16 image (every round at the real vocabulary)
TREE_TOKENS = ["--num-tokens", "64"]
LIKELY = {"chain": ["--L", "4"], "static-topk": ["--tree", "eagle25", "--tree-candidates", "topk", *TREE_TOKENS],
          "dynamic-release": ["--mode", "dynamic", "--tree-sampling", "release", *TREE_TOKENS],
          "static-sampled": ["--tree", "eagle25", *TREE_TOKENS],    # estimated (T14): "kl_method": "mc"
          "dynamic-lossless": ["--mode", "dynamic", *TREE_TOKENS]}   # estimated (T15): "kl_method": "mc"
MC = ("static-sampled", "dynamic-lossless")


def npz_shape(path, name: str) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of array ``name`` of an ``.npz`` from its header alone (a record's rows are not read)."""
    import zipfile

    with zipfile.ZipFile(path) as zf, zf.open(name + ".npy") as f:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return shape, dtype


@pytest.mark.parametrize("mode", list(LIKELY))
def test_generate_with_fidelity_and_record_at_v16384(lg, mode):
    """Chains (256 tokens), the static trees and both dynamic trees (64 tokens: ``TREE_TOKENS``; sampled static and
    lossless dynamic trees estimated: T14, T15):
    --fidelity and --record at V = 16,384: the exact log-likelihood of the image is finite (and a lossless method's KL, when reported, holds 0 in
    its CI); the record holds V-wide rows in float32."""
    d, args = lg
    rec = d / f"{mode}.npz"
    out, _ = coolsd(d, f"generate {mode} --fidelity --record ({out_tokens(mode)} tokens)", *GEN, *args[256],
                    *LIKELY[mode], "--fidelity", "--record", str(rec))
    fid = out["fidelity"]
    assert out["tokens"] == out_tokens(mode) and np.isfinite(fid["nll_per_token"]) and fid["images"] == 1
    assert fid["kl_method"] == ("mc" if mode in MC else "exact")
    kl = fid.get("kl_to_target")                  # one image: no interval is reported
    assert kl is None or kl["ci"][0] <= 0 <= kl["ci"][1] + 1e-6
    shape, dtype = npz_shape(rec, "p")
    assert shape[-1] == V and dtype == np.float32


def out_tokens(mode: str) -> int:
    return 64 if mode != "chain" else 256


NO_LIKELIHOOD = {# drafter-free, the deprecated --draft MODE spelling (--mode MODE works too on --model llamagen:
                 # tests/test_real_cli.py::test_drafter_free_modes_on_a_llamagen_checkpoint)
                 "jacobi": ["--draft", "jacobi"], "sjd-pac": ["--draft", "sjd-pac"]}


@pytest.mark.parametrize("mode", list(NO_LIKELIHOOD))
def test_generate_with_record_where_no_exact_likelihood_applies(lg, mode):
    """The modes without an exact likelihood at this V: --fidelity is refused in one line before any work (no
    record written); --record runs and holds V-wide rows."""
    d, args = lg
    rec = d / f"{mode}.npz"
    model = args[256]
    if mode in ("jacobi", "sjd-pac"):             # drafter-free: no draft model
        i = model.index("--draft")
        model = model[:i] + model[i + 2:]
    _, err = coolsd(d, f"generate {mode} --fidelity (refused)", *GEN, *model, *NO_LIKELIHOOD[mode],
                    "--fidelity", "--record", str(rec), expect=2)
    assert "--fidelity" in err and not rec.exists()
    n = 64 if TREE_TOKENS[1] in NO_LIKELIHOOD[mode] else 256
    coolsd(d, f"generate {mode} --record ({n} tokens)", *GEN, *model, *NO_LIKELIHOOD[mode], "--record", str(rec))
    assert npz_shape(rec, "p")[0][-1] == V


def test_sampled_static_tree_fidelity_is_estimated(lg):
    """The Table 1 setting at V = 16,384: EAGLE_25 with sampled candidates (4 at the root: no exact sum fits), Cool-SD,
    2 images: --fidelity completes with the Monte Carlo likelihood (T14), its KL(P^||P) per token inside its interval
    and the images' Monte Carlo SEs reported (finite, below 0.05 nats per image at 64 draws per row). 64 tokens
    (``TREE_TOKENS``); 256 tokens took 70 s of CPU and peaked at 752 MiB (docs/guide/records.md)."""
    d, args = lg
    gen = [a if a != "vanilla" else "cool-sd" for a in GEN]
    gen[gen.index("--num-images") + 1] = "2"
    out, _ = coolsd(d, "generate static-sampled cool-sd --fidelity, 2 images (64 tokens)", *gen, *args[256],
                    "--tree", "eagle25", *TREE_TOKENS, "--fidelity")
    fid = out["fidelity"]
    assert fid["kl_method"] == "mc" and fid["mc"]["samples"] * fid["mc"]["groups"] >= 16
    assert 0 <= fid["mc"]["se_log_p_hat_max"] < 0.05
    kl = fid["kl_per_token"]
    assert kl["ci"][0] <= kl["measured"] <= kl["ci"][1] and np.isfinite(kl["measured"])


def test_576_tokens(lg):
    """The 24 x 24 grid: a chain with --fidelity and --record. (``coolsd tune --objective bound`` on such a record
    passed 18 GB while JAX compiled the unrolled speed model; since it scans, the free family's tune peaks at 1.2 GB
    in 266 s under load 10 (docs/guide/records.md), too slow for the tier: ``test_tune_on_the_record_at_v16384`` runs
    the uniform family at 256 tokens.)"""
    d, args = lg
    rec = d / "chain576.npz"
    out, _ = coolsd(d, "generate chain --fidelity --record (576 tokens)", *GEN, *args[576], "--L", "4",
                    "--fidelity", "--record", str(rec))
    assert out["tokens"] == 576 and npz_shape(rec, "p")[0][-1] == V


def test_tune_on_the_record_at_v16384(lg):
    """``coolsd tune --objective bound`` on a 256-token chain record at V = 16,384 (the chain test's, or a fresh one)
    completes with a schedule inside the record's reachable speeds, its peak memory under 2 GB. The uniform family
    (no SLSQP: the tier's minutes; every family shares the bound and speed functions that held the memory)."""
    d, args = lg
    rec = d / "chain.npz"
    if not rec.exists():
        coolsd(d, "generate chain --record (256 tokens)", *GEN, *args[256], "--L", "4", "--record", str(rec))
    label = "tune --objective bound --family uniform (256 tokens)"
    out, _ = coolsd(d, label, "tune", "--record", str(rec), "--objective", "bound", "--family", "uniform",
                    "--bound-budget", "0.05", "--json")
    assert out["objective"] == "bound" and out["L"] == 4
    assert out["vanilla_tokens_per_call"] <= out["predicted_tokens_per_call"] <= out["max_tokens_per_call"]
    assert out["predicted_bound_per_round"] <= 0.05 + 1e-9
    assert json.loads((d / "peaks.json").read_text())[label] < 2 * 2**30


def test_sweep_predict_and_measured_at_v16384(lg):
    """``coolsd sweep --predict`` on the LlamaGen-shaped model completes with its report and figures; a measured
    sweep of the same grid, then ``--predict --measured``, compares them."""
    d, args = lg
    base = ["sweep", *args[256], "--grid", "vanilla", "cool-sd:delta=2", "--images", "2", "--unit-images", "2",
            "--record-images", "2", "--no-progress", "--threads", "1"]
    pred = d / "pred"
    coolsd(d, "sweep --predict (2 images)", *base, "--predict", "--out", str(pred))
    assert (pred / "predicted.json").exists() and any(f.endswith(".png") for f in os.listdir(pred))
    meas = d / "meas"
    coolsd(d, "sweep measured (2 images)", *base, "--out", str(meas))
    coolsd(d, "sweep --predict --measured", *base, "--predict", "--measured", str(meas / "report.json"),
           "--out", str(meas))
    assert (meas / "report.json").exists()


# per family: the tokens of the chain (Janus-Pro: its whole 24 x 24 grid; the others the first 256 codes of theirs,
# past at least one row end where the layout has one) and the tree mode run with --fidelity and --record on the first
# 32 codes (every round at the published vocabulary); plain AR runs the first 64
FAMILIES = {"chameleon": (256, LIKELY["static-topk"][:-2]), "janus": (576, LIKELY["dynamic-release"][:-2]),
            "emu3": (256, LIKELY["static-topk"][:-2]), "glm-image": (256, LIKELY["dynamic-release"][:-2])}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_at_its_published_vocabulary(tmp_path, family):
    """``--model FAMILY-realsize``: plain AR, a chain (vanilla, L = 4) with --fidelity and --record, and a tree with both, at
    the family's published image vocabulary (``real.realsize.PUBLISHED``): every command completes, the likelihood is
    finite, the records hold rows as wide as the image vocabulary in float32."""
    from real.realsize import PUBLISHED, SHALLOW

    n, tree = FAMILIES[family]
    Vf = PUBLISHED[SHALLOW[family][0]]["V"]
    model = ["--model", f"{family}-realsize"]
    out, _ = coolsd(tmp_path, f"{family} ar (64 tokens)", *GEN[:2], "ar", *GEN[3:], *model, "--num-tokens", "64")
    assert out["tokens"] == 64 and out["tokens_per_target_call"] == 1.0
    for label, extra, T in (("chain", ["--L", "4"], n), ("tree", tree, 32)):
        rec = tmp_path / f"{label}.npz"
        out, _ = coolsd(tmp_path, f"{family} {label} --fidelity --record ({T} tokens)", *GEN, *model, *extra,
                        "--num-tokens", str(T), "--fidelity", "--record", str(rec))
        assert out["tokens"] == T and np.isfinite(out["fidelity"]["nll_per_token"]), out
        shape, dtype = npz_shape(rec, "p")
        assert shape[-1] == Vf and dtype == np.float32
    print(f"[realsize] {family}: peaks {(tmp_path / 'peaks.json').read_text()}")


def test_shallow_builds_name_the_published_shapes():
    """``real.realsize.SHALLOW`` reads its vocabularies and grids from ``PUBLISHED`` (one place), every family is
    registered as ``FAMILY-realsize``, and an unknown family is refused in one line."""
    from real import registry
    from real.realsize import PUBLISHED, SHALLOW, shallow_kwargs

    for family, (key, kw, _) in SHALLOW.items():
        assert kw["V"] == PUBLISHED[key]["V"] and f"{family}-realsize" in registry.MODELS
        grid = kw.get("grids", ((kw.get("side"),) * 2,))[0]
        assert tuple(grid) in PUBLISHED[key]["grids"], (family, grid)
    assert shallow_kwargs("janus") is not SHALLOW["janus"][1]          # a copy: the table is not edited by a caller
    with pytest.raises(ValueError, match="no real-size build of family 'llamagen'"):
        shallow_kwargs("llamagen")
