"""Attention masks of a block of new tokens (moved from ``real.protocol``, issue 42): ``check_attn_mask`` checks a
block's mask (on the device path without a read-back, ``real.nn.devpath``) and ``block_mask`` builds the visibility
of S new tokens over a cache."""
from __future__ import annotations

import weakref

import torch

from .devpath import host_path

__all__ = ["check_attn_mask", "block_mask", "SELF_MSG"]

SELF_MSG = "attn_mask must let every new token attend to itself (diagonal all True)"

# masks whose diagonal was checked, by identity, with torch's version counter at the check: a tree plan's level masks
# are the same tensors every round, so the device path asserts each once, not once per round (an in-place change
# bumps the version: checked again)
_CHECKED: dict = {}      # id(mask) -> (weak reference, version): an entry leaves with its tensor


def _version(t: torch.Tensor):
    """torch's version counter of ``t`` (None for inference tensors, which keep none: identity alone then)."""
    return None if t.is_inference() else t._version


def _checked(blk: torch.Tensor) -> bool:
    r = _CHECKED.get(id(blk))
    return r is not None and r[0]() is blk and r[1] == _version(blk)


def _mark_checked(blk: torch.Tensor) -> None:
    key = id(blk)
    _CHECKED[key] = (weakref.ref(blk, lambda _, k=key: _CHECKED.pop(k, None)), _version(blk))


def check_attn_mask(attn_mask: torch.Tensor, S: int, cache_len: int, device, rows: int | None = None) -> torch.Tensor:
    """A block's ``attn_mask`` (S, K) -- or (rows, S, K), one per row, when ``rows`` is given (models with
    ``row_masks``: dynamic trees differ per image) -- as bool on ``device``, checked: S <= K <= cache_len + S (the
    last K - S cached entries and the block) and every new token attends to itself (on the device path an
    asynchronous device assertion: a RuntimeError when the device next syncs, no read-back)."""
    per_row = rows is not None and attn_mask.ndim == 3
    lead = (rows,) if per_row else ()
    if attn_mask.ndim != 2 + per_row or tuple(attn_mask.shape[:-1]) != (*lead, S) \
            or not S <= attn_mask.shape[-1] <= cache_len + S:
        shape = "(rows, S, K) or (S, K)" if rows is not None else "(S, K)"
        raise ValueError(f"attn_mask must be {shape} with rows = {rows}, S = {S} new tokens and {S} <= K <= "
                         f"cache_len + S = {cache_len + S} (K = S: over the new block), got {tuple(attn_mask.shape)}")
    blk = attn_mask.to(device=device, dtype=torch.bool)
    diag = blk[..., -S:].diagonal(dim1=-2, dim2=-1)
    if host_path(diag.device):                   # the host: numpy's all, no torch reduction
        if not diag.numpy().all():
            raise ValueError(SELF_MSG)
    elif not _checked(blk):                      # the device path: checked on the device, nothing read back
        torch._assert_async(diag.all(), SELF_MSG)
        _mark_checked(blk)
    return blk


def block_mask(S: int, cache_len: int, attn_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """(S, cache_len + S) bool visibility of S new tokens over the cache and the block, or None when it is
    plain causal with S = 1 (everything visible). ``attn_mask`` (S, S) bool overrides the causal block;
    (S, K) with S < K <= cache_len + S overrides the last K - S cache columns too (a tree level)."""
    if attn_mask is None:
        if S == 1:
            return None
        blk = torch.ones(S, S, dtype=torch.bool, device=device).tril_()
    else:
        blk = check_attn_mask(attn_mask, S, cache_len, device)
    past = torch.ones(S, cache_len + S - blk.shape[1], dtype=torch.bool, device=device)
    return torch.cat([past, blk], dim=1)
