"""Bad input at every public boundary (issue "Hardening"): each case asserts the error type and that the
message names the offending argument; output paths leave nothing behind when a run is refused or
interrupted; size guards refuse before allocating, with estimates checked against measured peaks."""
from __future__ import annotations

import json
import math
import os
import pathlib
import time
import tracemalloc

import numpy as np
import pytest
import torch

from coolsd.cli import main
from coolsd.io import TMP_PREFIX, atomic_dir, atomic_file
from theory.markov import chains, image
from theory.core import checks
from theory import markov, rules
from theory.likelihood.recorded import predict_rounds
from theory.rules.chain import verify_chain


def _pair(V=4, seed=0):
    return chains.random_pair(V, seed=seed)


def _err(capsys):
    return capsys.readouterr().err


# --------------------------------------------------------------------------- shared scalar validators

@pytest.mark.parametrize("bad", [True, np.bool_(True), 2.0, "3", None, 1 + 0j])
def test_integer_rejects_non_integers(bad):
    with pytest.raises(ValueError, match="^n_rounds must be an integer"):
        checks.integer("n_rounds", bad, lo=1)


def test_integer_accepts_numpy_integers_and_checks_range():
    assert checks.integer("L", np.int32(3), lo=1) == 3
    with pytest.raises(ValueError, match="^L must be an integer >= 1, got 0"):
        checks.integer("L", 0, lo=1)


@pytest.mark.parametrize("bad", [True, np.bool_(False), 1 + 1j, "1.5", float("nan"), float("inf")])
def test_real_rejects_bools_complex_strings_nan_inf(bad):
    with pytest.raises(ValueError, match="^tol must be"):
        checks.real("tol", bad, 0)


def test_real_accepts_numpy_scalars():
    assert checks.real("c", np.float32(1.5), 0, lo_open=True) == 1.5
    assert checks.real("c", np.int64(2), 0) == 2.0


@pytest.mark.parametrize("bad", [-1, 2**64, True, 1.0])
def test_seed_range(bad):
    with pytest.raises(ValueError, match="^seed must be a non-negative integer <= 2\\*\\*64 - 1"):
        checks.seed(bad)
    assert checks.seed(2**64 - 1) == 2**64 - 1 and checks.seed(None) is None


# --------------------------------------------------------------------------- theory API boundaries

def test_rule_tables_rejects_bool_L():
    P, Q = _pair()
    with pytest.raises(ValueError, match="draft length L must be an integer"):
        markov.rule_tables(P, Q, True, rules.vanilla())


def test_uniform_rsd_numpy_scalar_accepted_bool_rejected():
    P, Q = _pair()
    F32, _ = markov.rule_tables(P, Q, 2, rules.uniform_rsd(np.float32(1.5)))
    F64, _ = markov.rule_tables(P, Q, 2, rules.uniform_rsd(1.5))
    np.testing.assert_array_equal(F32, F64)
    with pytest.raises(ValueError, match="Uniform schedule \\(c\\)"):
        rules.uniform_rsd(True)


def test_cool_sd_overflowing_nu_rejected():
    with pytest.raises(ValueError, match="nu=-1000"):
        rules.cool_sd(2.0, nu=-1000)
    with pytest.raises(ValueError, match="nu must be a finite number"):
        rules.cool_sd(2.0, nu=float("nan"))
    rules.cool_sd(2.0, nu=5.0)  # fast decay underflows to w = 0 at far positions: allowed (f -> 0)


def test_complex_P_rejected_not_truncated():
    P, Q = _pair()
    with pytest.raises(ValueError, match="^P must be a real-valued array"):
        markov.check_chain(P.astype(complex), Q)


def test_empty_P_rejected():
    with pytest.raises(ValueError, match="^P must be a square \\(V, V\\) matrix with V >= 1"):
        markov.check_chain(np.zeros((0, 0)), np.zeros((0, 0)))


