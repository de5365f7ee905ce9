"""coolsd.quality: the metric libraries' code paths (torchmetrics) on tiny random feature networks and a tiny
CLIP, each saved to a temporary file and loaded back through the local-weights path a user takes."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("torchmetrics")

from coolsd import quality  # noqa: E402
from coolsd.quality import extractors, metrics, reference  # noqa: E402
from coolsd.quality.stamp import StampMismatch  # noqa: E402

SIDE = 16


class TinyInception(nn.Module):
    """Inception-like in what matters here: uint8 images in, (x - 128) / 128, conv + ReLU, global average pool
    -> d features, a linear head -> logits (for IS). Random weights (seeded)."""

    def __init__(self, d: int = 8, classes: int = 5, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, d, 3, padding=1)
        self.fc = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.conv((x.float() - 128.0) / 128.0)).mean(dim=(2, 3))
        return h, self.fc(h)


def _save_tiny(path, seed=0, d=8, name="tiny-inception"):
    return extractors.save_extractor(TinyInception(d=d, seed=seed), path, name=name, version="test", size=(3, SIDE, SIDE),
                                     num_features=d, has_logits=True)


def _images(n, seed, shift=0):
    g = np.random.default_rng(seed)
    base = g.integers(0, 256, (n, SIDE, SIDE, 3))
    return np.clip(base + shift, 0, 255).astype(np.uint8)


def _adm(path, images, **extra):
    np.savez(path, arr_0=images, arr_1=np.arange(len(images)) % 10, **extra)
    return path


def _as_decoder_output(nhwc: np.ndarray) -> torch.Tensor:
    """uint8 NHWC -> the decoders' float [-1, 1] NCHW that ``extractors.to_uint8`` maps back exactly."""
    x = torch.from_numpy(nhwc).permute(0, 3, 1, 2).double()
    return ((x - 128.0 + 0.5) / 127.5).float()


# ----------------------------------------------------------------------------------------------- FID


def test_to_uint8_inverts_the_test_mapping():
    x = _images(4, 0)
    assert torch.equal(extractors.to_uint8(_as_decoder_output(x)), torch.from_numpy(x).permute(0, 3, 1, 2))


def test_fid_identical_sets_zero_shifted_positive(tmp_path):
    w = _save_tiny(tmp_path / "tiny.pt2")
    imgs = _images(200, 1)
    ref_path = _adm(tmp_path / "ref.npz", imgs)
    q = quality.prepare(quality.QualitySpec(("fid",), weights=str(w), reference=str(ref_path)),
                        image_shape=(3, SIDE, SIDE), conds=[0, 1])
    same = q.evaluate(_as_decoder_output(imgs))
    # identical sets: the Gaussians are equal, FID is 0 up to the eigen-solver's round-off (traces ~ 1e-2)
    tr = float(np.trace(q.reference.sigma))
    assert abs(same["fid"]) < 1e-9 * max(tr, 1.0)
    assert same["precision"] == 1.0 and same["recall"] == 1.0
    # independent draw of the same distribution: small; shifted by +60 grey levels: far larger (negative control)
    other = q.evaluate(_as_decoder_output(_images(200, 2)))
    shifted = q.evaluate(_as_decoder_output(_images(200, 2, shift=60)))
    assert shifted["fid"] > 0 and shifted["fid"] > 10 * other["fid"]
    assert shifted["fid_ci"][0] > other["fid_ci"][1]                      # separated beyond both intervals
    assert shifted["kid"] > other["kid"]
    stamp = shifted["quality_stamp"]["fid"]
    assert stamp["images"] == 200 and stamp["weights_sha256"] == extractors.file_sha256(w)
    assert stamp["reference_sha256"] == extractors.file_sha256(ref_path)
    assert stamp["library"].startswith("torchmetrics ") and stamp["extractor"] == "tiny-inception test"
    assert stamp["preprocessing"]["size"] == [3, SIDE, SIDE]


