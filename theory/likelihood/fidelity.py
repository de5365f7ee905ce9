"""Fidelity to the target measured from exact per-image likelihoods (docs/theory.md section 11), with 95% intervals.

Inputs are per-image log-likelihoods (numpy-convertible (n,) float arrays): ``log_p_hat`` = log P^(x) under the
speculative sampler (``theory.likelihood.log_likelihood``) and ``log_p`` = log P(x) under the target
(``theory.likelihood.log_target``), for images x drawn from P^ (an SD run: "sd") or from P (plain AR: "ar").

  KL(P^ || P) = E_{P^}[log P^ - log P]                  ``kl_sd``       (sd images)
  TV(P^, P)   = E_{P^}[(1 - P/P^)_+]                    ``tv_sd``       (sd images)
              = E_{P}[(1 - P^/P)_+]                     ``tv_ar``       (ar images: an independent estimate)
  KL(P || P^) = E_{P}[log P - log P^]                   ``kl_ar``       (ar images)

Each returns a plain dict (JSON-ready): ``measured`` (the sample mean, or None), ``ci`` [lo, hi] (normal 95%,
SE = sample std (ddof 1) / sqrt(n); TV intervals clipped to [0, 1], where TV lies), ``se``, ``n``, and, for
KL, ``per_token`` (the same divided by T when T is given: nats per token; TV has no per-token analogue
and gets none). Zeros are not averaged away: an image with log P = -inf under "sd" (or log P^ = -inf under
"ar") makes that KL infinite, reported as ``measured: None`` with ``n_infinite`` and a ``reason``; an image
the sampling law itself gives probability 0 (log P^ = -inf on an sd image, log P = -inf on an ar image)
means the rows do not belong to the run: ``n_impossible`` and a reason, no number.

The predicted bound: per image, the sum of the discrepancies along the image's own rounds
(``theory.likelihood.path_bound``, the one estimator); by the hybrid argument over tokens, TV(P^, P) <= E[sum of an
image's round terms], so ``bound_check`` says whether the measured TV is within the predicted one and whether that
bound is vacuous (> 1). ``report`` assembles the sweep's ``tv_to_target`` / ``kl_to_target`` /
``tv_bound_image`` entries.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["Z95", "kl_sd", "tv_sd", "tv_ar", "kl_ar", "mean_ci", "bound_summary", "bound_check", "report"]

Z95 = 1.959963984540054   # the standard normal's 97.5% quantile
# round-off allowed when a measured TV is compared with a bound: per-image log-likelihoods carry about
# T x 1e-16 of float error (vanilla measures TV ~ 1e-15, not 0, against a bound of exactly 0)
ROUND_OFF = 1e-9


def _pair(log_p_hat, log_p, who: str):
    a = np.asarray(log_p_hat, dtype=np.float64)
    b = np.asarray(log_p, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"{who}: log_p_hat and log_p must be (n,) arrays of the same shape, got {a.shape} and {b.shape}")
    if a.size < 2:
        raise ValueError(f"{who}: need at least 2 images for an interval, got {a.size}")
    if np.isnan(a).any() or np.isnan(b).any() or (a == np.inf).any() or (b == np.inf).any():
        raise ValueError(f"{who}: log-likelihoods must be finite or -inf (no NaN, no +inf)")
    return a, b


def mean_ci(x, lo: float = -math.inf, hi: float = math.inf) -> dict:
    """{"measured", "ci", "se", "n"} of a finite sample x (n,) (normal 95% interval, clipped to [lo, hi])."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    m = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(n))
    return {"measured": m, "ci": [max(lo, m - Z95 * se), min(hi, m + Z95 * se)], "se": se, "n": int(n)}


def _none(n: int, reason: str, **counts) -> dict:
    return {"measured": None, "ci": None, "se": None, "n": int(n), "reason": reason, **counts}


def _per_token(d: dict, T) -> dict:
    if T is not None and d["measured"] is not None:
        d["per_token"] = {"measured": d["measured"] / T, "ci": [c / T for c in d["ci"]]}
    return d


def _impossible(n: int, k: int, law: str) -> dict:
    return _none(n, f"{k} of {n} images have {law} = 0 under the law they were sampled from: the rows, rule or "
                    f"convention do not match the run", n_impossible=int(k))


def _kl(own, other, T, what: str, own_law: str, other_law: str) -> dict:
    """KL(own || other) = E_own[log own - log other] from images sampled from ``own`` (log-likelihood arrays)."""
    if np.isneginf(own).any():
        return _impossible(own.size, int(np.isneginf(own).sum()), own_law)
    inf = np.isneginf(other)
    if inf.any():
        return _none(own.size, f"{what} is infinite: {other_law} gives probability 0 to {int(inf.sum())} of "
                               f"{own.size} images {own_law} emitted", n_infinite=int(inf.sum()))
    return _per_token({**mean_ci(own - other), "n_infinite": 0}, T)