def test_float32_tolerance_is_dtype_aware():
    P, Q = _pair(V=64, seed=3)
    P32 = P.astype(np.float32)
    markov.check_chain(P32, Q.astype(np.float32))            # stochastic in float32: accepted
    bad = P32.copy()
    bad[0, 0] += np.float32(1e-3)
    with pytest.raises(ValueError, match="^P is not row-stochastic"):
        markov.check_chain(bad, Q)
    off = P.copy()
    off[0, 0] += 1e-6                                        # float64 input keeps the 1e-8 tolerance
    with pytest.raises(ValueError, match="^P is not row-stochastic"):
        markov.check_chain(off, Q)


def test_float32_rows_off_by_float32_rounding_are_accepted():
    """Negative control for the tolerance: rows whose float64 sums are off by float32 rounding only."""
    rng = np.random.default_rng(0)
    x = rng.random((8, 512)).astype(np.float32)
    P = x / x.sum(1, keepdims=True)
    err = np.abs(P.astype(np.float64).sum(1) - 1).max()
    assert err <= checks.row_sum_tol(np.float32, 512)
    checks.stochastic("P", P.astype(np.float64), np.float32)


def test_chain_generators_check_their_scalars():
    with pytest.raises(ValueError, match="^V must be an integer"):
        chains.random_pair(True)
    with pytest.raises(ValueError, match="^V must be an integer >= 2"):
        chains.ambiguous_pair(1)
    with pytest.raises(ValueError, match="^seed must be a non-negative integer"):
        chains.random_pair(4, seed=-1)
    with pytest.raises(ValueError, match="^spread must be a finite number"):
        chains.ambiguous_pair(4, spread=float("nan"))
    with pytest.raises(ValueError, match="^tv must be a finite number"):
        chains.random_pair(4, tv=float("nan"))
    chains.random_pair(np.int64(4), seed=np.uint64(3))


def test_init_float_message_names_init():
    P, Q = _pair()
    F, G = markov.rule_tables(P, Q, 2, rules.vanilla())
    with pytest.raises(ValueError, match="^init must be a start state .* got the float 1.0"):
        markov.expected_accepted(P, Q, F, 1.0)


def test_exact_tv_max_sequences_none_and_message():
    P, Q = _pair(V=3)
    F, G = markov.rule_tables(P, Q, 2, rules.cool_sd(2.0))
    assert markov.exact_tv(P, Q, F, G, 0, max_sequences=None) == pytest.approx(markov.exact_tv(P, Q, F, G, 0))
    with pytest.raises(ValueError, match="^max_sequences: .* about [0-9.]+ (KiB|B)"):
        markov.exact_tv(P, Q, F, G, 0, max_sequences=10)
    with pytest.raises(ValueError, match="^max_sequences must be an integer"):
        markov.exact_tv(P, Q, F, G, 0, max_sequences=1.5)


def test_optimiser_counts_and_tolerances():
    from theory.markov import optimize

    P, Q = _pair(V=3)
    F, _ = markov.rule_tables(P, Q, 2, rules.cool_sd(2.0))
    with pytest.raises(ValueError, match="^iters must be an integer >= 0"):
        optimize.confirm_optimal_resampling(P, Q, F, 0, iters=-1)
    with pytest.raises(ValueError, match="^tol must be a finite number"):
        optimize.confirm_optimal_resampling(P, Q, F, 0, tol=float("nan"))
    with pytest.raises(ValueError, match="^n_starts must be an integer"):
        optimize.confirm_optimal_resampling(P, Q, F, 0, n_starts=True)
    with pytest.raises(ValueError, match="^maxiter must be an integer >= 1"):
        optimize.optimal_schedule(P, Q, 2, 0, 0.5, maxiter=-1)


# --------------------------------------------------------------------------- verify_chain / predict_rounds

def _chain_inputs(xp_tensor=False, V=6, L=3, R=5, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(V), size=(R, L + 1))
    q = rng.dirichlet(np.ones(V), size=(R, L))
    tok = rng.integers(0, V, size=(R, L))
    ua, us = rng.random((R, L)), rng.random(R)
    if xp_tensor:
        return tuple(torch.as_tensor(a) for a in (p, q, tok, ua, us))
    return p, q, tok, ua, us