def test_feature_path_equals_torchmetrics_custom_network_on_images(tmp_path):
    """Our features-then-library path gives the FID that torchmetrics computes running the extractor itself
    (FrechetInceptionDistance(feature=<the loaded network>) on the images)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    w = _save_tiny(tmp_path / "tiny.pt2")
    ex = extractors.load_extractor(str(w))
    ref_imgs, gen_imgs = _images(120, 3), _images(90, 4, shift=20)
    ref = reference.load_reference(str(_adm(tmp_path / "r.npz", ref_imgs)), ex)
    gen = torch.from_numpy(gen_imgs).permute(0, 3, 1, 2).contiguous()
    ours = metrics.fid(ref, ex.extract(gen)[0])

    class Net(nn.Module):
        num_features = 8

        def __init__(self, exported):
            super().__init__()
            self.s = exported

        def forward(self, x):
            return self.s(x)[0].double()

    m = FrechetInceptionDistance(feature=Net(torch.export.load(str(w)).module()))
    m.update(torch.from_numpy(ref_imgs).permute(0, 3, 1, 2).contiguous(), real=True)
    m.update(gen, real=False)
    lib = float(m.compute())
    assert ours == pytest.approx(lib, rel=1e-9, abs=1e-12) and lib > 0


def _ref_of(mu, sigma, n):
    st = quality.Stamp("torchmetrics", "x", "w", "0" * 64)
    return reference.Reference(np.asarray(mu), np.asarray(sigma), n, None, None, st, "test")


@pytest.mark.parametrize("n,d", [(50, 8), (300, 16), (40, 64)])
def test_jackknife_fd_point_estimate_equals_the_library(n, d):
    from coolsd.quality.estimators import fd_with_ci

    g = np.random.default_rng(n + d)
    r = g.normal(size=(400, d)) @ g.normal(size=(d, d)) / np.sqrt(d)
    f = g.normal(0.3, 1.2, size=(n, d))                                  # n = 40 < d = 64: singular covariance
    ref = _ref_of(r.mean(0), np.cov(r, rowvar=False), len(r))
    lib = metrics.fid(ref, f)
    ours = fd_with_ci(f, (ref.mu, ref.sigma))["fd"]
    if n > d:      # full-rank covariances: the two eigen-solvers agree to round-off
        assert lib == pytest.approx(ours, rel=1e-9)
    else:          # singular: the library's sqrt of round-off eigenvalues, within the stated bound
        assert abs(lib - ours) <= metrics.fd_agreement(f, ref.sigma)
        assert lib == pytest.approx(ours, rel=1e-6)
    both = metrics.fid_with_ci(ref, f)
    assert both["fd"] == lib and both["ci"][0] < lib < both["ci"][1] and both["se"] > 0


def test_group_jackknife():
    """Delete-a-group with one image per group is delete-one, exactly; with 25 groups its SE matches the spread
    of FD over independent samples (300 replications: the SD's relative SE is 1 / sqrt(2 x 299) = 4%, the
    mean SE's ~1%); the naive SE of the group FDs (their SD / sqrt(g) = the jackknife SE / (g - 1)) is far off."""
    from coolsd.quality.estimators import fd_with_ci

    g = np.random.default_rng(3)
    d, n = 6, 400
    A = g.normal(size=(d, d)) / np.sqrt(d)
    ref = (np.zeros(d), A @ A.T + np.eye(d))
    f = g.normal(size=(40, d)) @ A.T
    one, grouped = fd_with_ci(f, ref), fd_with_ci(f, ref, groups=40)
    assert grouped["se"] == pytest.approx(one["se"], rel=1e-9) and grouped["fd"] == one["fd"]
    fds, ses = [], []
    for _ in range(300):  # independent replications of the whole sample
        x = g.normal(0.2, 1.0, size=(n, d)) @ A.T
        r = fd_with_ci(x, ref, groups=25)
        fds.append(r["fd"])
        ses.append(r["se"])
    sd, mean_se = float(np.std(fds, ddof=1)), float(np.mean(ses))
    assert abs(mean_se / sd - 1) < 0.15
    assert abs(mean_se / 24 / sd - 1) > 0.5                             # negative control: uninflated SE
    with pytest.raises(ValueError, match="groups must be"):
        fd_with_ci(f, ref, groups=2)


def test_fid_with_ci_refuses_a_point_estimate_that_disagrees(monkeypatch):
    """The agreement check can fail: our FD shifted by 1e-3 of the traces is caught."""
    import coolsd.quality.estimators as sm

    g = np.random.default_rng(0)
    f, r = g.normal(size=(60, 4)), g.normal(size=(80, 4))
    ref = _ref_of(r.mean(0), np.cov(r, rowvar=False), 80)
    real = sm.fd_with_ci
    monkeypatch.setattr(sm, "fd_with_ci", lambda *a, **k: {**real(*a, **k), "fd": real(*a, **k)["fd"] + 8e-3})
    with pytest.raises(RuntimeError, match="disagree"):
        metrics.fid_with_ci(ref, f)


def test_mnist_frontier_fd_is_the_library_fd():
    """The sweep's MNIST FD (real.zoo.metrics on the shipped classifier's features, held-out digits as the
    reference) equals torchmetrics' FID through the quality interface, on corrupted held-out digits."""
    from coolsd.quality.estimators import fd_with_ci
    from real.zoo import data
    from real.zoo.metrics import image_features, reference_stats

    images = data.heldout_split()[0][:300]
    noisy = (images + 0.4 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))).clamp(-1, 1)
    old = fd_with_ci(image_features(noisy).numpy(), reference_stats())["fd"]
    q = quality.prepare(quality.QualitySpec(("fid",), weights="mnist", reference="mnist"), image_shape=(1, 28, 28),
                        conds=[0])
    new = q.evaluate(noisy)
    assert new["fid"] == pytest.approx(old, rel=1e-9) and old > 1.0
    assert new["quality_stamp"]["fid"]["extractor"] == "mnist-classifier zoo"


