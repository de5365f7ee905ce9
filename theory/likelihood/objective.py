"""KL(P||P^) and TV(P^, P) of a rule family on plain-AR images, exactly and with exact gradients (docs/theory.md
section 8c).

For n images x drawn from the target P (plain AR, or a vanilla SD run) with teacher-forced rows (``ARRows``),

    KL(P||P^) per token = (1/n) sum_x (log P(x) - log P^(x)) / T,     TV(P^, P) = (1/n) sum_x (1 - P^(x)/P(x))_+,

where log P^(x) is the exact law (T12, ``theory.likelihood.log_likelihood``) of chain SD with the family's rule.
``ExactObjective(rows, family)`` computes both, per image (``log_p_hat``) and averaged (``values``), and the gradient
of either with respect to the family's parameters theta (``value_and_grad``): JAX float64 through the forward
recursion (``lax.scan`` over the T positions, each step O(L) on (images, L + 1) arrays).

**Sufficient statistics.** Token t as the (i+1)-th draft of a round (offset i) has the emissions of
``theory.likelihood.chain._emissions``: a = q f(x) / sum q, r = (1 - beta) G*(x) (with sums, as the engine
normalises its draws) and the bonus p(x) / sum p. For the scaled families (f = min(1, w p/q), G* = Norm([p - q f]_+))
with a weight w per (image, t, offset), only two row reductions depend on w:

    rej(w) = sum_y q_y (1 - f_y) = sum_y [q_y - w p_y]_+           (the rejection mass, 1 - beta times sum q)
    Z(w)   = sum_y [p_y - min(q_y, w p_y)]_+ = sum p - sum q + rej(w)   (w <= 1: no positive part is active)
           = sum_y [p_y - q_y]_+                                     (w >= 1: Proposition 1)

and the rest are token entries (q(x), p(x)) and row sums, computed once per image chunk. So one evaluation is ONE
fused pass over the rows computing rej for every (image, t, offset) (O(V) each, no (V,) temporaries: XLA fuses
max-and-sum), plus O(n T L) work. The derivative d rej / dw = -sum_{q_y > w p_y} p_y comes out of the same pass
(a two-output reduction, ``jax.custom_jvp``), so value + gradient cost about one pass too. Sorted ratios q_y / p_y
with cumulative sums would make an evaluation O(log V) per row, but they hold three float64 numbers per (image, t,
offset, y): 4.6 GB for 2,000 MNIST images with EAGLE rows, against the rows' own 1 GB in float32 (measured: 94% of
the ratios lie in [0.01, 100] there, so a window of relevant ratios does not shrink them). The level family needs
no pass: rej = (1 - a) sum [q - p]_+ and Z = sum [p - q]_+ are fixed row sums.

Families (theta): "free" (w_i = exp(theta_i)), "uniform", "exponential", "linear", "level" (a_i = sigmoid(theta_i);
``theory.likelihood.tune.family_values``), and the row-conditioned "entropy" / "maxp": w_i(p) = exp(theta_i +
theta_L phi(p)), phi the target row's entropy or largest probability (``rules.RowScaled``; ``rule_of`` gives the rule
objects the engine runs). Streaming: images are processed in chunks of ``chunk_images`` (padded to one shape: one
compilation), from in-memory ``ARRows`` (the rows are copied to JAX chunk by chunk, once) or from any object with
the same ``stamp``, ``n`` and ``chunk(a, b) -> (p, q, tokens)`` (``keep=False``: made again at every evaluation,
bounded memory: the LlamaGen-XL-sized check of ``benchmarks/bench_tune_exact.py``).
"""
from __future__ import annotations

import numpy as np

from .. import rules
from ..core.jaxtools import jax64
from . import tune
from .chain import round_masks, scaled_emissions

__all__ = ["FAMILIES", "ROW_FAMILIES", "n_params", "box", "rule_of", "values_of", "lossless_theta", "ExactObjective"]

FAMILIES = ("free", "level", "uniform", "exponential", "linear", "entropy", "maxp")
ROW_FAMILIES = ("entropy", "maxp")
SLOPE = {"entropy": (-3.0, 3.0), "maxp": (-16.0, 16.0)}    # box of the slope b (phi: nats up to log V; max p in [0, 1])
CHUNK_IMAGES = 256


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return family


