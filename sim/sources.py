"""Image-like token sources and the method comparison on them (``coolsd sim sources``).

(a) :func:`grid_source`: tokens on an H x W grid in raster order; the next token depends on its left
    and upper neighbours (state = the pair, with a boundary symbol on the first row / column). Tokens
    carry a 1-D latent "intensity" (token index / (V-1)); P puts a Gaussian bump of width ``ambiguity``
    (in token units) around the mean of the two neighbours' intensities, plus a fixed random texture;
    the draft Q is a perturbed copy (tempered logits plus noise). Not an order-1 chain in the token:
    exact theory does not apply, so the per-round bound is estimated along drafted paths (T11).
(b) :func:`codebook_source`: a VQ-like codebook with embeddings in R^d; an order-1 chain whose rows
    are Gaussian kernels in latent space, so latent neighbours get similar target mass (the token
    selection ambiguity); the neighbour table for LANTERN comes from ``theory.rules.lantern_neighbors``
    on the embeddings. Exact theory applies (E[tau] T8, bound T9, exact TV T7).

:func:`compare` runs vanilla, UniformRSD, Cool-SD, LANTERN, LANTERN++ and LANTERN with G* over a few
relaxation levels each and reports accepted length against exact TV (codebook) or the estimated
per-round bound (grid); :func:`plot` draws accepted length vs TV per method.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from theory.markov import chains
from theory import markov, rules
from theory.rules import methods

from .rounds import simulate_rule
from .sequence import simulate_sequence_rule
from .stats import tau_moments

__all__ = ["GridSource", "CodebookSource", "grid_source", "codebook_source", "method_grid", "compare",
           "format_rows", "plot"]


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


# --------------------------------------------------------------------------- (a) 2-D grid source

@dataclass(frozen=True)
class GridSource:
    """P, Q ((V+1)^2, V): rows indexed by state = left * (V+1) + up, V being the boundary symbol."""
    P: np.ndarray
    Q: np.ndarray
    V: int
    H: int
    W: int
    embeddings: np.ndarray
    neighbors: np.ndarray
    ambiguity: float
    draft_noise: float

    @property
    def T(self) -> int:
        return self.H * self.W

    def context(self, buf: np.ndarray, rows: np.ndarray, pos: np.ndarray, start: np.ndarray) -> np.ndarray:
        """State predicting raster position ``pos``: (left neighbour, upper neighbour), boundary = V."""
        col = pos % self.W
        left = np.where(col > 0, buf[rows, np.maximum(pos - 1, 0)], self.V)
        up = np.where(pos >= self.W, buf[rows, np.maximum(pos - self.W, 0)], self.V)
        return left * (self.V + 1) + up


def grid_source(V: int = 32, H: int = 16, W: int = 16, ambiguity: float = 2.0, draft_noise: float = 0.6,
                texture: float = 0.5, seed: int = 0) -> GridSource:
    """2-D grid source. ``ambiguity`` is the width (in tokens) of the target's bump around the neighbours'
    mean intensity: larger = flatter rows, more near-equal candidates. ``draft_noise`` is the standard
    deviation of the Gaussian noise added to the draft's logits (the draft is also tempered by 1.2)."""
    if V < 4 or H < 1 or W < 2:
        raise ValueError(f"grid_source: need V >= 4, H >= 1, W >= 2; got V={V}, H={H}, W={W}")
    if not (ambiguity > 0 and draft_noise >= 0 and texture >= 0):
        raise ValueError(f"grid_source: need ambiguity > 0, draft_noise >= 0, texture >= 0; got "
                         f"{ambiguity}, {draft_noise}, {texture}")
    rng = np.random.default_rng(seed)
    x = np.arange(V, dtype=np.float64)
    B = V + 1
    left = np.repeat(np.arange(B), B)                     # state = left * B + up
    up = np.tile(np.arange(B), B)
    lv = np.where(left < V, left, np.nan)
    uv = np.where(up < V, up, np.nan)
    m = np.where(np.isnan(lv) & np.isnan(uv), (V - 1) / 2,
                 np.where(np.isnan(lv), uv, np.where(np.isnan(uv), lv, (lv + uv) / 2)))
    m = m + 0.5 * ambiguity * rng.standard_normal(m.shape)          # per-state drift (fixed)
    logits = -((x[None, :] - m[:, None]) ** 2) / (2 * ambiguity**2) + texture * rng.standard_normal((B * B, V))
    P = _softmax(logits)
    Qd = _softmax(logits / 1.2 + draft_noise * rng.standard_normal((B * B, V)))
    emb = (x / (V - 1))[:, None]
    return GridSource(P, Qd, V, H, W, emb, rules.lantern_neighbors(emb), ambiguity, draft_noise)