def test_inception_score_and_kid_come_from_the_library(tmp_path):
    from torchmetrics.image.inception import InceptionScore

    w = _save_tiny(tmp_path / "tiny.pt2")
    ex = extractors.load_extractor(str(w))
    x = torch.from_numpy(_images(100, 5)).permute(0, 3, 1, 2).contiguous()
    _, logits = ex.extract(x)
    ours = metrics.inception_score(logits, splits=5, seed=3)
    m = InceptionScore(feature=metrics._Given(logits.shape[1]), splits=5)
    m.update(torch.from_numpy(logits))
    torch.manual_seed(3)
    mean, _ = m.compute()
    assert ours["inception_score"] == pytest.approx(float(mean), rel=1e-12) and ours["inception_score"] >= 1.0
    assert metrics.inception_score(logits, splits=5, seed=3) == ours           # seeded: reruns agree
    from torchmetrics.image.kid import KernelInceptionDistance

    ref = reference.load_reference(str(_adm(tmp_path / "r.npz", _images(60, 6))), ex)
    f = ex.extract(x)[0]
    k = KernelInceptionDistance(feature=metrics._Given(8), subsets=7, subset_size=50)
    k.update(torch.from_numpy(ref.features), real=True)
    k.update(torch.from_numpy(f), real=False)
    torch.manual_seed(4)
    assert metrics.kid(ref, f, subsets=7, subset_size=50, seed=4)["kid"] == pytest.approx(float(k.compute()[0]), rel=1e-12)


def test_inception_from_a_local_state_dict(tmp_path, monkeypatch):
    """Where torch-fidelity is installed (not here: its torchvision would move torch): the Inception path builds
    torch-fidelity's network from a local state dict and gives pool3 (2048) and logits (1008) for uint8 images of
    any size; the random weights are refused by the published hash until the check is pointed at them."""
    fe = pytest.importorskip("torch_fidelity.feature_extractor_inceptionv3")
    with monkeypatch.context() as m:             # the architecture with random weights, nothing loaded
        m.setattr(fe.torch, "load", lambda *a, **k: {})
        m.setattr(fe.FeatureExtractorInceptionV3, "load_state_dict", lambda self, *a, **k: None)
        arch = fe.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path="-")
    w = tmp_path / extractors.INCEPTION_FILE
    torch.save(arch.state_dict(), w)
    with pytest.raises(ValueError, match="starts 6726825d"):
        extractors.load_extractor(str(w))
    monkeypatch.setattr(extractors, "INCEPTION_SHA256_PREFIX", extractors.file_sha256(w)[:8])
    ex = extractors.load_extractor(str(w))
    f, lg = ex.extract(torch.randint(0, 256, (3, 3, 40, 40), dtype=torch.uint8))
    assert f.shape == (3, 2048) and lg.shape == (3, 1008) and ex.name == "inception-v3-compat"


