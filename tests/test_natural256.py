"""The shipped natural256 zoo (real.zoo.natural + checkpoints_natural256): region split, data fingerprint,
hash-checked loading (with controls), greedy speculative decoding = greedy AR, and the vanilla law on a short
prefix against the exact law of plain sampling (with a negative control).
"""
from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("skimage")
pytest.importorskip("sklearn")

from real.zoo import checkpoint, natural, zoos  # noqa: E402

Z = zoos.get("natural256")
FILES = checkpoint.read_manifest(Z.directory)["files"]
needs_weights = pytest.mark.skipif("target.safetensors" not in FILES or "draft.safetensors" not in FILES,
                                   reason="natural256 target / draft not shipped yet")

pytestmark = pytest.mark.usefixtures("two_torch_threads")


# --- data ------------------------------------------------------------------------------------------

def test_regions_are_disjoint_and_large_enough():
    for img in natural.sources():
        H, W = img.shape[1:]
        r = natural.regions((H, W))
        (a0, a1, b0, b1), (c0, c1, d0, d1) = r["train"], r["heldout"]
        mask = np.zeros((H, W), int)
        mask[a0:a1, b0:b1] += 1
        mask[c0:c1, d0:d1] += 1
        assert mask.max() == 1 and mask.min() == 1          # a partition of the image: no shared pixel
        assert min(c1 - c0, d1 - d0) >= natural.CROP_MAX    # held-out crops reach the largest scale too


def test_crops_stay_inside_their_region():
    """On an image whose train region is black and held-out strip white, every train crop is all black and
    every held-out crop all white (control: a crop box straddling both has both)."""
    H, W = 300, 451
    r = natural.regions((H, W))
    img = torch.zeros(3, H, W, dtype=torch.uint8)
    y0, y1, x0, x1 = r["heldout"]
    img[:, y0:y1, x0:x1] = 255
    rng = np.random.default_rng(0)
    assert int(natural._crops(img, r["train"], 200, rng).max()) == 0
    assert int(natural._crops(img, r["heldout"], 200, rng).min()) == 255
    mixed = natural._crops(img, (0, H, x0 - 64, x0 + 64), 20, rng)
    assert int(mixed.max()) == 255 and int(mixed.min()) == 0


def test_splits_and_fingerprint():
    x, y = natural.train_split()
    xh, yh = natural.heldout_split()
    assert x.shape == (natural.N_CLASSES * natural.N_TRAIN_PER_CLASS, 3, 64, 64) and x.dtype == torch.uint8
    assert xh.shape == (natural.N_CLASSES * natural.N_HELDOUT_PER_CLASS, 3, 64, 64)
    assert torch.equal(torch.bincount(y), torch.full((16,), natural.N_TRAIN_PER_CLASS))
    assert torch.equal(torch.bincount(yh), torch.full((16,), natural.N_HELDOUT_PER_CLASS))
    f = natural.check_images(xh[:4])
    assert f.dtype == torch.float32 and f.min() >= -1 and f.max() <= 1
    with pytest.raises(ValueError, match="64, 64"):
        natural.check_images(torch.zeros(2, 1, 28, 28))
    for name, entry in FILES.items():              # every shipped file was trained on the data we load now
        assert entry["data_sha256"] == natural.fingerprint(), name


# --- loader ----------------------------------------------------------------------------------------

def _copy(tmp_path):
    d = tmp_path / "zoo"
    shutil.copytree(Z.directory, d, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return d


@pytest.mark.skipif("vq.safetensors" not in FILES, reason="natural256 VQ not shipped yet")
def test_loader_refuses_altered_and_missing_files_with_a_control(tmp_path):
    from real.zoo.vq import VQModel

    d = _copy(tmp_path)
    ok = checkpoint.load_shipped(VQModel, "vq.safetensors", d)          # control: the intact copy loads
    assert ok.config["in_ch"] == 3 and ok.config["codebook_size"] >= 1024
    command = FILES["vq.safetensors"]["command"]
    blob = bytearray((d / "vq.safetensors").read_bytes())
    blob[-1] ^= 1
    (d / "vq.safetensors").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="vq.safetensors.*sha256") as e:
        checkpoint.load_shipped(VQModel, "vq.safetensors", d)
    assert command in str(e.value)
    (d / "vq.safetensors").unlink()
    with pytest.raises(ValueError, match="vq.safetensors.*missing") as e:
        checkpoint.load_shipped(VQModel, "vq.safetensors", d)
    assert command in str(e.value)


