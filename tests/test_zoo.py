"""The shipped MNIST zoo (real/zoo): hashes, data split, VQ tokenizer, classifier, Frechet distance.

The recorded numbers come from the manifest written by the training scripts; these tests check that
the shipped files still reproduce them (with stated margins) and that broken inputs are caught.
"""
from __future__ import annotations

import math
import pathlib
import shutil

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("mlxtend")

from real.zoo import checkpoint, classifier, data, metrics, vq  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MANIFEST = checkpoint.read_manifest()
FILES = MANIFEST["files"]


pytestmark = pytest.mark.usefixtures("two_torch_threads")


@pytest.fixture(scope="module")
def heldout():
    return data.heldout_split()


# --- shipped files -------------------------------------------------------------------------------

def test_manifest_lists_the_zoo_with_commands_and_hashes():
    for name in (vq.CHECKPOINT, classifier.CHECKPOINT):
        entry = FILES[name]
        assert entry["command"].startswith("python -m real.zoo.train_")
        assert isinstance(entry["seed"], int)
        assert checkpoint.sha256(checkpoint.CHECKPOINTS / name) == entry["sha256"]
        assert entry["data_sha256"] == data.fingerprint()  # trained on the data we load now


def test_checkpoints_are_small_and_shipped_as_package_data():
    total = sum((checkpoint.CHECKPOINTS / n).stat().st_size for n in FILES)
    assert total < 8 * 2**20  # VQ + classifier + LlamaGen target, draft, EAGLE drafter: a few MB
    # setuptools ships package data only inside packages, matched by the globs in pyproject
    assert (checkpoint.CHECKPOINTS / "__init__.py").exists() and (ROOT / "real/zoo/__init__.py").exists()
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    for f in checkpoint.CHECKPOINTS.iterdir():
        if f.suffix != ".py" and f.name != "__pycache__":
            assert any(f.match(g) for g in globs), f"{f.name} would not be packaged"


def test_loaders_verify_and_load():
    assert not vq.load_vq().training and not classifier.load_classifier().training
    E = vq.codebook_embeddings()
    V, d = E.shape
    assert (V, d) == (FILES[vq.CHECKPOINT]["config"]["codebook_size"],
                      FILES[vq.CHECKPOINT]["config"]["code_dim"])
    np.testing.assert_allclose(E.norm(dim=1).numpy(), 1.0, atol=1e-6)


# --- wrong checkpoints ---------------------------------------------------------------------------

def _copy_zoo(tmp_path):
    for n in (*FILES, checkpoint.MANIFEST):
        shutil.copy(checkpoint.CHECKPOINTS / n, tmp_path / n)
    return tmp_path


def test_corrupt_file_fails_hash_check(tmp_path):
    d = _copy_zoo(tmp_path)
    raw = bytearray((d / vq.CHECKPOINT).read_bytes())
    raw[-1] ^= 0xFF  # flip bits in the last tensor byte
    (d / vq.CHECKPOINT).write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="sha256.*corrupt or stale"):
        checkpoint.load_state(vq.CHECKPOINT, d)
    checkpoint.load_state(classifier.CHECKPOINT, d)  # the intact file still loads


def test_missing_file_and_unknown_name(tmp_path):
    d = _copy_zoo(tmp_path)
    (d / vq.CHECKPOINT).unlink()
    with pytest.raises(ValueError, match="is missing.*train_vq"):
        checkpoint.load_state(vq.CHECKPOINT, d)
    with pytest.raises(ValueError, match="not in"):
        checkpoint.load_state("unknown.safetensors", d)


def test_wrong_model_names_missing_unexpected_keys():
    state = checkpoint.load_state(classifier.CHECKPOINT)
    with pytest.raises(ValueError) as e:
        checkpoint.check_state(vq.VQModel(**FILES[vq.CHECKPOINT]["config"]), state, "classifier.safetensors")
    msg = str(e.value)
    assert "missing keys" in msg and "'codebook'" in msg and "'encoder.conv_in.weight'" in msg
    assert "unexpected keys" in msg and "'conv1.weight'" in msg and "'head.bias'" in msg