# ----------------------------------------------------------------------------------------------- references


def test_adm_npz_reader_reads_the_published_layout(tmp_path):
    imgs = _images(12, 6)
    mu, sigma = np.arange(4.0), np.eye(4) * 2
    p = tmp_path / "VIRTUAL_tiny_labeled.npz"
    np.savez(p, arr_0=imgs, arr_1=np.arange(12) % 3, mu=mu, sigma=sigma, mu_s=mu[:2], sigma_s=np.eye(2))
    b = reference.read_adm_npz(p)
    assert np.array_equal(b.images, imgs) and b.images.dtype == np.uint8
    assert np.array_equal(b.labels, np.arange(12) % 3)
    assert np.array_equal(b.stats["mu"], mu) and np.array_equal(b.stats["sigma"], sigma)
    assert set(b.stats) == {"mu", "sigma", "mu_s", "sigma_s"}


def test_adm_statistics_are_the_fid_reference_for_the_inception_extractor(tmp_path):
    """With the Inception extractor the file's mu/sigma are the FID reference (as ADM's evaluator reads them
    first), arr_0's features serve KID / P/R; with another extractor everything comes from arr_0."""
    w = _save_tiny(tmp_path / "tiny.pt2")
    ex = extractors.load_extractor(str(w))
    imgs = _images(30, 7)
    mu, sigma = np.full(8, 0.5), np.eye(8) * 0.1
    p = _adm(tmp_path / "ref.npz", imgs, mu=mu, sigma=sigma)
    own = reference.load_reference(str(p), ex)
    assert not np.allclose(own.mu, mu) and own.n == 30                  # tiny extractor: from arr_0
    ex.name = "inception-v3-compat"                                      # stands in for the real network
    ex.num_features = 8
    adm = reference.load_reference(str(p), ex)
    assert np.array_equal(adm.mu, mu) and np.array_equal(adm.sigma, sigma) and adm.n is None
    assert adm.features.shape == (30, 8)
    np.savez(tmp_path / "stats_only.npz", mu=mu, sigma=sigma)
    ex.name = "tiny-inception"
    with pytest.raises(StampMismatch, match="only 'mu'/'sigma'"):
        reference.load_reference(str(tmp_path / "stats_only.npz"), ex)


@pytest.mark.parametrize("bad,msg", [("nan", "NaN or infinite"), ("nonpsd", "not positive semi-definite"),
                                     ("asym", "not symmetric")])
def test_reference_statistics_that_no_fid_can_use_are_refused_with_the_file(tmp_path, bad, msg):   # issue 41
    w = _save_tiny(tmp_path / "tiny.pt2")
    ex = extractors.load_extractor(str(w))
    ex.name, ex.num_features = "inception-v3-compat", 8                 # ADM statistics are read as they are
    mu, sigma = np.full(8, 0.5), np.eye(8) * 0.1
    good = reference.load_reference(str(_adm(tmp_path / "ok.npz", _images(10, 1), mu=mu, sigma=sigma)), ex)
    assert np.array_equal(good.sigma, sigma)                            # control: a valid covariance passes
    if bad == "nan":
        mu = mu.copy()
        mu[3] = np.nan
    elif bad == "nonpsd":
        sigma = sigma.copy()
        sigma[2, 2] = -0.5                                              # an eigenvalue of -0.5
    else:
        sigma = sigma.copy()
        sigma[0, 1] = 0.05                                              # sigma[1, 0] stays 0
    p = _adm(tmp_path / "bad.npz", _images(10, 1), mu=mu, sigma=sigma)
    with pytest.raises(ValueError, match=r"--quality-ref '.*bad.npz'.*" + msg):
        reference.load_reference(str(p), ex)


