"""JAX backend of :func:`sim.simulate`: one round as a pure function of 3L+2 random words, vmapped over
rounds and jit-compiled per (V, L, block size).

Precision choice (sampling does not need float64): every draw consumes one uint32 word.
* acceptance: u = (word >> 8) 2^-24 (float32, exact) and accept iff u < F (F rounded to float32, so
  f is resolved to 2^-24; f = 0 never and f = 1 always accepts, as in float64);
* alias draw with V columns: column = floor(word V / 2^32) (exact, computed in uint32 from 16-bit
  halves), keep test from the low 32 bits of word V (uniform on a grid of step V / 2^32 given the
  column) against the float32 alias probability. The law of a draw is off by at most ~V 2^-32 +
  2^-24 per token, far below what any Monte-Carlo run here can resolve (n < 10^12 rounds).
Random words: numpy's PCG64 (``random_raw``, two uint32 words per 64-bit output), handed to the
jitted kernel. Measured here, XLA's own CPU generators (``jax.random.bits`` with threefry or rbg)
took 3-5x longer than the whole round kernel, so generating the words in JAX would make this
backend slower than numpy. Same seed -> same words -> same output, with or without
``jax_enable_x64`` (everything is written with explicit 32-bit dtypes).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

CHUNK = 1 << 16           # rounds per jitted call (blocks are padded: one compilation per (V, L, size))


def _imports():
    import jax
    import jax.numpy as jnp

    return jax, jnp


def _get(table, k):
    """table[k] for indices known to be in bounds (skips XLA's clamping)."""
    return table.at[k].get(mode="promise_in_bounds")


def _alias(word, rowoff, prob, alias, V: int):
    """One alias draw per word: rowoff = row * V (int32), prob float32 / alias int32 flat tables."""
    _, jnp = _imports()
    v = np.uint32(V)
    hi = word >> np.uint32(16)
    lo = word & np.uint32(0xFFFF)
    col = ((hi * v + ((lo * v) >> np.uint32(16))) >> np.uint32(16)).astype(jnp.int32)  # floor(word V / 2^32)
    frac = ((word * v) >> np.uint32(8)).astype(jnp.float32) * np.float32(2.0 ** -24)   # low word of word V
    k = rowoff + col
    return jnp.where(frac < _get(prob, k), col, _get(alias, k))


def _uniform(word):
    _, jnp = _imports()
    return (word >> np.uint32(8)).astype(jnp.float32) * np.float32(2.0 ** -24)


@lru_cache(maxsize=32)
def _block_fn(V: int, L: int, n: int):
    """jit(vmap(one round)) over a block of n rounds; tables are arguments (no recompilation per chain)."""
    jax, jnp = _imports()
    VV = V * V

    def one_round(words, F, qp, qa, tp, ta, mp, ma):
        """words (3L+2,) uint32 -> (tau, x_{1:L+1}, start, drafts); same layout as the numpy kernel."""
        state = _alias(words[3 * L + 1], np.int32(0), mp, ma, V)
        s0 = state
        alive = jnp.bool_(True)
        tau = jnp.int32(0)
        toks, drafts = [], []
        for j in range(1, L + 1):  # unrolled over draft positions (L is static)
            sV = state * np.int32(V)
            x = _alias(words[3 * j - 3], sV, qp, qa, V)                     # x~_j ~ Q(.|state)
            acc = alive & (_uniform(words[3 * j - 2]) < _get(F, (j - 1) * VV + sV + x))
            rej = alive & ~acc
            rowoff = jnp.where(rej, np.int32((j - 1) * VV), np.int32(L * VV)) + sV  # G_j, else P
            y = _alias(words[3 * j - 1], rowoff, tp, ta, V)
            out = jnp.where(acc, x, y)
            drafts.append(jnp.where(alive, x, np.int32(-1)))
            toks.append(out)
            tau = tau + acc.astype(jnp.int32)
            alive = acc
            state = out
        toks.append(_alias(words[3 * L], np.int32(L * VV) + state * np.int32(V), tp, ta, V))
        return tau, jnp.stack(toks), s0, jnp.stack(drafts)

    def block(words, F, qp, qa, tp, ta, mp, ma):
        # words (3L+2, n): round b reads column b, so each position's words are contiguous
        return jax.vmap(one_round, in_axes=(1,) + (None,) * 7)(words, F, qp, qa, tp, ta, mp, ma)

    return jax.jit(block)


def device_tables(tab):
    """The chain's tables as 32-bit JAX arrays (flattened)."""
    _, jnp = _imports()
    f32 = lambda a: jnp.asarray(np.asarray(a, np.float32))  # noqa: E731
    i32 = lambda a: jnp.asarray(np.asarray(a, np.int32))    # noqa: E731
    return (f32(tab.F.ravel()), f32(tab.q_prob), i32(tab.q_alias), f32(tab.t_prob), i32(tab.t_alias),
            f32(tab.m_prob), i32(tab.m_alias))


def simulate(tab, n_rounds: int, seed: int | None, chunk: int = CHUNK):
    """Backend of :func:`sim.rounds.simulate`; ``tab`` is a validated :class:`sim.rounds.ChainTables`.
    Returns the arrays (tau (n,), tokens (n, L+1), start (n,), drafts (n, L)), int64; the caller wraps
    them in its ``SimResult`` (so this module does not import ``sim.rounds``)."""
    V, L = tab.V, tab.L
    if (L + 1) * V * V >= 2**31:
        raise ValueError(f"JAX backend: (L+1) V^2 = {(L + 1) * V * V} table entries overflow int32 indices")
    n = min(chunk, 1 << max(1, (n_rounds - 1).bit_length()))  # powers of two: few compilations
    fn = _block_fn(V, L, n)
    args = device_tables(tab)
    bitgen = np.random.PCG64(seed)
    outs = []
    for _ in range(0, n_rounds, n):
        words = bitgen.random_raw((3 * L + 2) * n // 2).view(np.uint32).reshape(3 * L + 2, n)
        outs.append([np.asarray(r) for r in fn(words, *args)])
    return tuple(np.concatenate(a)[:n_rounds].astype(np.int64) for a in zip(*outs))