def checks_L(L) -> int:
    from ..core import checks

    return checks.integer("L", L, lo=1)


def n_params(family: str, L: int) -> int:
    return L + 1 if check_family(family) in ROW_FAMILIES else tune.n_params(family, L)


def box(family: str, L: int) -> list[tuple[float, float]]:
    """Bounds of theta for the optimiser (log-weights in ``tune.LOGW``; the slope in ``SLOPE``)."""
    if check_family(family) in ROW_FAMILIES:
        return [tune.LOGW] * L + [SLOPE[family]]
    return tune._box(family, L)


def check_theta(family: str, theta, L: int, who: str = "theta") -> np.ndarray:
    """A numpy theta of family ``family`` at draft length ``L``: (n_params(family, L),) finite float64, else a
    one-line ValueError (TypeError for what is not numbers)."""
    try:
        t = np.asarray(theta, np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{who} must be {n_params(family, L)} numbers, got {type(theta).__name__}") from None
    k = n_params(family, L)
    if t.shape != (k,):
        raise ValueError(f"{who} of family {family!r} at L = {L} must hold {k} numbers, got shape {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError(f"{who} must be finite, got {t.tolist()}")
    return t


def rule_of(family: str, theta, L: int) -> rules.Verifier:
    """The verifier of parameters theta (draft length L): the engine's rule objects (numpy theta: ``Explicit``
    weights; a JAX array: ``Vector``, traceable). Scaled families: ``rules.scaled``; level: ``rules.level``; row
    families: ``rules.row_scaled`` with c_i = exp(theta_i), slope theta_L and the family's row feature."""
    check_family(family)
    numeric = isinstance(theta, (np.ndarray, list, tuple))
    if numeric:
        theta = check_theta(family, theta, checks_L(L))
    if family in ROW_FAMILIES:
        if numeric:
            t = theta
            return rules.row_scaled(rules.Explicit(tuple(np.exp(t[:L]).tolist())), float(t[L]), family)
        import jax.numpy as jnp

        return rules.row_scaled(rules.Vector(jnp.exp(theta[:L])), theta[L], family)
    if numeric:
        return tune.rule_of(family, tune.family_values(family, np.asarray(theta, np.float64), L))
    import jax.numpy as jnp

    return tune.rule_of(family, tune.family_values(family, theta, L, jnp))


def values_of(family: str, theta, L: int) -> dict:
    """The schedule of theta as JSON-ready numbers: {"weights": c_1..c_L, "slope": b, "feature"} (row families),
    {"weights": w_1..w_L} (scaled) or {"levels": a_1..a_L} (level)."""
    t = np.asarray(theta, np.float64)
    if family in ROW_FAMILIES:
        return {"weights": np.exp(t[:L]).tolist(), "slope": float(t[L]), "feature": family}
    v = np.asarray(tune.family_values(family, t, L), np.float64).tolist()
    return {"levels": v} if family == "level" else {"weights": v}


# --------------------------------------------------------------------------- the JAX computation

def _functions(family: str, L: int, convention: str, T: int, per_offset: bool):
    """(stats, log_p_hat, terms) jitted for this family and shape class (built once per process per key)."""
    from ..core.jaxtools import jitted

    key = f"objective:{family}:{L}:{convention}:{T}:{per_offset}"
    return jitted(key, lambda: _build(family, L, convention, T, per_offset))


def _build(family, L, convention, T, per_offset):
    with jax64() as (jax, jnp):
        from jax import lax

        draft, bonus = round_masks(T, L, convention)
        used = draft[:, :L] if per_offset else draft[:, :L].any(axis=1, keepdims=True)     # q rows read (T, L')
        feature = family if family in ROW_FAMILIES else "entropy"
        f64 = jnp.float64

        def reduce2(P, Q, W):
            """rej = sum [q - w p]_+ and s = sum_{q > w p} p over V (one fused two-output reduction)."""
            p, q = P.astype(f64), Q.astype(f64)
            x = q - W[..., None] * p
            m = x > 0
            a1, a2 = jnp.where(m, x, 0.0), jnp.where(m, jnp.broadcast_to(p, x.shape), 0.0)
            return lax.reduce((a1, a2), (0.0, 0.0), lambda u, v: (u[0] + v[0], u[1] + v[1]), (x.ndim - 1,))

        @jax.custom_jvp
        def rejection(P, Q, W):
            return jnp.sum(jnp.maximum(Q.astype(f64) - W[..., None] * P.astype(f64), 0.0), axis=-1)

        def rejection_jvp(primals, tangents):
            P, Q, W = primals
            r, s = reduce2(P, Q, W)
            r, s = jnp.where(jnp.isfinite(r), r, 0.0), jnp.where(jnp.isfinite(s), s, 0.0)   # unread rows: anything
            dW = tangents[2]
            if type(dW).__name__ == "SymbolicZero":
                return r, jnp.zeros_like(r)
            return r, -s * dW           # d rej / dw = -sum_{q > w p} p

        rejection.defjvp(rejection_jvp, symbolic_zeros=True)

        def stats(P, Q, X):
            """Per chunk, once: token entries, row sums, vanilla's residual / rejection masses, the row feature,
            log P(x). P (n, T, V), Q (n, T, L', V), X (n, T)."""
            p = P.astype(f64)
            q = Q.astype(f64)
            mu = jnp.asarray(used)
            sp = jnp.sum(p, axis=-1)
            px = jnp.take_along_axis(p, X[..., None], axis=-1)[..., 0]
            qx = jnp.take_along_axis(q, jnp.broadcast_to(X[:, :, None, None], q.shape[:3] + (1,)), axis=-1)[..., 0]
            sq = jnp.where(mu, jnp.sum(q, axis=-1), 1.0)                     # unread rows may hold anything
            zvan = jnp.where(mu, jnp.sum(jnp.maximum(p[:, :, None] - q, 0.0), axis=-1), 0.0)
            rvan = jnp.where(mu, jnp.sum(jnp.maximum(q - p[:, :, None], 0.0), axis=-1), 0.0)
            pt = px / sp
            lp = jnp.sum(jnp.where(pt > 0, jnp.log(jnp.where(pt > 0, pt, 1.0)), -jnp.inf), axis=-1)
            return {"sp": sp, "px": px, "qx": jnp.where(mu, qx, 0.0), "sq": sq, "zvan": zvan, "rvan": rvan,
                    "phi": rules.row_feature(p, feature, jnp)[..., 0], "log_p": lp}

        def weights(theta, st):
            if family in ROW_FAMILIES:
                return jnp.exp(theta[:L])[None, None, :] * jnp.exp(theta[L] * st["phi"])[..., None]
            return jnp.broadcast_to(tune.family_values(family, theta, L, jnp), st["px"].shape + (L,))

        def log_p_hat(theta, P, Q, st):
            """log P^(x) (n,) of every image of the chunk (module docstring; T12)."""
            px, sp = st["px"][..., None], st["sp"][..., None]
            mu = jnp.asarray(used)
            if family == "level":
                a = tune.family_values("level", theta, L, jnp)
                mn = jnp.minimum(st["qx"], px) + a * jnp.maximum(st["qx"] - px, 0.0)
                rej = (1 - a) * st["rvan"]
                num = jnp.maximum(px - st["qx"], 0.0)
                Z = st["zvan"] * jnp.ones_like(mn)
            else:                  # the scaled families: the grid pass's formula (chain.scaled_emissions)
                W = weights(theta, st)
                rej = jnp.where(mu, rejection(P[:, :, None, :], Q, W), 0.0)
                a_em, r_em = scaled_emissions(W, px, st["qx"], sp, st["sq"], st["zvan"], rej, jnp)
                return _forward(jnp, lax, a_em, r_em, st["px"] / st["sp"], draft, bonus, L)
            pos = Z > 0
            g = jnp.where(pos, num / jnp.where(pos, Z, 1.0), px / sp)
            a_em = mn / st["sq"]
            r_em = rej / st["sq"] * g
            return _forward(jnp, lax, a_em, r_em, st["px"] / st["sp"], draft, bonus, L)

        def terms(theta, P, Q, st, weight):
            """(sum of weight x KL term, sum of weight x TV term) over the chunk's images."""
            lph = log_p_hat(theta, P, Q, st)
            d = lph - st["log_p"]
            real = weight > 0
            kl = jnp.where(real, -d / T, 0.0)
            tv = jnp.where(real, -jnp.expm1(jnp.minimum(d, 0.0)), 0.0)
            return jnp.stack([jnp.sum(weight * kl), jnp.sum(weight * tv)])

        def grads(theta, P, Q, st, weight):
            J, v = jax.jacrev(lambda th: (terms(th, P, Q, st, weight),) * 2, has_aux=True)(theta)
            return v, J

        return {"stats": jax.jit(stats), "log_p_hat": jax.jit(log_p_hat), "terms": jax.jit(terms),
                "grads": jax.jit(grads)}


def _forward(jnp, lax, a, r, pt, draft, bonus, L: int):
    """The scaled forward recursion of ``theory.likelihood.chain._forward`` (T12) as a ``lax.scan`` over t:
    a, r (n, T, L) emissions, pt (n, T) -> (n,) log P^ (-inf for a sequence the sampler cannot emit)."""
    n, T = pt.shape
    dm, bm = jnp.asarray(draft), jnp.asarray(bonus)
    zL = jnp.zeros((n, T, 1))
    A = jnp.where(dm, jnp.concatenate([a, zL], axis=-1), 0.0)
    R = jnp.where(dm, jnp.concatenate([r, zL], axis=-1), jnp.where(bm, pt[..., None], 0.0))

    def step(carry, xs):
        alpha, logz = carry
        At, Rt = xs
        new = jnp.concatenate([jnp.sum(alpha * Rt, axis=-1, keepdims=True), (alpha * At)[:, :L]], axis=-1)
        c = jnp.sum(new, axis=-1)
        pos = c > 0
        cs = jnp.where(pos, c, 1.0)
        logz = logz + jnp.where(pos, jnp.log(cs), -jnp.inf)
        return (jnp.where(pos[:, None], new / cs[:, None], 0.0), logz), None

    alpha0 = jnp.zeros((n, L + 1)).at[:, 0].set(1.0)
    (_, logz), _ = lax.scan(step, (alpha0, jnp.zeros(n)), (jnp.swapaxes(A, 0, 1), jnp.swapaxes(R, 0, 1)))
    return logz


# --------------------------------------------------------------------------- the objective

class ExactObjective:
    """KL per token and TV of ``family`` on the images ``images`` (indices, default all) of ``rows`` (module
    docstring). ``weights`` (n,) >= 0: a weighted mean over images (tests: the exact law P(x) of every sequence);
    ``keep``: hold the prepared chunks (JAX copies of the rows, made once) or make them at every evaluation."""

    def __init__(self, rows, family: str, images=None, weights=None, chunk_images: int | None = None,
                 keep: bool = True):
        from .arrows import ARRows

        self.family = check_family(family)
        if not isinstance(rows, ARRows) and not (hasattr(rows, "chunk") and hasattr(rows, "stamp")):
            raise TypeError(f"ExactObjective: rows must be ARRows (or a streaming source with chunk and stamp), "
                            f"got {type(rows).__name__}")
        self.rows, self.stamp = rows, rows.stamp
        self.L, self.T, self.V = int(rows.stamp["L"]), int(rows.stamp["T"]), int(rows.stamp["V"])
        self.convention = rows.stamp["convention"]
        self.idx = np.arange(rows.n) if images is None else np.asarray(images, np.int64)
        if self.idx.ndim != 1 or self.idx.size < 1:
            raise ValueError("ExactObjective: images must be a non-empty list of image indices")
        w = np.ones(self.idx.size) if weights is None else np.asarray(weights, np.float64)
        if w.shape != self.idx.shape or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError("ExactObjective: weights must be (n,) finite, >= 0, with a positive sum")
        self.weight, self.total = w, float(w.sum())
        self.chunk = int(min(chunk_images or CHUNK_IMAGES, self.idx.size))
        self.keep = keep
        self._prepared = None
        self.evaluations = 0

    @property
    def n(self) -> int:
        return int(self.idx.size)

    def _chunks(self):
        """(P, Q, stats, weight) per chunk (JAX), padded to ``self.chunk`` images with weight-0 copies."""
        if self._prepared is not None:
            yield from self._prepared
            return
        made = []
        with jax64() as (jax, jnp):
            for a in range(0, self.n, self.chunk):   # a loop over chunks of images (memory)
                ids = self.idx[a:a + self.chunk]
                w = self.weight[a:a + self.chunk]
                pad = self.chunk - ids.size
                if pad:
                    ids, w = np.concatenate([ids, np.full(pad, ids[0])]), np.concatenate([w, np.zeros(pad)])
                p, q, x = _take(self.rows, ids)
                per_offset = q.ndim == 4
                fn = _functions(self.family, self.L, self.convention, self.T, per_offset)
                P, X = jnp.asarray(p), jnp.asarray(x)
                Q = jnp.asarray(q) if per_offset else jnp.asarray(q)[:, :, None, :]
                del p, q
                item = (P, Q, fn["stats"](P, Q, X), jnp.asarray(w), fn)
                if self.keep:
                    made.append(item)
                yield item
        if self.keep:
            self._prepared = made

    def _theta(self, theta) -> np.ndarray:
        """theta as the family's (n_params,) finite float64 vector: one-line ValueError otherwise (NaN never reaches
        the law, where it would read as KL = inf)."""
        return check_theta(self.family, theta, self.L)

    def log_p_hat(self, theta) -> np.ndarray:
        """(n,) log P^(x) of every image under the family's rule at theta (numpy float64)."""
        out = []
        with jax64() as (jax, jnp):
            th = jnp.asarray(self._theta(theta))
            for P, Q, st, w, fn in self._chunks():
                out.append(np.asarray(fn["log_p_hat"](th, P, Q, st))[np.asarray(w) > 0])
        return np.concatenate(out)

    def log_p(self) -> np.ndarray:
        """(n,) log P(x) of every image (``theory.likelihood.log_target``)."""
        return np.concatenate([np.asarray(st["log_p"])[np.asarray(w) > 0] for _, _, st, w, _ in self._chunks()])

    def values(self, theta) -> dict:
        """{"kl": KL(P||P^) per token, "tv": TV} (weighted means over the images) at theta."""
        tot = np.zeros(2)
        with jax64() as (jax, jnp):
            th = jnp.asarray(self._theta(theta))
            for P, Q, st, w, fn in self._chunks():
                tot += np.asarray(fn["terms"](th, P, Q, st, w))
        self.evaluations += 1
        return {"kl": float(tot[0] / self.total), "tv": float(tot[1] / self.total)}

    def value_and_grad(self, theta) -> tuple[dict, dict]:
        """({"kl", "tv"}, {"kl": d KL / d theta, "tv": d TV / d theta}) at theta (exact, JAX)."""
        tot, J = np.zeros(2), np.zeros((2, n_params(self.family, self.L)))
        with jax64() as (jax, jnp):
            th = jnp.asarray(self._theta(theta))
            for P, Q, st, w, fn in self._chunks():
                v, g = fn["grads"](th, P, Q, st, w)
                tot += np.asarray(v)
                J += np.asarray(g)
        self.evaluations += 1
        v, J = tot / self.total, J / self.total
        return {"kl": float(v[0]), "tv": float(v[1])}, {"kl": J[0], "tv": J[1]}


def _take(rows, ids):
    """(p, q, tokens) numpy of images ``ids`` from in-memory ``ARRows`` or a streaming source (``chunk(a, b)``
    over a contiguous range)."""
    if hasattr(rows, "p"):
        return rows.p[ids], rows.q[ids], rows.tokens[ids]
    lo, hi = int(ids.min()), int(ids.max()) + 1
    p, q, x = rows.chunk(lo, hi)
    return p[ids - lo], q[ids - lo], x[ids - lo]


def lossless_theta(family: str, L: int) -> np.ndarray:
    """The family's vanilla member (w = 1, b = 0; level a -> 0): P^ = P, KL = TV = 0 up to float rounding."""
    if family == "level":
        return np.full(L, tune.LOGIT[0])
    return np.zeros(n_params(family, L))