def test_reference_npz_without_the_expected_arrays(tmp_path):
    np.savez(tmp_path / "bad.npz", images=_images(4, 0))
    with pytest.raises(ValueError, match=r"--quality-ref: .*bad.npz.*has arrays \['images'\].*arr_0"):
        reference.read_adm_npz(tmp_path / "bad.npz")
    np.savez(tmp_path / "float.npz", arr_0=_images(4, 0).astype(np.float32))
    with pytest.raises(ValueError, match="uint8"):
        reference.read_adm_npz(tmp_path / "float.npz")


def test_statistics_file_round_trip_and_stamp_mismatch(tmp_path):
    wa, wb = _save_tiny(tmp_path / "a.pt2", seed=0), _save_tiny(tmp_path / "b.pt2", seed=1)
    ea, eb = extractors.load_extractor(str(wa)), extractors.load_extractor(str(wb))
    ref = reference.load_reference(str(_adm(tmp_path / "r.npz", _images(40, 8))), ea)
    reference.save_reference(ref, tmp_path / "stats.npz")
    back = reference.load_reference(str(tmp_path / "stats.npz"), ea)
    assert np.array_equal(back.mu, ref.mu) and np.array_equal(back.features, ref.features) and back.n == 40
    with pytest.raises(StampMismatch, match="weights_sha256"):
        reference.load_reference(str(tmp_path / "stats.npz"), eb)        # another extractor's weights


def test_folder_reference(tmp_path):
    from PIL import Image

    w = _save_tiny(tmp_path / "tiny.pt2")
    ex = extractors.load_extractor(str(w))
    imgs = _images(6, 9)
    (tmp_path / "coco").mkdir()
    for i, a in enumerate(imgs):
        Image.fromarray(a).save(tmp_path / "coco" / f"{i:03d}.png")
    ref = reference.load_reference(str(tmp_path / "coco"), ex)
    direct = reference.load_reference(str(_adm(tmp_path / "r.npz", imgs)), ex)
    assert np.allclose(ref.mu, direct.mu, rtol=0, atol=1e-12) and ref.image_size == (3, SIDE, SIDE)
    Image.fromarray(_images(1, 0, )[0][:8]).save(tmp_path / "coco" / "999.png")
    with pytest.raises(ValueError, match="mixes image sizes"):
        reference.load_reference(str(tmp_path / "coco"), ex)


# ----------------------------------------------------------------------------------------------- errors


def test_missing_weights_name_the_file_the_source_and_the_flag(tmp_path, monkeypatch):
    monkeypatch.delenv(extractors.ENV_WEIGHTS, raising=False)
    missing = tmp_path / extractors.INCEPTION_FILE
    with pytest.raises(ValueError) as e:
        extractors.load_extractor(str(missing))
    msg = str(e.value)
    assert "\n" not in msg and str(missing) in msg and "--quality-weights" in msg
    assert "torch-fidelity/releases" in msg and extractors.INCEPTION_FILE in msg
    with pytest.raises(ValueError, match="no weights given.*COOLSD_QUALITY_WEIGHTS"):
        extractors.load_extractor(None)
    monkeypatch.setenv(extractors.ENV_WEIGHTS, str(missing))
    with pytest.raises(ValueError, match="COOLSD_QUALITY_WEIGHTS: weights"):
        extractors.load_extractor(None)


def test_wrong_weights_files(tmp_path):
    torch.save({"w": torch.zeros(3)}, tmp_path / extractors.INCEPTION_FILE)    # right name, wrong content
    with pytest.raises(ValueError, match=r"sha256 [0-9a-f]{12}\.\.\., the published .* starts 6726825d"):
        extractors.load_extractor(str(tmp_path / extractors.INCEPTION_FILE))
    ep = torch.export.export(TinyInception(), (torch.zeros(2, 3, SIDE, SIDE, dtype=torch.uint8),))
    torch.export.save(ep, str(tmp_path / "bare.pt2"))                             # no description
    with pytest.raises(ValueError, match="no valid coolsd_extractor.json"):
        extractors.load_extractor(str(tmp_path / "bare.pt2"))
    with pytest.raises(ValueError, match="is a directory"):
        extractors.load_extractor(str(tmp_path))