@pytest.mark.parametrize("as_torch", [False, True])
def test_verify_chain_validates_its_inputs(as_torch):
    p, q, tok, ua, us = _chain_inputs(as_torch)
    v = rules.cool_sd(2.0)
    verify_chain(p, q, tok, ua, us, v)                          # valid: runs
    bad_tok = tok.clone() if as_torch else tok.copy()
    bad_tok[0, 0] = 6
    with pytest.raises(ValueError, match="^verify_chain: tokens must lie in \\[0, V=6\\)"):
        verify_chain(p, q, bad_tok, ua, us, v)
    bad_tok[0, 0] = -1
    with pytest.raises(ValueError, match="^verify_chain: tokens must lie in"):
        verify_chain(p, q, bad_tok, ua, us, v)
    nan_p = p.clone() if as_torch else p.copy()
    nan_p[1, 2, :] = float("nan")
    with pytest.raises(ValueError, match="^verify_chain: p contains NaN"):
        verify_chain(nan_p, q, tok, ua, us, v)
    with pytest.raises(ValueError, match="^verify_chain: q rows must sum to 1"):
        verify_chain(p, q * 3, tok, ua, us, v)
    with pytest.raises(ValueError, match="^verify_chain: u_accept must lie in \\[0, 1\\)"):
        verify_chain(p, q, tok, ua + 1, us, v)
    verify_chain(p, q, tok, ua, us, v, check=False)           # callers that built the rows may skip


def test_predict_rounds_validates_rows():
    p, q, tok, _, _ = _chain_inputs()
    v = rules.cool_sd(2.0)
    predict_rounds(p, q, tok, v)
    with pytest.raises(ValueError, match="^predict_rounds: p rows must sum to 1: found a row summing to 3"):
        predict_rounds(3 * p, q, tok, v)
    nan_q = q.copy()
    nan_q[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="^predict_rounds: q contains NaN"):
        predict_rounds(p, nan_q, tok, v)
    with pytest.raises(ValueError, match="^predict_rounds: drafts must lie in"):
        predict_rounds(p, q, tok + 6, v)
    with pytest.raises(ValueError, match="^predict_rounds: n_drafted"):
        predict_rounds(p, q, tok, v, n_drafted=np.full(tok.shape[0], 9))


def test_predict_rounds_accepts_upcast_float32_rows():
    """Rows recorded in float32 and upcast to float64 carry float32 rounding: accepted."""
    p, q, tok, _, _ = _chain_inputs(V=300)
    p32 = torch.softmax(torch.randn(5, 4, 300), -1).double()
    q32 = torch.softmax(torch.randn(5, 3, 300), -1).double()
    predict_rounds(p32, q32, torch.as_tensor(tok), rules.vanilla())


# --------------------------------------------------------------------------- size guards

def _peak(f):
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("V,L,init", [(6, 6, 0), (8, 5, "uniform")])
def test_exact_tv_memory_estimate_within_20_percent(V, L, init):
    P, Q = chains.ambiguous_pair(V, spread=0.5, tv=0.4, seed=0)
    init = np.full(V, 1 / V) if init == "uniform" else init
    F, G = markov.rule_tables(P, Q, L, rules.cool_sd(2.0))
    peak = _peak(lambda: markov.exact_tv(P, Q, F, G, init, max_sequences=None, max_bytes=None))
    S = int(np.count_nonzero(markov.init_distribution(init, V)))
    assert 0.8 <= markov.exact_tv_bytes(S, V, L) / peak <= 1.2
    with pytest.raises(checks.SizeError, match="exact TV .* would need about"):
        markov.exact_tv(P, Q, F, G, init, max_sequences=None, max_bytes=peak / 2)


@pytest.mark.parametrize("make", ["lantern_pp", "cool_sd", "lantern"])
def test_table_memory_estimate_within_20_percent(make):
    V, L = 100, 2
    P, Q = chains.ambiguous_pair(V, spread=0.5, tv=0.4, seed=0)
    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(V, 2)))
    v = {"lantern_pp": lambda: rules.lantern_pp(nb, 3, 2.0), "lantern": lambda: rules.lantern(nb, 3, 0.2),
         "cool_sd": lambda: rules.cool_sd(2.0)}[make]()
    markov.rule_tables(P, Q, L, v)  # warm-up (first-call allocations of numpy)
    peak = _peak(lambda: markov.rule_tables(P, Q, L, v, max_bytes=None))
    assert 0.8 <= markov.tables_bytes(v, V, L) / peak <= 1.2