# --------------------------------------------------------------------------- (b) latent codebook

@dataclass(frozen=True)
class CodebookSource:
    """Order-1 chain P, Q (V, V) over codebook tokens with embeddings (V, d); start law ``init``."""
    P: np.ndarray
    Q: np.ndarray
    embeddings: np.ndarray
    neighbors: np.ndarray
    init: np.ndarray
    ambiguity: float
    draft_noise: float


def codebook_source(V: int = 12, d: int = 2, ambiguity: float = 0.6, draft_noise: float = 0.35,
                    seed: int = 0) -> CodebookSource:
    """Latent-codebook chain. Embeddings e_x ~ N(0, I_d); from state s the target aims at a point c_s near
    a random codebook entry and P(x|s) ~ exp(-|e_x - c_s|^2 / (2 ambiguity^2)) (so tokens close in
    latent space get similar mass); the draft aims at c_s + draft_noise * N(0, I_d) with a 20% wider
    kernel. The start law is P's stationary distribution."""
    if V < 4 or d < 1:
        raise ValueError(f"codebook_source: need V >= 4 and d >= 1, got V={V}, d={d}")
    if not (ambiguity > 0 and draft_noise >= 0):
        raise ValueError(f"codebook_source: need ambiguity > 0 and draft_noise >= 0, got {ambiguity}, {draft_noise}")
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((V, d))
    c = E[rng.integers(V, size=V)] + 0.3 * rng.standard_normal((V, d))
    cq = c + draft_noise * rng.standard_normal((V, d))

    def rows(centres, width):
        d2 = ((centres[:, None, :] - E[None, :, :]) ** 2).sum(-1)
        return _softmax(-d2 / (2 * width**2))

    P = rows(c, ambiguity)
    Q = rows(cq, 1.2 * ambiguity)
    return CodebookSource(P, Q, E, rules.lantern_neighbors(E), chains.stationary(P), ambiguity, draft_noise)


# --------------------------------------------------------------------------- methods and comparison

# (method of theory.rules.methods, swept parameter, levels) compared on the sources
GRID = (("vanilla", None, (1.0,)), ("uniform-rsd", "c", (1.5, 2.0, 3.0)), ("cool-sd", "delta", (1.5, 2.0, 3.0, 4.0)),
        ("lantern", "delta", (0.1, 0.2, 0.4)), ("lantern++", "lambda", (1.5, 2.0, 3.0)),
        ("lantern+G*", "delta", (0.1, 0.2, 0.4)))


def method_grid(neighbors, L: int, k: int = 2) -> list[tuple[str, float, rules.Verifier]]:
    """(method, relaxation parameter, verifier) for the six methods of ``GRID``, a few levels each."""
    out = []
    for name, param, levels in GRID:
        extra = {"k": k} if methods.get(name).needs_neighbors else {}
        out += [(name, v, methods.build(name, L, neighbors, {**extra, **({param: v} if param else {})}))
                for v in levels]
    return out


def _codebook_rows(src: CodebookSource, L: int, n_rounds: int, seed: int, k: int):
    rows = []
    for j, (method, param, v) in enumerate(method_grid(src.neighbors, L, k)):
        F, G = markov.rule_tables(src.P, src.Q, L, v)
        res = simulate_rule(src.P, src.Q, v, L, src.init, n_rounds, seed + j)
        tau = res.accepted
        e_tau, var = tau_moments(markov.acceptance_probs(src.P, src.Q, F, src.init))
        rows.append({"source": "codebook", "method": method, "param": param,
                     "tokens_per_call": float(tau.mean() + 1), "tokens_per_call_se": math.sqrt(var / tau.size),
                     "exact_tokens_per_call": e_tau + 1,
                     "tv": markov.exact_tv(src.P, src.Q, F, G, src.init), "tv_kind": "exact",
                     "bound": markov.tv_bound(src.P, src.Q, F, G, src.init), "bound_se": 0.0})
    return rows