def test_prepare_refuses_before_generation(tmp_path):
    w = _save_tiny(tmp_path / "tiny.pt2")
    r = _adm(tmp_path / "r.npz", _images(20, 0))
    spec = quality.QualitySpec(("fid",), weights=str(w), reference=str(r))
    with pytest.raises(ValueError, match=r"images of shape \(3, 32, 32\) do not fit the feature extractor"):
        quality.prepare(spec, image_shape=(3, 32, 32), conds=[0])
    with pytest.raises(ValueError, match="class-conditional"):
        quality.prepare(quality.QualitySpec(("clip",), clip=str(tmp_path)), image_shape=(3, SIDE, SIDE), conds=[3, 4])
    with pytest.raises(ValueError, match="unknown metric"):
        quality.QualitySpec.parse("fid,lpips")
    cap = tmp_path / "caps.txt"
    cap.write_text("a\nb\n")
    with pytest.raises(ValueError, match="2 caption"):
        quality.prepare(quality.QualitySpec(("clip",), clip=str(tmp_path), captions=str(cap)),
                        image_shape=(3, SIDE, SIDE), conds=["p1", "p2", "p3"])
    with pytest.raises(ValueError, match="not a transformers CLIP directory"):
        quality.prepare(quality.QualitySpec(("clip",), clip=str(tmp_path), captions=str(cap)),
                        image_shape=(3, SIDE, SIDE), conds=["p1", "p2"])


def test_require_same_stamps():
    a = quality.Stamp("torchmetrics 1.9.0", "x v", "w", "0" * 64, {"size": [3, 8, 8]}, "r", "1" * 64, 100)
    quality.require_same([a, a.with_()], "two reports")
    with pytest.raises(StampMismatch, match="'images' \\(100 vs 200\\)"):
        quality.require_same([a, a.with_(images=200)], "two reports")
    with pytest.raises(StampMismatch, match="reference_sha256"):
        quality.require_same([a.as_dict(), a.with_(reference_sha256="2" * 64).as_dict()], "two reports")


# ----------------------------------------------------------------------------------------------- CLIP

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}


def _colour_images(idx, g):
    base = torch.tensor([COLOURS[list(COLOURS)[i]] for i in idx], dtype=torch.float)[:, :, None, None]
    return (base + 20 * torch.randn(len(idx), 3, SIDE, SIDE, generator=g)).clamp(0, 255).to(torch.uint8)