def test_wrong_config_names_bad_shapes():
    cfg = dict(FILES[vq.CHECKPOINT]["config"])
    cfg["codebook_size"] += 1
    with pytest.raises(ValueError, match=r"bad shapes \[codebook: checkpoint \(\d+, \d+\) vs model"):
        checkpoint.load_into(vq.VQModel(**cfg), vq.CHECKPOINT)


# --- data ----------------------------------------------------------------------------------------

def test_split_is_fixed_stratified_and_disjoint():
    tr, ho = data.split_indices()
    assert len(tr) == 4000 and len(ho) == 1000
    assert len(np.intersect1d(tr, ho)) == 0 and len(np.union1d(tr, ho)) == 5000
    _, y = data._raw()
    assert (np.bincount(y[tr], minlength=10) == 400).all() and (np.bincount(y[ho], minlength=10) == 100).all()
    # seeded random order: not class-sorted
    assert (np.diff(y[ho]) != 0).sum() > 500
    x, lab = data.heldout_split()
    assert x.shape == (1000, 1, 28, 28) and x.dtype == torch.float32 and lab.dtype == torch.int64
    assert float(x.min()) == -1.0 and float(x.max()) == 1.0


def test_token_dataset():
    codes, labels = vq.token_dataset()
    assert codes.shape == (4000, 49) and codes.dtype == torch.int64 and labels.shape == (4000,)
    assert torch.equal(labels, data.train_split()[1])
    V = FILES[vq.CHECKPOINT]["config"]["codebook_size"]
    assert int(codes.min()) >= 0 and int(codes.max()) < V
    codes[0, 0] = -5  # callers get a copy, the cache is untouched
    assert int(vq.token_dataset()[0].min()) >= 0
    x = data.train_split()[0][:100]
    assert torch.equal(vq.token_dataset()[0][:100], vq.encode(x).reshape(100, 49))


# --- VQ tokenizer --------------------------------------------------------------------------------

def test_vq_round_trip_and_recorded_quality(heldout):
    x, _ = heldout
    codes = vq.encode(x)
    assert codes.shape == (1000, 7, 7) and codes.dtype == torch.int64
    recon = vq.decode(codes)
    assert recon.shape == (1000, 1, 28, 28) and float(recon.min()) >= -1 and float(recon.max()) <= 1
    assert torch.equal(vq.decode(codes.reshape(1000, 49)), recon)
    q = FILES[vq.CHECKPOINT]["quality"]
    mse = float(((recon - x) ** 2).mean())
    # The recomputation is deterministic up to float32 round-off (~1e-6 relative); a 3% margin
    # still fails for any damaged weight (the control below shows a change of one code per digit
    # already costs more).
    assert mse <= 1.03 * q["heldout_mse"]
    assert mse < 0.1 * float(((x - x.mean()) ** 2).mean())  # far better than predicting the mean
    usage = vq.codebook_usage(codes, vq.codebook_embeddings().shape[0])
    assert usage["used"] == q["codes_used_heldout"]
    assert usage["usage"] >= 0.5  # most codes are in use (dead-code restarts worked)
    # negative control: replacing one token per digit by a random code must exceed the threshold
    g = torch.Generator().manual_seed(0)
    bad = codes.reshape(1000, 49).clone()
    pos = torch.randint(0, 49, (1000,), generator=g)
    bad[torch.arange(1000), pos] = torch.randint(0, usage["used"], (1000,), generator=g)
    assert float(((vq.decode(bad) - x) ** 2).mean()) > 1.03 * q["heldout_mse"]


def test_vq_input_validation():
    with pytest.raises(ValueError, match=r"\(N, 1, 28, 28\)"):
        vq.encode(torch.zeros(2, 28, 28))
    with pytest.raises(ValueError, match="NaN"):
        vq.encode(torch.full((1, 1, 28, 28), float("nan")))
    with pytest.raises(ValueError, match=r"\(N, 7, 7\) or \(N, 49\)"):
        vq.decode(torch.zeros(2, 48, dtype=torch.int64))
    with pytest.raises(ValueError, match="range"):
        vq.decode(torch.full((1, 49), 10**6))
    with pytest.raises(ValueError, match="integers"):
        vq.decode(torch.zeros(1, 49))