@needs_weights
@pytest.mark.parametrize("name", ["target.safetensors", "draft.safetensors"])
def test_model_pair_refuses_an_altered_weight_file_with_a_control(tmp_path, monkeypatch, capsys, name):
    """`coolsd generate --model natural256` on a copy of the shipped folder: the intact copy generates (control);
    with one bit of ``name`` flipped, the run stops before any work with one line naming the file, the sha256 check
    and the file's training command; nothing is written (no --save file appears)."""
    import dataclasses

    from coolsd.cli import main

    d = _copy(tmp_path)
    monkeypatch.setitem(zoos.ZOOS, "natural256", dataclasses.replace(Z, folder=str(d)))
    save = tmp_path / "out.npz"
    args = ["generate", "--model", "natural256", "--method", "vanilla", "--num-images", "1", "--num-tokens", "8",
            "--json"]
    assert main(args) == 0                                                 # control: the intact copy runs
    capsys.readouterr()
    blob = bytearray((d / name).read_bytes())
    blob[len(blob) // 2] ^= 1
    (d / name).write_bytes(bytes(blob))
    assert main(args + ["--save", str(save)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and name in err[0] and "sha256" in err[0]
    assert FILES[name]["command"] in err[0]
    assert not save.exists()


@needs_weights
def test_shipped_models_and_manifest():
    from real.zoo import gpt

    total = sum((Z.directory / n).stat().st_size for n in FILES)
    assert total <= 30 * 2**20
    for name, e in FILES.items():
        assert checkpoint.sha256(Z.directory / name) == e["sha256"]
        assert e["command"].startswith("python -m real.zoo.train_") and "--zoo natural256" in e["command"]
        assert isinstance(e["seed"], int) and e["wall_clock_s"] > 0
    t = gpt.load_target("natural256")
    assert (t.config.block_size, t.vocab_size, t.config.num_classes) == (256, Z.vocab, 16)
    q = FILES["target.safetensors"]["quality"]
    assert q["heldout_nll_per_token"] < q["unigram_entropy_heldout"] - 0.5      # genuinely trained


# --- engine ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair():
    from real.zoo import gpt

    return gpt.load_target("natural256"), gpt.load_draft("natural256")


@needs_weights
def test_greedy_speculative_equals_greedy_ar(pair):
    """Chain L = 4 with the greedy verifier gives plain greedy AR token for token (CFG 2, 3 images, 256 tokens),
    and drafts are accepted (more than one token per call), so the check is not vacuous."""
    from real.decode import engine
    from real.decode.sampling import Processing
    from theory import rules

    t, d = pair
    proc = Processing(temperature=0.0, cfg_scale=2.0)
    conds = [0, 5, 13]
    ref = torch.stack([g.tokens for g in engine.generate(t, None, conds, num_tokens=256, processing=proc)])
    gens = engine.generate(t, d, conds, num_tokens=256, verifier=rules.greedy(), drafting=4, processing=proc)
    assert torch.equal(torch.stack([g.tokens for g in gens]), ref)
    assert sum(r.accepted for g in gens for r in g.rounds) > 0


def _support_law(model, cond, T, proc):
    """Exact P(x_1..x_T) of plain sampling, enumerating only the support of each processed row (top-k)."""
    law = {}

    def walk(prefix, prob):
        if len(prefix) == T:
            law[tuple(prefix)] = prob
            return
        pre = torch.tensor(prefix).view(1, -1).expand(proc.batch, -1) if prefix else None
        row = proc(model.prefill(cond, pre, cfg=proc.cfg).logits[:, -1])
        for v in torch.nonzero(row > 0).flatten().tolist():
            walk(prefix + [v], prob * float(row[v]))

    walk([], 1.0)
    return law


@needs_weights
def test_vanilla_law_on_a_short_prefix_with_a_negative_control(pair):
    """Vanilla speculative sampling (chain L = 2, batched, the small draft) of the first T = 3 tokens follows the
    exact law of plain sampling (top-k 3, CFG 2: 27 sequences), by a chi-square test of N = 800 images; a wrong
    resampler (drawing from the target's row instead of the residual after a rejection) is rejected."""
    from scipy import stats

    from real.decode import engine
    from real.decode.sampling import Processing
    from theory import rules

    t, d = pair
    proc = Processing(temperature=1.0, top_k=3, cfg_scale=2.0)
    T, N, cond = 3, 800, 4
    law = _support_law(t, cond, T, proc)
    assert abs(sum(law.values()) - 1) < 1e-4 and len(law) == 27

    def p_value(verifier, seed):
        gens = engine.generate(t, d, [cond] * N, num_tokens=T, verifier=verifier, drafting=2, processing=proc,
                               batch_size=100, seed=seed)
        counts: dict = {}
        for g in gens:
            s = tuple(g.tokens.tolist())
            counts[s] = counts.get(s, 0) + 1
        if any(s not in law for s in counts):
            return 0.0
        cells = sorted(law, key=law.get)
        obs = np.array([counts.get(s, 0) for s in cells], float)
        exp = np.array([N * law[s] for s in cells])
        small = exp < 5
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
        keep = exp > 0
        stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
        return float(stats.chi2.sf(stat, keep.sum() - 1))

    assert p_value(rules.vanilla(), 1) > 1e-3
    bad = rules.Verifier(rules.Vanilla(), rules.Target(), "wrong-resampler")
    assert p_value(bad, 2) < 1e-3


@needs_weights
def test_generate_cli_runs_with_the_shipped_weights(capsys):
    import json

    from coolsd.cli import main

    assert main(["generate", "--model", "natural256", "--method", "cool-sd", "--num-images", "2",
                 "--num-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["processing"]["cfg_scale"] == 2.0


@needs_weights
def test_shipped_eagle_head_loads_and_an_altered_copy_is_refused(tmp_path):
    """The EAGLE-1 head made by ``coolsd train-drafter`` loads on the shipped target (and drafts better than chance:
    held-out acceptance recorded in its manifest); a copy with one altered byte is refused naming the file and the
    command that trained it (control: the unaltered copy loads)."""
    import json
    import shutil

    from real.drafter.files import load_drafter
    from real.zoo import gpt, zoos

    src = zoos.get("natural256").directory / "eagle"
    man = json.loads((src / "coolsd_drafter.json").read_text())
    assert man["model"] == "natural256" and man["validation"]["acceptance"] > 0.5
    target = gpt.load_target("natural256")
    assert gpt.load_eagle(target, "natural256").config.vocab_size == 1024
    cp = tmp_path / "eagle"
    shutil.copytree(src, cp)
    load_drafter(cp, target, "natural256")                       # control
    w = cp / "model.safetensors"
    b = bytearray(w.read_bytes())
    b[-1] ^= 1
    w.write_bytes(bytes(b))
    with pytest.raises(ValueError, match="altered.*coolsd train-drafter --model natural256"):
        load_drafter(cp, target, "natural256")


def test_resume_refuses_another_config(tmp_path):
    """A resumable run continued with other options is refused in one line before any work (control: the same
    options resume)."""
    from real.zoo import train_llamagen

    state = tmp_path / "s.pt"
    base = ["--role", "draft", "--dim", "32", "--layers", "1", "--heads", "2", "--steps", "2", "--batch-size", "4",
            "--state", str(state), "--save-every", "1", "--out", str(tmp_path), "--zoo", "mnist", "--dry-run"]
    train_llamagen.train(train_llamagen.parse(base))
    assert state.exists()
    model, _ = train_llamagen.train(train_llamagen.parse(base + ["--resume"]))      # control: resumes at step 2
    with pytest.raises(SystemExit, match="another run.*lr"):
        train_llamagen.train(train_llamagen.parse(base + ["--resume", "--lr", "0.01"]))