def _tiny_clip(d, steps: int = 60):
    """A tiny transformers CLIP (1 layer per tower, width 32, character-level BPE vocabulary) whose features
    are planted by ``steps`` contrastive steps on solid-colour 16 x 16 images and their colour names (0: random
    weights), saved with save_pretrained to directory ``d``."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    d.mkdir(parents=True, exist_ok=True)
    chars = "abcdefghijklmnopqrstuvwxyz"
    vocab = {c: i for i, c in enumerate(chars)} | {c + "</w>": len(chars) + i for i, c in enumerate(chars)}
    vocab |= {"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1}
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n")
    proc = CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": SIDE},
                                                            crop_size={"height": SIDE, "width": SIDE}),
                         tokenizer=CLIPTokenizer(str(d / "vocab.json"), str(d / "merges.txt")))
    eos = vocab["<|endoftext|>"]
    cfg = CLIPConfig(text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=16,
                                      bos_token_id=vocab["<|startoftext|>"], eos_token_id=eos, pad_token_id=eos),
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                        image_size=SIDE, patch_size=8), projection_dim=16)
    torch.manual_seed(0)
    model = CLIPModel(cfg)
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    names = list(COLOURS)
    for _ in range(steps):  # training steps
        idx = torch.randperm(4, generator=g).tolist()
        inp = proc(text=[names[i] for i in idx], images=list(_colour_images(idx, g)), return_tensors="pt", padding=True)
        loss = model(**inp, return_loss=True).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(d)
    proc.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    d = tmp_path_factory.mktemp("clip")
    return _tiny_clip(d / "trained"), _tiny_clip(d / "untrained", steps=0)


def test_clip_score_ranks_matching_over_mismatched_captions(tiny_clip):
    from coolsd.quality.clip import clip_score, load_clip

    trained, _ = tiny_clip
    clip = load_clip(str(trained))
    g = torch.Generator().manual_seed(7)
    idx = [i % 4 for i in range(32)]
    imgs = _colour_images(idx, g)
    names = list(COLOURS)
    match = clip_score(clip, imgs, [names[i] for i in idx])
    mismatch = clip_score(clip, imgs, [names[(i + 1) % 4] for i in idx])     # negative control
    se = np.hypot(match["clip_score_se"], mismatch["clip_score_se"])
    assert match["clip_score"] - mismatch["clip_score"] > 5 * se
    assert (match["clip_scores"] > mismatch["clip_scores"]).all()
    assert len(clip.sha256) == 64 and clip.stamp(images=32).images == 32


def test_clip_through_prepare_and_its_errors(tiny_clip, tmp_path, monkeypatch):
    trained, untrained = tiny_clip
    cap = tmp_path / "caps.txt"
    cap.write_text("red\nblue\n")
    q = quality.prepare(quality.QualitySpec(("clip",), clip=str(trained), captions=str(cap)),
                        image_shape=(3, SIDE, SIDE), conds=["p0", "p1"])
    g = torch.Generator().manual_seed(2)
    imgs = _colour_images([0, 2, 0, 2], g)
    out = q.evaluate(((imgs.double() - 128 + 0.5) / 127.5).float(), captions=["red", "blue", "red", "blue"])
    assert out["clip_score"] > 0 and out["quality_stamp"]["clip"]["weights"] == str(trained)
    other = quality.prepare(quality.QualitySpec(("clip",), clip=str(untrained), captions=str(cap)),
                            image_shape=(3, SIDE, SIDE), conds=["p0", "p1"])
    with pytest.raises(StampMismatch, match="weights"):
        quality.require_same([out["quality_stamp"]["clip"], other.stamps(4)["clip"]], "two reports")
    monkeypatch.delenv("COOLSD_QUALITY_CLIP", raising=False)
    with pytest.raises(ValueError, match="--quality-clip: no weights given.*clip-vit-large-patch14"):
        quality.prepare(quality.QualitySpec(("clip",), captions=str(cap)), image_shape=(3, SIDE, SIDE), conds=["a", "b"])


# ----------------------------------------------------------------------------------------------- coolsd sweep


def _sweep(model, out, *extra):
    from coolsd.cli import main

    return main(["sweep", "--model", model, "--grid", "vanilla", "cool-sd:delta=4", "--images", "8", "--unit-images",
                 "4", "--no-progress", "--out", str(out), *extra])


def test_sweep_llamagen_tiny_fid_end_to_end(tmp_path, capsys):
    w = _save_tiny(tmp_path / "W.pt2")
    r = _adm(tmp_path / "R.npz", _images(64, 11))
    assert _sweep("llamagen-tiny", tmp_path / "out", "--quality", "fid", "--quality-weights", str(w),
                  "--quality-ref", str(r)) == 0
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    rows = [rep["baseline"], *rep["methods"]]
    assert all(m["fid"] > 0 and m["fid_ci"][0] < m["fid"] < m["fid_ci"][1] and m["frechet_distance"] == m["fid"]
               for m in rows)
    assert all(m["kid"] is not None and m["inception_score"] >= 1.0 and m["precision"] is not None for m in rows)
    st = rep["quality_stamp"]["fid"]
    assert st["weights_sha256"] == extractors.file_sha256(w) and st["reference_sha256"] == extractors.file_sha256(r)
    assert st["images"] == 8 and all(m["quality_stamp"]["fid"] == st for m in rows)
    assert "tiny-inception test" in rep["quality"] and "FD [95% CI]" in (tmp_path / "out" / "report.md").read_text()
    assert len(list((tmp_path / "out" / "quality").glob("*.json"))) == 3          # cached per setting
    # a cached setting computed with another stamp is never reused: a changed weights file recomputes all
    before = {p.name: p.read_text() for p in (tmp_path / "out" / "quality").glob("*.json")}
    _save_tiny(w, seed=5)
    assert _sweep("llamagen-tiny", tmp_path / "out", "--quality", "fid", "--quality-weights", str(w),
                  "--quality-ref", str(r)) == 0
    after = {p.name: p.read_text() for p in (tmp_path / "out" / "quality").glob("*.json")}
    assert after.keys() == before.keys() and all(after[k] != before[k] for k in after)


def test_sweep_chameleon_tiny_clip_end_to_end(tmp_path, tiny_clip):
    trained, _ = tiny_clip
    cap = tmp_path / "captions.txt"
    cap.write_text("\n".join(["red", "green", "blue", "yellow"] * 2) + "\n")
    assert _sweep("chameleon-tiny", tmp_path / "out", "--quality", "clip", "--quality-clip", str(trained),
                  "--quality-captions", str(cap), "--batch-size", "1") == 0
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    rows = [rep["baseline"], *rep["methods"]]
    assert all(m["clip_score"] is not None and m["clip_score_se"] > 0 for m in rows)
    st = rep["quality_stamp"]["clip"]
    assert st["weights"] == str(trained) and st["images"] == 8 and st["reference"] is None
    assert "CLIP score (SE)" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("case", ["npz_arrays", "image_size", "clip_c2i", "stamp", "missing_weights"])
def test_sweep_bad_quality_input_fails_before_generation(tmp_path, capsys, case):
    w = _save_tiny(tmp_path / "W.pt2")
    r = _adm(tmp_path / "R.npz", _images(20, 0))
    args = ["--quality", "fid", "--quality-weights", str(w), "--quality-ref", str(r)]
    if case == "npz_arrays":
        np.savez(tmp_path / "bad.npz", images=_images(4, 0))
        args[-1], want = str(tmp_path / "bad.npz"), "has arrays ['images'], expected the ADM reference-batch layout"
    elif case == "image_size":
        extractors.save_extractor(TinyInception(), w, name="tiny32", version="test", size=(3, 32, 32),
                                  num_features=8, has_logits=True)
        want = "images of shape (3, 16, 16) do not fit the feature extractor tiny32"
    elif case == "clip_c2i":
        args, want = ["--quality", "clip", "--quality-clip", str(tmp_path)], "this model is class-conditional"
    elif case == "stamp":
        other = extractors.load_extractor(str(_save_tiny(tmp_path / "other.pt2", seed=3)))
        reference.save_reference(reference.load_reference(str(r), other), tmp_path / "stats.npz")
        args[-1], want = str(tmp_path / "stats.npz"), "quality stamps differ in 'weights_sha256'"
    else:
        args[3], want = str(tmp_path / "nope.pth"), "--quality-weights: weights"
    assert _sweep("llamagen-tiny", tmp_path / "out", *args) == 2
    err = capsys.readouterr().err
    assert want in err and not (tmp_path / "out").exists()                   # nothing stored, nothing generated


def test_sweep_quality_flags_are_checked_with_the_arguments(tmp_path, capsys):
    from coolsd.cli import main

    for argv, want in ((["--model", "llamagen-tiny", "--quality-ref", "r.npz"], "--quality-ref configures --quality"),
                       (["--model", "mnist", "--quality", "fid"], "always scored with the shipped classifier"),
                       (["--model", "llamagen-tiny", "--quality", "fid,lpips"], "unknown metric(s) ['lpips']")):
        assert main(["sweep", *argv, "--out", str(tmp_path / "o")]) == 2
        assert want in capsys.readouterr().err and not (tmp_path / "o").exists()