def _grid_rows(src: GridSource, L: int, n_images: int, seed: int, k: int):
    rows = []
    for j, (method, param, v) in enumerate(method_grid(src.neighbors, L, k)):
        res = simulate_sequence_rule(src.P, src.Q, v, L, src.T, n_images, seed + j, context=src.context,
                                     record_bound=True)
        tpc = res.tokens_per_call()
        full = res.drafted == L                                   # rounds with the full draft length
        b = res.bound[full]
        acc_img = np.nansum(res.bound, axis=1)                    # accumulated bound per image (section 7)
        t10 = res.predicted[full]
        rows.append({"source": "grid", "method": method, "param": param,
                     "tokens_per_call": float(tpc.mean()), "tokens_per_call_se": float(tpc.std(ddof=1) / math.sqrt(tpc.size)),
                     "mean_tau_full_rounds": float(res.accepted[full].mean()),
                     "t10_full_rounds": float(t10.mean()),
                     "tv": float(b.mean()), "tv_kind": "per-round bound (T11 estimate)",
                     "bound": float(b.mean()), "bound_se": float(b.std(ddof=1) / math.sqrt(b.size)),
                     "image_bound": float(acc_img.mean())})
    return rows


def compare(which=("codebook", "grid"), *, L: int = 4, k: int = 2, n_rounds: int = 40_000, n_images: int = 48,
            seed: int = 0, codebook: CodebookSource | None = None, grid: GridSource | None = None) -> list[dict]:
    """Accepted length (tokens per target call = tau + 1) against TV for each method and relaxation level.

    codebook: simulated tau + 1 (SE from the exact Var(tau)) next to the exact E[tau] + 1, exact TV (T7,
    start ~ stationary law)
    and bound B (T9). grid: whole H x W images by successive rounds (section 7): tokens per call
    T / rounds (SE over images), the per-round bound estimated along the drafted paths (T11, rounds with
    the full draft length; SE over rounds), the accumulated bound per image, and the T10 accepted-draft
    estimate next to the measured tau (a consistency check).
    """
    rows = []
    if "codebook" in which:
        rows += _codebook_rows(codebook or codebook_source(seed=seed), L, n_rounds, seed, k)
    if "grid" in which:
        rows += _grid_rows(grid or grid_source(seed=seed), L, n_images, seed, k)
    return rows


def format_rows(rows: list[dict]) -> str:
    head = (f"{'source':9s} {'method':11s} {'param':>6s} {'tok/call':>9s} {'+-SE':>7s} {'exact':>7s} "
            f"{'TV':>8s} {'bound':>8s} {'+-SE':>7s} {'extra':s}")
    out = [head, "-" * (len(head) + 30)]
    for r in rows:
        exact = f"{r['exact_tokens_per_call']:7.4f}" if "exact_tokens_per_call" in r else f"{'-':>7s}"
        tv = f"{r['tv']:8.4f}" if r["tv_kind"] == "exact" else f"{'-':>8s}"
        extra = "" if r["source"] == "codebook" else (f"image bound {r['image_bound']:.3f}; tau (full rounds) "
                                                    f"{r['mean_tau_full_rounds']:.3f} vs T10 {r['t10_full_rounds']:.3f}")
        out.append(f"{r['source']:9s} {r['method']:11s} {r['param']:6.2f} {r['tokens_per_call']:9.4f} "
                   f"{r['tokens_per_call_se']:7.4f} {exact} {tv} {r['bound']:8.4f} {r['bound_se']:7.4f} {extra}")
    return "\n".join(out)


def plot(rows: list[dict], path) -> None:
    """Accepted length (tokens per target call) against TV per method; one panel per source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = [s for s in ("codebook", "grid") if any(r["source"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(sources), figsize=(6 * len(sources), 4.5), squeeze=False)
    markers = {"vanilla": "*", "uniform-rsd": "s", "cool-sd": "o", "lantern": "^", "lantern++": "v", "lantern+G*": "D"}
    for ax, s in zip(axes[0], sources):
        for method, mk in markers.items():
            rs = sorted((r for r in rows if r["source"] == s and r["method"] == method), key=lambda r: r["tv"])
            if not rs:
                continue
            ax.errorbar([r["tv"] for r in rs], [r["tokens_per_call"] for r in rs],
                        yerr=[r["tokens_per_call_se"] for r in rs], marker=mk, capsize=2, label=method,
                        ms=9 if method == "vanilla" else 5)
        ax.set_xlabel("exact TV(Phat, P) per round" if s == "codebook" else "per-round TV bound (T11 estimate)")
        ax.set_ylabel("tokens per target call (tau + 1)")
        ax.set_title("latent codebook (order-1 chain)" if s == "codebook" else "2-D grid source (left/up context)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
