"""Logits processing shared by draft and target: CFG combination, temperature, top-k, top-p.

The engine applies the SAME ``Processing`` to the draft's and the target's logits; q is exactly the
processed draft distribution the draft token was sampled from and p the processed target distribution
(verifying against an unprocessed q is a known bug class). Temperature 0 means the one-hot
distribution at the argmax (first maximiser), so greedy decoding is sampling at temperature 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from theory.core import checks
from theory.core.xp import sample_categorical

__all__ = ["Processing", "cfg_combine", "process_logits", "sample"]


def cfg_combine(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance on logits (LlamaGen convention): uncond + scale * (cond - uncond).

    logits (2, ..., V): row 0 conditional, row 1 unconditional -> (..., V)."""
    if logits.shape[0] != 2:
        raise ValueError(f"cfg_combine expects a (cond, uncond) pair on dim 0, got batch {logits.shape[0]}")
    cond, uncond = logits[0], logits[1]
    return (cond - uncond).mul_(scale).add_(uncond)     # = uncond + scale * (cond - uncond), bit for bit, 2 passes


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Probabilities (..., V) in ``dtype`` from logits (..., V).

    logits / temperature; top-k keeps tokens whose logit is >= the k-th largest (ties kept);
    top-p keeps, in decreasing probability, every token whose preceding mass is <= top_p (so the token
    crossing top_p is kept); renormalised. temperature == 0: one-hot at the argmax."""
    x = logits.to(dtype)
    V = x.shape[-1]
    if temperature == 0:    # one-hot at the first maximiser (a scatter: one_hot's int64 rows cost 4x more)
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    if temperature != 1.0:
        x = x / temperature
    if 0 < top_k < V:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sp, idx = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sp, dim=-1) - sp
        sp = sp.masked_fill(before > top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


MIN_TEMPERATURE = 1e-6   # logits up to 3e32 stay finite after / temperature in float32


@dataclass(frozen=True)
class Processing:
    """How logits become the distributions that are sampled and verified.

    ``cfg_scale`` != 1 turns classifier-free guidance on: models are run on the (cond, uncond) pair and
    the logits combined by ``cfg_combine`` before temperature / top-k / top-p."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        t = checks.real("temperature", self.temperature, 0)
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g} (below, logits / temperature "
                             f"overflow float32), got {self.temperature}")
        checks.integer("top_k", self.top_k, lo=0)
        checks.real("top_p", self.top_p, 0, 1, lo_open=True)
        checks.real("cfg_scale", self.cfg_scale)
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"probabilities are computed in float32 or float64, got {self.dtype}")

    @property
    def greedy(self) -> bool:
        """Whether rows are one-hot at the argmax (temperature 0): the one place "greedy" is decided in the decoder
        (greedy trees draft top-m candidates with the point law; couplings of sampled drafts do not apply)."""
        return self.temperature == 0

    @property
    def cfg(self) -> bool:
        """Whether classifier-free guidance is on (cfg_scale != 1)."""
        return self.cfg_scale != 1.0

    @property
    def batch(self) -> int:
        """Model rows per image: 2 with CFG (conditional, unconditional), else 1."""
        return 2 if self.cfg else 1

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, ..., V) from a model batch (B = 2 with CFG) -> probabilities (..., V)."""
        return process_logits(self.combined(logits), self.temperature, self.top_k, self.top_p, self.dtype)

    def combined(self, logits: torch.Tensor) -> torch.Tensor:
        """The guided logits before temperature / top-k / top-p: (B, ..., V) -> (..., V) in ``dtype``
        (B = 2 with CFG: cfg_combine; else the one row). Greedy tree drafting ranks children by them."""
        if logits.shape[0] != self.batch:
            raise ValueError(f"Processing(cfg_scale={self.cfg_scale}) expects batch {self.batch}, got {logits.shape[0]}")
        x = logits.to(self.dtype)
        return cfg_combine(x, self.cfg_scale) if self.cfg else x[0]

    def rows(self, logits: torch.Tensor, combined: bool = False) -> torch.Tensor:
        """A model batch of R = batch * B rows ([cond rows; uncond rows] with CFG), logits (R, ..., V) ->
        (B, ..., V) probabilities (or guided logits with ``combined``)."""
        if logits.shape[0] % self.batch:
            raise ValueError(f"{logits.shape[0]} model rows are not a multiple of {self.batch} rows per image")
        x = logits.reshape(self.batch, logits.shape[0] // self.batch, *logits.shape[1:])
        return self.combined(x) if combined else self(x)

    def params(self) -> dict:
        """The four settings as a plain dict (for records)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "cfg_scale": self.cfg_scale}


def draw(probs: torch.Tensor, proc: "Processing", uniforms) -> torch.Tensor:
    """One token per row of rows ``probs`` (..., V) processed by ``proc``: at temperature 0 the rows are
    one-hot at the argmax, so the token is ``probs.argmax(-1)`` (what the inverse-CDF draw returns for
    any u) and no uniforms are drawn; else ``sample(probs, uniforms())``, ``uniforms`` a zero-argument
    callable giving (...,) uniforms (the images' streams). (...,) int64."""
    if proc.greedy:
        return probs.argmax(-1)
    return sample(probs, uniforms())


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row: probs (..., V) and uniforms u (...,) in [0, 1) -> (...,) int64, an inverse-CDF draw
    (``theory.core.xp.sample_categorical``; about 20x faster than torch.multinomial on (64, 512) rows on CPU). The
    engine's uniforms come from the images' own streams (``real.decode.rng.Streams``)."""
    return sample_categorical(probs, u.to(device=probs.device, dtype=probs.dtype))


def per_model_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """Per-image (B, ...) -> per-model-row (k B, ...) ([cond; uncond] with CFG, k = ``Processing.batch``), as the
    round's ``Run.rows`` lays them out (the scorers feed models this way)."""
    return x if k == 1 else x.repeat(k, *([1] * (x.ndim - 1)))
