"""Study (d) of issue 49: drafter-free decoding on the shipped natural256 target (256 tokens, V = 1024, CFG 2):
SJD (Jacobi windows, vanilla), GSD (SJD's windows verified by GSD, as released) and SJD-PAC-P (ours: the SJD-PAC
proactive tree made lossless), plus plain AR as the reference, --images fresh images each (class i mod 16).

Why a script and not ``coolsd sweep``: the sweep runs ``--mode jacobi`` but refuses ``--mode sjd-pac-p``
(``real.decode.modes.sjd_pac.SJDPACDef.sweep_reason``), and it scores no Jacobi-family setting (no exact
likelihood: ``real.decode.jacobi.JACOBI_REASON``). So every setting runs here through the same engine call, with
the same conditions, and is measured the same way.

Per setting: tokens per target call (SE over images), the share of calls committing one token, wall seconds per
image (shared machine: indicative only). Fidelity, as far as it is measurable (``drafter_free_fidelity``):

* vanilla on SJD and on SJD-PAC-P is lossless by construction (law tests: tests/test_jacobi.py,
  tests/test_sjd_pac.py), so KL = TV = 0 exactly; the measurements below serve as the check;
* exact KL / TV of GSD on Jacobi drafts is not tractable (docs/theory.md section 12); measured instead, against
  the plain-AR images of the same run: the target NLL per token of the images (log P(x) under the sampled CFG law;
  its shift from AR's is KL(P^||P) + H(P^) - H(P), not a KL), classifier-feature FD to held-out crops, and lower
  bounds on TV and on both KLs from a two-sample test (a set A chosen on one half of the images, P^(A) and P(A)
  read on the other half: TV >= |P^(A) - P(A)|, KL >= kl of the two Bernoullis, data processing).

Resumable: images are made in blocks of --block (one npz per setting and block under OUT/units/, written
atomically); a rerun skips the blocks present. Per-image scores are cached under OUT/scores/.

  PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python scripts/drafter_free_natural256.py --out DIR --images 1000
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

ZOO = "natural256"
# setting name -> (drafting mode or None for plain AR, method, method params)
SETTINGS = {
    "ar": (None, None, {}),
    "sjd": ("jacobi", "vanilla", {}),
    "gsd": ("jacobi", "gsd", {}),
    "sjd-pac-p": ("sjd-pac-p", "vanilla", {}),
    "sjd-pac-p+gsd": ("sjd-pac-p", "gsd", {}),
    "sjd+cool-sd:delta=2": ("jacobi", "cool-sd", {"delta": 2.0}),
    "sjd+cool-sd:delta=3": ("jacobi", "cool-sd", {"delta": 3.0}),
    "sjd+cool-sd:delta=4": ("jacobi", "cool-sd", {"delta": 4.0}),
}
DEFAULT = ("ar", "sjd", "gsd", "sjd-pac-p")
LOSSLESS = {"ar", "sjd", "sjd-pac-p"}
LABEL = {"ar": "plain AR", "sjd": "SJD (Jacobi W=16, vanilla)", "gsd": "GSD (SJD windows W=16, GSD as released)",
         "sjd-pac-p": "SJD-PAC-P (W=16, K=3, D=3, vanilla)", "sjd-pac-p+gsd": "SJD-PAC-P windows, GSD",
         "sjd+cool-sd:delta=2": "SJD windows, Cool-SD delta=2", "sjd+cool-sd:delta=3": "SJD windows, Cool-SD delta=3",
         "sjd+cool-sd:delta=4": "SJD windows, Cool-SD delta=4"}


def atomic_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def code_version() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def block_seed(base: int, name: str, j: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{base}/{name}/{j}".encode()).digest()[:7], "big")


class Context:
    """The natural256 bundle (no draft model), its processing and the drafting modes and verifiers."""

    def __init__(self, a):
        import torch

        from real.specs import model_facts
        from real.decode.methods import gsd_vectors, make_verifier
        from real.decode.modes import lookup
        from real.decode.sampling import Processing
        from real.protocol import NO_DRAFT
        from real.registry import BuildOptions, build

        torch.set_num_threads(a.threads)
        self.b = build(ZOO, BuildOptions(device="cpu", draft=NO_DRAFT, seed=a.seed, num_images=a.images))
        self.T = int(self.b.num_tokens)
        self.proc = Processing(temperature=1.0, cfg_scale=self.b.cfg_scale)
        facts = model_facts(self.b, ZOO)
        self.modes = {"jacobi": lookup("jacobi").build({"window": a.window}, facts),
                      "sjd-pac-p": lookup("sjd-pac-p").build({"window": a.window, "tree_width": a.pac_width,
                                                              "tree_depth": a.pac_depth}, facts)}
        emb = gsd_vectors(self.b)[0]
        self.verifiers = {}
        for name, (mode, method, params) in SETTINGS.items():
            if mode is not None:
                L = self.modes[mode].max_depth
                self.verifiers[name] = make_verifier(method, L, neighbors=self.b.neighbors, embeddings=emb, **params)


def run_block(ctx: Context, a, name: str, j: int) -> dict:
    import torch

    from real.decode import engine

    mode, _, _ = SETTINGS[name]
    lo = j * a.block
    classes = [i % 16 for i in range(lo, lo + a.block)]
    t0, c0 = time.perf_counter(), time.process_time()
    gens = engine.generate(ctx.b.target, None, classes, num_tokens=ctx.T,
                           verifier=ctx.verifiers.get(name), drafting=None if mode is None else ctx.modes[mode],
                           processing=ctx.proc, seed=block_seed(a.seed, name, j), batch_size=a.batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    acc = [r.accepted + 1 for g in gens for r in g.rounds]
    return {"tokens": torch.stack([g.tokens for g in gens]).numpy().astype(np.int16),
            "classes": np.array(classes, np.int64), "rounds": np.array([len(g.rounds) for g in gens], np.int64),
            "round_tokens": np.array(acc, np.int16),
            "round_drafted": np.array([r.drafted for g in gens for r in g.rounds], np.int16),
            "wall": np.array(wall), "cpu": np.array(cpu), "code_version": np.array(code_version()),
            "started": np.array(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))}


def unit_path(out: Path, name: str, j: int) -> Path:
    return out / "units" / name.replace(":", "_").replace("=", "") / f"b{j:03d}.npz"


def load_setting(out: Path, a, name: str) -> dict | None:
    """All blocks of a setting merged, or None when any is missing."""
    parts = []
    for j in range(a.images // a.block):
        p = unit_path(out, name, j)
        if not p.exists():
            return None
        with np.load(p) as z:
            parts.append({k: z[k] for k in z.files})
    cat = {k: np.concatenate([p[k] for p in parts]) for k in ("tokens", "classes", "rounds", "round_tokens",
                                                               "round_drafted")}
    cat["wall"] = float(sum(float(p["wall"]) for p in parts))
    cat["cpu"] = float(sum(float(p["cpu"]) for p in parts))
    cat["code_versions"] = sorted({str(p["code_version"]) for p in parts})
    cat["started"] = min(str(p["started"]) for p in parts)
    return cat


def generate_all(out: Path, a) -> None:
    ctx = None
    for name in a.settings:   # a loop over settings and blocks (units), each an engine call
        for j in range(a.images // a.block):
            p = unit_path(out, name, j)
            if p.exists():
                continue
            ctx = ctx or Context(a)
            row = run_block(ctx, a, name, j)
            atomic_bytes(p, npz_bytes(**row))
            tpc = ctx.T * len(row["rounds"]) / row["rounds"].sum()
            print(f"{time.strftime('%H:%M:%S')} {name} block {j}: {float(row['wall']):.0f} s, "
                  f"tokens/call {tpc:.3f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--block", type=int, default=100, help="images per stored unit (divides --images)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--pac-width", type=int, default=3)
    ap.add_argument("--pac-depth", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settings", nargs="+", default=list(DEFAULT), choices=list(SETTINGS))
    ap.add_argument("--report-only", action="store_true", help="no generation: score and report what is stored")
    a = ap.parse_args(argv)
    if a.images < 2 or a.block < 1 or a.images % a.block or a.batch < 1:
        raise SystemExit("--images >= 2, --block >= 1 dividing --images, --batch >= 1")
    if "ar" not in a.settings:
        a.settings = ["ar", *a.settings]
    out = Path(a.out)
    t0 = time.time()
    if not a.report_only:
        generate_all(out, a)
    from drafter_free_fidelity import report

    report(out, a, {n: load_setting(out, a, n) for n in a.settings}, time.time() - t0, LABEL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