def test_optimiser_exact_tv_objective_refused_before_allocating():
    """Estimates calibrated on measured RSS peaks (theory.markov.sizes.check_exact_size docstring)."""
    from theory.markov import optimize

    P, Q = chains.ambiguous_pair(17, spread=0.5, tv=0.4, seed=0)
    F, _ = markov.rule_tables(P, Q, 4, rules.cool_sd(2.0))
    t0 = time.perf_counter()
    with pytest.raises(checks.SizeError, match="objective='exact_tv' \\(Jacobian .* about 2.66 GiB"):
        optimize.confirm_optimal_resampling(P, Q, F, 0, objective="exact_tv", max_sequences=None)
    P, Q = chains.ambiguous_pair(40, spread=0.5, tv=0.4, seed=0)
    with pytest.raises(checks.SizeError, match="objective='exact_tv' \\(gradient .* about 4.6[0-9] GiB"):
        optimize.optimal_schedule(P, Q, 5, 0, 1.0, objective="exact_tv", max_sequences=None)
    assert time.perf_counter() - t0 < 10


def test_theory_table_V800_runs_within_2GB_and_larger_is_refused_fast(capsys, tmp_path):
    """The released LANTERN++ law is (V,) @ (V, V) products, so --V 800 --L 2 now
    runs, and within 2 GB (peak RSS of a child process); a V whose tables would not fit is refused in
    under a second with the memory it would need."""
    import resource
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "coolsd", "theory", "table", "--V", "800", "--L", "2"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024      # Linux: KiB
    assert peak < 2 * 2**30, peak
    t0 = time.perf_counter()
    assert main(["theory", "table", "--V", "6000", "--L", "2"]) == 2
    assert time.perf_counter() - t0 < 1.0
    err = _err(capsys)
    assert "--V 6000 --L 2" in err and "GiB" in err and err.count("\n") == 1


def test_predict_image_huge_T_refused_and_1e5_streams():
    P, Q = _pair(V=4)
    with pytest.raises(checks.SizeError, match="image_prediction \\(T=1000000000.*about 22.4 GiB"):
        image.predict_image(P, Q, rules.cool_sd(2.0), 4, 10**9, 0)
    T = 10**5
    peak = _peak(lambda: image.predict_image(P, Q, rules.cool_sd(2.0), 4, T, 0))
    assert peak < 40 * T     # (T + 1,) masses and draft lengths, no (T, V) array (would be 32 T here + more)
    assert peak <= 1.2 * image.image_bytes(T, 4, 4)


def test_predict_image_window_does_not_change_the_result(monkeypatch):
    P, Q = _pair(V=5, seed=2)
    a = image.predict_image(P, Q, rules.cool_sd(2.0), 3, 2000, 0)
    monkeypatch.setattr(image, "CHUNK", 7)
    b = image.predict_image(P, Q, rules.cool_sd(2.0), 3, 2000, 0)
    assert a.to_dict() == b.to_dict() and np.array_equal(a.boundary_mass, b.boundary_mass)


# --------------------------------------------------------------------------- coolsd generate: inputs

def _gen(*a):
    return main(["generate", "--json", *a])