def kl_sd(log_p_hat, log_p, T: int | None = None) -> dict:
    """KL(P^ || P) from images sampled by SD (module docstring)."""
    a, b = _pair(log_p_hat, log_p, "kl_sd")
    return _kl(a, b, T, "KL(P^||P)", "P^", "P")


def kl_ar(log_p_hat, log_p, T: int | None = None) -> dict:
    """KL(P || P^) from images sampled by plain AR (module docstring)."""
    a, b = _pair(log_p_hat, log_p, "kl_ar")
    return _kl(b, a, T, "KL(P||P^)", "P", "P^")


def _one_minus_ratio(num, den):
    """(1 - exp(num - den))_+ with num = -inf -> 1 (den finite), computed as -expm1 for accuracy."""
    d = np.minimum(num - den, 0.0)
    return -np.expm1(d)


def tv_sd(log_p_hat, log_p) -> dict:
    """TV(P^, P) = E_{P^}[(1 - P/P^)_+] from SD images; images with P = 0 count 1 (``n_target_zero``)."""
    a, b = _pair(log_p_hat, log_p, "tv_sd")
    if np.isneginf(a).any():
        return _impossible(a.size, int(np.isneginf(a).sum()), "P^")
    return {**mean_ci(_one_minus_ratio(b, a), 0.0, 1.0), "n_target_zero": int(np.isneginf(b).sum())}


def tv_ar(log_p_hat, log_p) -> dict:
    """TV(P^, P) = E_{P}[(1 - P^/P)_+] from plain-AR images; images with P^ = 0 count 1 (``n_sampler_zero``)."""
    a, b = _pair(log_p_hat, log_p, "tv_ar")
    if np.isneginf(b).any():
        return _impossible(b.size, int(np.isneginf(b).sum()), "P")
    return {**mean_ci(_one_minus_ratio(a, b), 0.0, 1.0), "n_sampler_zero": int(np.isneginf(a).sum())}


# --------------------------------------------------------------------------- the predicted bound (T11)

def bound_summary(per_image) -> dict:
    """{"measured", "ci", "se", "n", "vacuous"} of per-image bounds (n,): their mean estimates the bound on TV;
    vacuous = the estimate exceeds 1 (TV <= 1 always)."""
    x = np.asarray(per_image, dtype=np.float64)
    if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"bound_summary: per_image must be (n,) finite values, n >= 2; got shape {x.shape}")
    d = mean_ci(x)
    return {**d, "vacuous": bool(d["measured"] > 1.0)}


def bound_check(tv: dict, bound: dict) -> dict:
    """Whether a measured TV (``tv_sd``/``tv_ar`` dict) is within a predicted bound (``bound_summary`` dict):
    ``within`` (point estimates, up to ``ROUND_OFF``), ``refuted`` (the TV interval lies wholly above the bound's: the bound is
    violated at 95%), ``vacuous`` (bound > 1)."""
    if tv.get("measured") is None:
        return {"within": None, "refuted": None, "vacuous": bound["vacuous"], "reason": tv.get("reason")}
    return {"within": bool(tv["measured"] <= bound["measured"] + ROUND_OFF),
            "refuted": bool(tv["ci"][0] > bound["ci"][1] + ROUND_OFF),
            "vacuous": bound["vacuous"]}


def report(sd: tuple, ar: tuple | None = None, T: int | None = None, bound_per_image=None) -> dict:
    """The sweep's entries: ``tv_to_target`` {"measured", "ci", "from_ar", "from_ar_ci", ...},
    ``kl_to_target`` {"measured", "ci", ...} (None and a reason where infinite), ``kl_from_ar`` (KL(P||P^)),
    and with ``bound_per_image``: ``tv_bound_image`` (``bound_summary``) and ``bound_check``.
    ``sd`` = (log_p_hat, log_p) of SD images, ``ar`` = the same of plain-AR images (optional)."""
    tv = tv_sd(*sd)
    out = {"tv_to_target": {"measured": tv["measured"], "ci": tv["ci"], "se": tv["se"], "n": tv["n"],
                            "n_target_zero": tv.get("n_target_zero"), "from_ar": None, "from_ar_ci": None},
           "kl_to_target": kl_sd(*sd, T=T)}
    if tv["measured"] is None:
        out["tv_to_target"]["reason"] = tv["reason"]
    if ar is not None:
        ta = tv_ar(*ar)
        out["tv_to_target"].update(from_ar=ta["measured"], from_ar_ci=ta["ci"], from_ar_se=ta["se"], from_ar_n=ta["n"],
                                   n_sampler_zero=ta.get("n_sampler_zero"))
        if ta["measured"] is None:
            out["tv_to_target"]["from_ar_reason"] = ta["reason"]
        out["kl_from_ar"] = kl_ar(*ar, T=T)
    if bound_per_image is not None:
        out["tv_bound_image"] = bound_summary(bound_per_image)
        out["bound_check"] = bound_check(tv, out["tv_bound_image"])
    return out
