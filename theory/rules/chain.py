"""Chain verification: one round of (relaxed) speculative decoding given the rows along the drafted path.

This is the routine the simulator (``sim``) and the real-model engine (``real``) both call; it is
array-API code, so it runs on numpy, JAX and torch arrays unchanged.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import checks
from ..core.xp import Array, gather, gather_rows, namespace, sample_categorical
from .acceptance import accept_at, reads_f
from .lantern_at import host_views

__all__ = ["ChainVerdict", "verify_chain"]


class ChainVerdict(NamedTuple):
    accepted: Array    # (...,) int64 in [0, L]: tau, the number of accepted drafts
    next_token: Array  # (...,) int64: the resampled token on rejection, else the bonus token
    f_drafted: Array   # (..., L) acceptance probabilities of the drafted tokens


def verify_chain(p: Array, q: Array, tokens: Array, u_accept: Array, u_sample: Array, verifier,
                 n_drafted: Array | None = None, *, check: bool = True, lazy: bool = False) -> ChainVerdict:
    """Verify L drafted tokens against the target (section 1 of docs/theory.md; T0-T1, T5).

    Shapes (any leading batch dims ``...``, no Python loop over them):
      p        (..., L+1, V)  target rows P(.|h_{i-1}) for i = 1..L+1 along the drafted path,
                              after the same logits processing as the draft
      q        (..., L, V)    draft rows Q(.|h_{i-1}) the drafts were actually sampled from
      tokens   (..., L)       drafted tokens x~_1..x~_L
      u_accept (..., L)       uniforms in [0, 1): draft i is accepted iff u_accept[i] < f_i(x~_i)
      u_sample (...,)         uniform in [0, 1) for the final token (inverse-CDF draw)
      n_drafted (...,)        optional int: rows with fewer drafts than L (ragged batches, a round at
                              the end of an image): only drafts 1..n_drafted count, and when all of them
                              are accepted the bonus token comes from p_{n_drafted+1}; entries past
                              n_drafted are ignored (any value). Default: L everywhere.
    ``verifier`` has ``accept(p, q, i)`` and ``resample(p, q, f, rejected)`` (see ``theory.rules``).

    Returns tau (first rejected position - 1, or L), the token drawn from G_{tau+1}(.|x~_{tau+1})
    on rejection or from p_{L+1} when all drafts are accepted, and f at the drafted tokens.

    Cost: f only at the drafted tokens (``theory.rules.acceptance.accept_at``: O(k) per draft for LANTERN, not
    O(V k)), and the resampling law on one row per round (the rejection's; the full acceptance row there only for a
    resampler that reads it, ``reads_f``; none when every round accepted all its drafts and the rows are numpy).

    ``lazy=True`` (the engine's rounds, ``theory.tree.verify_round``): on numpy rows of several rounds f is computed at draft i only for
    the rounds that accepted drafts 1..i-1 (a loop over the L positions, the rounds still accepting at once); the
    verdict is the same (each f entry is its row's own formula, bit for bit), ``f_drafted`` is NaN past each round's
    first rejection. Other arrays (the device path: no read-back) compute every draft's f as with ``lazy=False``. A rule
    with ``decide_at(p, q, i, x, u, want=, chain=)`` (LANTERN's: f bounded without its neighbours, which it reads only
    where the bounds do not decide) gives the decisions itself, on every array namespace, up to each round's first
    rejection; ``f_drafted`` is then NaN where the bounds decided too.

    ``check=True`` (default, an API boundary) validates the inputs: p, q rows finite, >= 0, summing to 1
    (tolerance of their dtype), tokens integers in [0, V), uniforms in [0, 1); one host sync when they
    are valid. Callers that built the rows themselves from validated tables (the simulator, the
    engine's hot path) pass ``check=False``.
    """
    xp = namespace(p, q)
    L = tokens.shape[-1]
    if p.shape[-2] != L + 1 or q.shape[-2] != L or p.shape[-1] != q.shape[-1]:
        raise ValueError(f"verify_chain: expected p (..., L+1, V) and q (..., L, V) with L={L}; "
                         f"got p {tuple(p.shape)}, q {tuple(q.shape)}")
    if check:
        _check_inputs(p, q, tokens, u_accept, u_sample, xp)
    tokens = xp.astype(tokens, xp.int64)
    pos = xp.arange(1, L + 1, device=_device(p))
    if n_drafted is None:
        cap = xp.full(tokens.shape[:-1], L, dtype=xp.int64, device=_device(p))
    else:
        cap = xp.astype(xp.asarray(n_drafted, device=_device(p)), xp.int64)
    decide = getattr(verifier.accept, "decide_at", None) if lazy else None
    host = None         # numpy views of torch CPU rows a rule decided on the host: the verdict is read there too
    if decide is not None:   # the rule decides from bounds where it can (LANTERN's: its neighbours read where needed)
        want = None if n_drafted is None else pos - 1 < cap[..., None]
        ok, f_tok = decide(p[..., :L, :], q, pos, tokens, u_accept, want=want, chain=True)
        host = None if isinstance(ok, np.ndarray) else host_views(ok, cap, pos, p, q, tokens)
        rejected = ~ok if host is None else None
    elif lazy and isinstance(p, np.ndarray) and isinstance(q, np.ndarray) and tokens.size > L:   # (one round: one call)
        f_tok = _f_until_rejection(verifier.accept, p, q, tokens, u_accept, cap)
        rejected = ~(u_accept < f_tok)
    else:
        f_tok = accept_at(verifier.accept, p[..., :L, :], q, pos, tokens)   # (..., L): the drafted tokens only
        rejected = ~(u_accept < f_tok)
    if host is not None:     # the verdict's small arrays and the gathers by numpy's calls on the views
        okh, ch, posh, ph, qh, th = host
        vh = _verdict(~okh, ch, posh, n_drafted is not None, L, np)             # (tau, k, bonus) on the host
        tau, k, bonus = (_torch_of(a) for a in vh)
        p_row, q_row = _torch_of(gather_rows(ph, vh[0])), _torch_of(gather_rows(qh, vh[1]))
        x_rej, bh = _torch_of(gather(th, vh[1])), vh[2]
    else:
        tau, k, bonus = _verdict(rejected, cap, pos, n_drafted is not None, L, xp)
        p_row = gather_rows(p, tau, xp)                        # p_{tau+1}: residual base or bonus row
        bh = bonus if isinstance(bonus, np.ndarray) else None  # (None: a read-back would be a device path sync)
    if bh is not None and bool(bh.all()):     # every round accepted all its drafts: no residual
        return ChainVerdict(tau, sample_categorical(p_row, u_sample, xp), f_tok)
    if host is None:
        q_row, x_rej = gather_rows(q, k, xp), gather(tokens, k, xp)
    # the acceptance row at the rejection, only for a resampler that reads it (G*: O(V) per row for the ratio rules)
    f_row = verifier.accept(gather_rows(p, k, xp), q_row, k + 1) if reads_f(verifier.resample) else None
    G = verifier.resample(p_row, q_row, f_row, x_rej)
    row = G if bh is not None and not bool(bh.any()) else xp.where(bonus[..., None], p_row, G)
    return ChainVerdict(tau, sample_categorical(row, u_sample, xp), f_tok)


def _verdict(rejected, cap, pos, ragged: bool, L: int, xp):
    """(tau, rejection position k, bonus) (...,) from rejected (..., L) bool and cap (...,): tau the first rejection's
    position - 1, or cap; k = min(tau, L - 1) (0-based); bonus where tau == cap (every draft accepted)."""
    if ragged:
        rejected = rejected & (pos - 1 < cap[..., None])
    any_rej = xp.any(rejected, axis=-1)
    first = xp.astype(xp.argmax(xp.astype(rejected, xp.int8), axis=-1), xp.int64)
    tau = xp.where(any_rej, first, cap)
    return tau, xp.minimum(tau, xp.full_like(tau, L - 1)), tau == cap


def _torch_of(a):
    """A torch CPU tensor sharing numpy array a's memory (the host verdict handed back to torch rows)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def _f_until_rejection(accept, p, q, tokens, u_accept, cap):
    """f at the drafted tokens (..., L) on numpy rows p (..., L+1, V), q (..., L, V), computed at draft i only for the
    rounds whose drafts 1..i-1 were all accepted and i <= cap (..., ); NaN elsewhere (never read by the verdict). The
    positions go in as arrays, as ``verify_chain``'s (the same schedule values, the same bits)."""
    L, V = tokens.shape[-1], p.shape[-1]
    pr, qr = np.reshape(p, (-1, L + 1, V)), np.reshape(q, (-1, L, V))
    tr, ur, cr = np.reshape(tokens, (-1, L)), np.reshape(u_accept, (-1, L)), np.reshape(np.asarray(cap), (-1,))
    f = None
    live = np.arange(tr.shape[0])
    for j in range(L):   # a loop over draft positions, the rounds still accepting at once
        live = live[cr[live] > j]
        if live.size == 0:
            break
        fj = accept_at(accept, pr[live, j], qr[live, j], np.full(live.size, j + 1), tr[live, j])
        if f is None:
            f = np.full(tr.shape, np.nan, dtype=fj.dtype)
        f[live, j] = fj
        live = live[ur[live, j] < fj]
    if f is None:
        f = np.full(tr.shape, np.nan, dtype=np.result_type(p.dtype, q.dtype))
    return np.reshape(f, tokens.shape)


def _check_inputs(p, q, tokens, u_accept, u_sample, xp) -> None:
    """verify_chain's boundary checks: one combined test (one sync), detailed messages on failure."""
    V = p.shape[-1]
    if tuple(u_accept.shape) != tuple(tokens.shape):
        raise ValueError(f"verify_chain: u_accept must have the shape of tokens {tuple(tokens.shape)}, got "
                         f"{tuple(u_accept.shape)}")
    if not xp.isdtype(tokens.dtype, "integral"):
        raise ValueError(f"verify_chain: tokens must be integers, got dtype {tokens.dtype}")
    ok = (checks.rows_ok_xp(p, xp) & checks.rows_ok_xp(q, xp) & checks.tokens_ok_xp(tokens, V, xp)
          & checks.uniforms_ok_xp(u_accept, xp) & checks.uniforms_ok_xp(u_sample, xp))
    if bool(ok):
        return
    checks.check_rows_xp("verify_chain: p", p, xp)
    checks.check_rows_xp("verify_chain: q", q, xp)
    checks.check_tokens_xp("verify_chain: tokens", tokens, V, xp)
    checks.check_uniforms_xp("verify_chain: u_accept", u_accept, xp)
    checks.check_uniforms_xp("verify_chain: u_sample", u_sample, xp)


def _device(x):
    import array_api_compat

    return array_api_compat.device(x)