@pytest.mark.parametrize("args,name", [
    (["--vq-ckpt", "garbage.pt"], "--vq-ckpt"),
    (["--model", "mnist", "--target-ckpt", "/nonexistent.pt"], "--target-ckpt"),
    (["--model", "chameleon-tiny", "--class-id", "3"], "--class-id"),
    (["--model", "hf-llama-tiny", "--draft", "small"], "--draft"),
    (["--temperature", "inf"], "--temperature"),
    (["--temperature", "1e-40"], "--temperature"),
    (["--cfg-scale", "nan"], "--cfg-scale"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**64)], "--seed"),
    (["--num-images", "0"], "--num-images"),
    (["--L", "0"], "--L"),
    (["--top-p", "0"], "--top-p"),
    (["--device", "gpu"], "--device"),
    (["--method", "nonsense"], "--method"),
    (["--model", "hf-llama-tiny", "--method", "lantern"], "--method lantern"),
    (["--model", "llamagen", "--target-ckpt", __file__, "--draft", "eagle", "--drafter-dir", "/nonexistent"],
     "--drafter-dir"),
])
def test_generate_refuses_before_any_work(capsys, args, name):
    t0 = time.perf_counter()
    assert _gen(*args) == 2
    err = _err(capsys)
    assert err.startswith("coolsd: error: ") and name in err and err.count("\n") == 1, err
    assert time.perf_counter() - t0 < 5


def test_generate_num_tokens_checked_before_generating(capsys, monkeypatch):
    from real.decode import engine

    def boom(*a, **k):
        raise AssertionError("generation started")

    monkeypatch.setattr(engine, "speculative_generate", boom)
    assert _gen("--num-tokens", "1000") == 2
    assert "--num-tokens 1000" in _err(capsys)


def _llamagen_t2i(tmp_path, captions):
    ck = tmp_path / "t.pt"
    ck.write_bytes(b"x")   # only its existence is checked before the captions
    return ["--model", "llamagen", "--model-type", "t2i", "--target-ckpt", str(ck), "--draft", "layerskip",
            "--captions", str(captions)]


def _caption(P=4, C=8, nan=False):
    e = torch.randn(P, C)
    if nan:
        e[0, 0] = float("nan")
    return {"embedding": e, "mask": torch.ones(P, dtype=torch.bool)}


@pytest.mark.parametrize("content,match", [
    (None, "is not an existing file"),
    (b"garbage", "is not a weights-only torch file"),
    ([], "non-empty list"),
    ([{"mask": torch.ones(3)}], "needs 'embedding'"),
    ([_caption(nan=True)], "NaN or infinite embedding"),
])
def test_captions_file_checks(capsys, tmp_path, content, match):
    path = tmp_path / "caps.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    assert _gen(*_llamagen_t2i(tmp_path, path)) == 2
    err = _err(capsys)
    assert "--captions" in err and match in err, err


def test_one_caption_with_three_images_is_an_error(capsys, tmp_path):
    path = tmp_path / "caps.pt"
    torch.save([_caption()], path)
    assert _gen(*_llamagen_t2i(tmp_path, path), "--num-images", "3") == 2
    err = _err(capsys)
    assert "--num-images 3" in err and "1 condition(s)" in err


def test_captions_give_one_image_each(capsys, tmp_path):
    """Positive control of the captions checks: a valid two-caption file runs and gives two images."""
    from real.models import llamagen as lg

    t = lg.LlamaGen(lg.config("tiny", model_type="t2i")).random_init(0)
    torch.save({"model": t.state_dict()}, tmp_path / "t.pt")
    torch.save([_caption(8, 32), _caption(8, 32)], tmp_path / "caps.pt")
    assert _gen("--model", "llamagen", "--model-type", "t2i", "--target-ckpt", str(tmp_path / "t.pt"),
                "--target-size", "tiny", "--image-size", "128", "--draft", "layerskip",
                "--captions", str(tmp_path / "caps.pt"), "--num-tokens", "4") == 0
    assert json.loads(capsys.readouterr().out)["num_images"] == 2


def test_processing_rejects_non_finite():
    from real.decode.sampling import Processing

    for kw, name in (({"temperature": math.inf}, "temperature"), ({"cfg_scale": math.nan}, "cfg_scale"),
                     ({"temperature": 1e-40}, "temperature")):
        with pytest.raises(ValueError, match=f"^{name}"):
            Processing(**kw)


# --------------------------------------------------------------------------- output paths

def _leftovers(d: pathlib.Path):
    return sorted(p.name for p in d.iterdir() if p.name.startswith(TMP_PREFIX))


