"""How candidates are chosen, shared by the engine's drafting modes and the scorers' regrowth (so both stand on it,
not on each other): ``top_m`` (the m largest entries, ties to the lower index, on host and device) and ``expand``
(a dynamic tree node's children: release or lossless keys). Imports no other room of ``real.decode``."""
from __future__ import annotations

import torch

from real.nn.devpath import host_path
from theory.core.xp import top_m as xp_top_m
from theory.tree import child_keys

__all__ = ["top_m", "expand"]


def top_m(x: torch.Tensor, m: int) -> torch.Tensor:
    """Indices (..., m) of the m largest entries of x (..., V) in decreasing order, ties to the lower index:
    ``argsort(x, descending, stable)[..., :m]``. The host path: ``theory.core.xp.top_m`` (``topk``, the stable sort
    only for a tie straddling the m-th place); the device path: one stable sort, no read-back of the tie checks."""
    if m >= x.shape[-1] or not host_path(x.device):
        return torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m]
    return xp_top_m(x, m)


def expand(spec, q: torch.Tensor, key: torch.Tensor, logp: torch.Tensor, gumbel: torch.Tensor | None,
           drawn: tuple | None = None):
    """The ``spec.topk`` children (``spec``: a ``real.decode.dynamic_tree.DynamicTree``) of nodes with processed
    draft rows q (B, ..., V), keys and path log-probabilities (B, ...) float64 -> tokens, keys, log-probabilities
    (B, ..., k). Release keys: the top-k by cumulative draft
    log-probability (keys = log-probabilities: given one tensor for both, one tensor is returned); lossless keys:
    stochastic beam search with the Gumbel(0, 1) noise ``gumbel`` (B, ..., V) (``theory.tree.child_keys``).
    ``drawn`` (lossless keys): (where, tokens, keys, log-probabilities), children drawn otherwise for some nodes
    (``real.decode.regrow``'s importance sampling), broadcastable to (B, ..., k) and taken where ``where``. The
    engine's growth and ``real.decode.score_tree``'s regrowth both expand nodes here, a level at a time."""
    if spec.sampling == "release":           # deterministic top-k by cumulative draft log-probability
        tok = top_m(q, spec.topk)
        val = q.gather(-1, tok).double().log()
        kv = key[..., None] + val
        return tok, kv, kv if logp is key else logp[..., None] + val
    out = child_keys(key, logp, q.double(), gumbel, spec.topk)
    if drawn is None:
        return out
    where, *given = drawn
    return tuple(torch.where(where, a, b) for a, b in zip(given, out))