# --- classifier ----------------------------------------------------------------------------------

def test_classifier_recorded_accuracy(heldout):
    x, y = heldout
    q = FILES[classifier.CHECKPOINT]["quality"]
    acc = metrics.class_accuracy(x, y)
    # deterministic up to round-off: allow 2 of 1,000 predictions to flip on near-ties
    assert abs(acc - q["heldout_accuracy"]) <= 0.002
    assert acc >= 0.95
    # negative control: wrong labels give chance-level accuracy
    assert metrics.class_accuracy(x, (y + 1) % 10) < 0.05
    f = metrics.image_features(x[:10])
    assert f.shape == (10, classifier.load_classifier().config["feature_dim"]) and f.dtype == torch.float64


def test_recorded_noise_floor(heldout):
    f = metrics.image_features(heldout[0])
    fd = metrics.frechet_distance(f[:500], f[500:])
    assert fd == pytest.approx(FILES[classifier.CHECKPOINT]["quality"]["fd_heldout_half_vs_half"], rel=1e-4)
    # negative control: the same real digits shifted right by 3 pixels are far away
    shifted = torch.roll(heldout[0][:500], 3, dims=3)
    assert metrics.frechet_distance(metrics.image_features(shifted), f[500:]) > 3 * fd


# --- Frechet distance ----------------------------------------------------------------------------

def _fd_sqrtm(mu1, s1, mu2, s2):
    """Independent reference: the usual formula with scipy's general sqrtm of the product."""
    cross = scipy.linalg.sqrtm(s1 @ s2)
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(cross).real)


def test_fd_diagonal_closed_form():
    # W2^2 between N(mu1, diag a) and N(mu2, diag b) is |mu1-mu2|^2 + sum (sqrt a - sqrt b)^2
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=6), rng.normal(size=6)
    a, b = rng.uniform(0, 3, 6), rng.uniform(0, 3, 6)
    a[0] = b[1] = 0.0  # singular covariances
    want = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()
    assert metrics.frechet_distance_stats(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(want, rel=1e-12)
    # commuting (same eigenvectors): the same formula in a rotated basis
    U = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    got = metrics.frechet_distance_stats(mu1, U @ np.diag(a) @ U.T, mu2, U @ np.diag(b) @ U.T)
    assert got == pytest.approx(want, rel=1e-9)


def _spd2(draw):
    vals = draw(st.lists(st.floats(-3, 3), min_size=3, max_size=3))
    L = np.array([[math.exp(vals[0]), 0.0], [vals[1], math.exp(vals[2])]])
    return L @ L.T


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fd_2x2_closed_form(draw):
    # for a 2x2 PSD M: tr sqrt(M) = sqrt(tr M + 2 sqrt(det M)), with M = S1^1/2 S2 S1^1/2,
    # tr M = tr(S1 S2), det M = det S1 det S2 (non-commuting S1, S2 in general)
    s1, s2 = _spd2(draw.draw), _spd2(draw.draw)
    mu1 = np.array(draw.draw(st.lists(st.floats(-5, 5), min_size=2, max_size=2)))
    mu2 = np.array(draw.draw(st.lists(st.floats(-5, 5), min_size=2, max_size=2)))
    cross = math.sqrt(np.trace(s1 @ s2) + 2 * math.sqrt(np.linalg.det(s1) * np.linalg.det(s2)))
    want = ((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * cross
    got = metrics.frechet_distance_stats(mu1, s1, mu2, s2)
    scale = np.trace(s1) + np.trace(s2) + ((mu1 - mu2) ** 2).sum()
    assert abs(got - max(want, 0.0)) <= 1e-9 * scale


def test_fd_matches_sqrtm_reference_and_sample_stats():
    rng = np.random.default_rng(1)
    d, n = 16, 400
    A, B = rng.normal(size=(d, d)) / 4, rng.normal(size=(d, d)) / 4
    # samples whose empirical mean / covariance are exactly (m, A A^T): whiten, then transform
    def exact(m, M):
        z = rng.normal(size=(n, d))
        z -= z.mean(0)
        z = z @ np.linalg.inv(np.linalg.cholesky(np.cov(z, rowvar=False))).T
        return z @ M.T + m
    ma, mb = rng.normal(size=d), rng.normal(size=d)
    fa, fb = exact(ma, A), exact(mb, B)
    want = _fd_sqrtm(ma, A @ A.T, mb, B @ B.T)
    assert metrics.frechet_distance(fa, fb) == pytest.approx(want, rel=1e-8)
    assert metrics.frechet_distance(torch.from_numpy(fa), torch.from_numpy(fb)) == pytest.approx(want, rel=1e-8)
    # negative controls: identical sets give 0, a shift c adds |c|^2
    assert metrics.frechet_distance(fa, fa) == pytest.approx(0.0, abs=1e-9)
    c = rng.normal(size=d)
    assert metrics.frechet_distance(fa, fa + c) == pytest.approx((c ** 2).sum(), rel=1e-8)


def test_fd_input_validation():
    rng = np.random.default_rng(2)
    f = rng.normal(size=(10, 3))
    with pytest.raises(ValueError, match="feature dims differ"):
        metrics.frechet_distance(f, f[:, :2])
    with pytest.raises(ValueError, match="at least 2"):
        metrics.frechet_distance(f[:1], f)
    with pytest.raises(ValueError, match="NaN"):
        metrics.frechet_distance(np.full((4, 3), np.nan), f)
    with pytest.raises(ValueError, match="positive semi-definite"):
        metrics.frechet_distance_stats(np.zeros(2), np.diag([1.0, -1.0]), np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="not symmetric"):
        metrics.frechet_distance_stats(np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]]), np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="shapes"):
        metrics.frechet_distance_stats(np.zeros(2), np.eye(3), np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match=r"labels must be \(N,\)"):
        metrics.class_accuracy(torch.zeros(3, 1, 28, 28), torch.zeros(2))