@pytest.mark.parametrize("where,match", [
    ("missing/out.npz", "does not exist"),
    ("sub", "is an existing directory"),
    (".", "is not a file name"),
])
def test_save_path_refused_up_front(capsys, tmp_path, monkeypatch, where, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert _gen("--save", where) == 2
    err = _err(capsys)
    assert "--save" in err and match in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"] and not any((tmp_path / "sub").iterdir())


def test_save_onto_a_device_refused(capsys):
    assert _gen("--record", "/dev/null") == 2
    assert "--record: '/dev/null' exists and is not a regular file" in _err(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_save_into_unwritable_directory_refused(capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    assert _gen("--save", str(ro / "x")) == 2
    assert "--save: cannot write in" in _err(capsys)


def test_save_reports_the_file_written(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _gen("--save", "out", "--num-tokens", "16") == 0
    d = json.loads(capsys.readouterr().out)
    assert d["saved"] == "out.npz" and np.load(tmp_path / "out.npz")["tokens"].shape == (1, 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]


def test_interrupted_save_keeps_previous_file(capsys, tmp_path, monkeypatch):
    prev = tmp_path / "out.npz"
    prev.write_bytes(b"previous complete output")

    def interrupted(fh, **arrays):
        fh.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", interrupted)
    assert _gen("--save", str(prev), "--num-tokens", "8") == 130
    assert "interrupted" in _err(capsys)
    assert prev.read_bytes() == b"previous complete output"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["after a batch", "while assembling"])
def test_interrupted_record_leaves_nothing(capsys, tmp_path, monkeypatch, where):
    """--record streams batches (coolsd.npzstream.NpzStream): an interrupt after a batch was spooled, or while the
    final file is being assembled (half written), leaves no file and no spool behind."""
    from coolsd import npzstream

    if where == "after a batch":
        real = npzstream.NpzStream.append

        def interrupted(self, *a, **kw):
            real(self, *a, **kw)
            raise KeyboardInterrupt
        monkeypatch.setattr(npzstream.NpzStream, "append", interrupted)
    else:
        def interrupted(src, dst, *a, **kw):
            dst.write(b"partial")
            raise KeyboardInterrupt
        monkeypatch.setattr(npzstream.shutil, "copyfileobj", interrupted)
    assert _gen("--record", str(tmp_path / "rec"), "--num-tokens", "8") == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_atomic_dir_interrupt_keeps_previous_report(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(out) as tmp:
            (tmp / "report.json").write_text("new, half")
            raise KeyboardInterrupt
    assert (out / "report.json").read_text() == "old" and _leftovers(tmp_path) == []
    with atomic_dir(out) as tmp:
        (tmp / "report.json").write_text("new")
        (tmp / "pareto.png").write_text("png")
    assert sorted(p.name for p in out.iterdir()) == ["pareto.png", "report.json"]
    assert (out / "report.json").read_text() == "new" and _leftovers(tmp_path) == []


def test_atomic_dir_and_file_interrupt_on_fresh_path_leave_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "fresh") as tmp:
            (tmp / "a").write_text("x")
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(tmp_path / "f.npz") as fh:
            fh.write(b"x")
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_anneal_out_onto_existing_file(capsys, tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine")
    assert main(["theory", "anneal", "--out", str(f)]) == 2
    assert "--out" in _err(capsys) and f.read_text() == "mine"


def test_anneal_out_onto_foreign_directory(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["theory", "anneal", "--out", str(tmp_path)]) == 2
    assert "already holds other files (notes.txt)" in _err(capsys)


def test_demo_out_onto_existing_file_refused_before_work(capsys, tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine")
    t0 = time.perf_counter()
    assert main(["demo", "--out", str(f)]) == 2
    assert "--out" in _err(capsys) and time.perf_counter() - t0 < 5 and f.read_text() == "mine"


# --------------------------------------------------------------------------- the top-level handler

def _raising(exc):
    def run(args):
        raise exc
    return run


@pytest.mark.parametrize("exc,expect", [
    (FileNotFoundError(2, "No such file or directory", "/x/y.pt"), "No such file or directory: /x/y.pt"),
    (PermissionError(13, "Permission denied", "/root/z"), "Permission denied: /root/z"),
    (MemoryError(), "out of memory"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "out of memory (CUDA out of memory"),
    (RuntimeError("CUDA error: device-side assert triggered"), "device error: CUDA error"),
])
def test_expected_failures_are_one_line(capsys, monkeypatch, exc, expect):
    from coolsd.commands import generate

    monkeypatch.setattr(generate, "run", _raising(exc))
    assert main(["generate"]) == 2
    err = _err(capsys)
    assert err == f"coolsd: error: {err.split('coolsd: error: ', 1)[1]}" and expect in err and err.count("\n") == 1


def test_hub_errors_are_one_line(capsys, monkeypatch):
    hub = pytest.importorskip("huggingface_hub.errors")
    from coolsd.commands import generate

    monkeypatch.setattr(generate, "run", _raising(hub.LocalEntryNotFoundError("offline: c2i_B_256.pt not cached")))
    assert main(["generate"]) == 2
    err = _err(capsys)
    assert "Hugging Face hub" in err and "c2i_B_256.pt" in err and err.count("\n") == 1


def test_debug_shows_the_traceback(monkeypatch):
    from coolsd.commands import generate

    monkeypatch.setattr(generate, "run", _raising(FileNotFoundError(2, "No such file", "/x")))
    with pytest.raises(FileNotFoundError):
        main(["--debug", "generate"])
    monkeypatch.setenv("COOLSD_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["generate"])


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    from coolsd.commands import generate

    monkeypatch.setattr(generate, "run", _raising(TypeError("a bug")))
    with pytest.raises(TypeError):
        main(["generate"])


def test_ctrl_c_prints_one_line(capsys, monkeypatch):
    from coolsd.commands import generate

    monkeypatch.setattr(generate, "run", _raising(KeyboardInterrupt()))
    assert main(["generate"]) == 130
    assert _err(capsys) == "coolsd: interrupted\n"


# --------------------------------------------------------------------------- checkpoints

def test_garbled_safetensors_named(tmp_path):
    from real.nn.checkpoint import read_checkpoint

    f = tmp_path / "w.safetensors"
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ValueError, match=f"^{f}: not a readable safetensors file"):
        read_checkpoint(f)


def test_garbled_pickle_named(tmp_path):
    from real.nn.checkpoint import read_checkpoint

    f = tmp_path / "w.pt"
    f.write_bytes(b"garbage" * 10)
    with pytest.raises(ValueError, match=f"^{f}: not loadable as a weights-only checkpoint"):
        read_checkpoint(f)


def test_non_finite_weights_refused():
    from real.nn.checkpoint import load_checked

    m = torch.nn.Linear(3, 2)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    sd["weight"][0, 1] = float("inf")
    with pytest.raises(ValueError, match="^my ckpt has NaN or infinite values in 1 tensor\\(s\\): weight"):
        load_checked(m, sd, what="my ckpt")


def test_sha256_pinning(tmp_path, monkeypatch):
    import hashlib

    from real.nn import checkpoint as ck

    f = tmp_path / "c2i_B_256.pt"
    f.write_bytes(b"published bytes")
    good = hashlib.sha256(b"published bytes").hexdigest()
    assert ck.verify_pinned(f, "FoundationVision/LlamaGen", "c2i_B_256.pt") == str(f)   # not pinned: passes
    monkeypatch.setitem(ck.PINNED_SHA256, "FoundationVision/LlamaGen/c2i_B_256.pt", good)
    assert ck.verify_pinned(f, "FoundationVision/LlamaGen", "c2i_B_256.pt") == str(f)
    f.write_bytes(b"published bytez")                                                    # one byte flipped
    with pytest.raises(ValueError, match="FoundationVision/LlamaGen/c2i_B_256.pt .* is corrupt"):
        ck.verify_pinned(f, "FoundationVision/LlamaGen", "c2i_B_256.pt")


def test_pinned_hashes_are_well_formed():
    from real.nn.checkpoint import PINNED_SHA256

    for k, v in PINNED_SHA256.items():
        assert "/" in k and len(v) == 64 and int(v, 16) >= 0