def test_recorded_evaluation_reproduces():
    from real.zoo.evaluate import measure

    rec = MANIFEST["evaluation"]
    got = measure()
    for k, v in got.items():
        assert v == pytest.approx(rec[k], rel=2e-3, abs=2e-3), k
    # swapping every token for its nearest code degrades less than swapping for a random code
    x = data.heldout_split()[0]
    codes = vq.encode(x)
    rand = torch.randint(0, codes.max() + 1, codes.shape, generator=torch.Generator().manual_seed(0))
    assert got["nn_swap_heldout_mse"] < float(((vq.decode(rand) - x) ** 2).mean())


def test_random_shift_augmentation():
    from real.zoo.train_classifier import random_shift

    x = data.heldout_split()[0][:50]
    out = random_shift(x, 2, torch.Generator().manual_seed(0))
    pad = torch.nn.functional.pad(x, (2, 2, 2, 2), value=-1.0)
    seen = set()
    for k in range(50):  # each output is exactly one of the 25 shifted copies, background-filled
        hits = [(a, b) for a in range(5) for b in range(5) if torch.equal(out[k], pad[k, :, a:a + 28, b:b + 28])]
        assert len(hits) >= 1
        seen.add(hits[0])
    assert len(seen) > 10  # offsets vary across images
    assert torch.equal(random_shift(x, 0, torch.Generator()), x)


def test_training_is_bitwise_reproducible():
    # the shipped sha256 can only be reproduced if training is deterministic with 2 threads
    # (restarts included: --restart-every 2 fires twice in 5 steps)
    from real.zoo import train_classifier, train_vq

    def states(module, argv):
        model = module.train(module.parse(argv))
        model = model[0] if isinstance(model, tuple) else model
        return {k: v.clone() for k, v in model.state_dict().items()}

    det, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    vq_argv = ["--steps", "5", "--restart-every", "2", "--restart-until", "1.0", "--batch-size", "32"]
    a, b = states(train_vq, vq_argv), states(train_vq, vq_argv)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = states(train_vq, vq_argv[:-1] + ["16"])
    assert not torch.equal(a["codebook"], c["codebook"])  # control: a different run differs
    cl_argv = ["--steps", "5", "--batch-size", "32"]
    a, b = states(train_classifier, cl_argv), states(train_classifier, cl_argv)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the caller's torch settings are restored
    assert (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()) == (det, threads)
