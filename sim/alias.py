"""Walker/Vose alias tables: O(1) categorical draws from the rows of a fixed table.

A row w (V,) becomes (prob (V,), alias (V,)): draw a column j uniformly, keep j with probability
prob[j], else take alias[j]. Each column holds mass 1/V split between j and alias[j], so the draw
has law w exactly (up to float rounding of prob). Tokens with w = 0 get prob = 0 and are never an
alias target, so they are never drawn.

Construction is vectorised over rows; it loops over the V columns (each step finalises one column
of every row), so it costs O(V * rows) once per table, outside the sampling hot path.
"""
from __future__ import annotations

import numpy as np

__all__ = ["alias_table", "alias_draw"]


def alias_table(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Alias tables for every row of ``rows`` (..., V) (non-negative, positive row sums).

    Returns prob (..., V) float64 in [0, 1] and alias (..., V) int64. Vose's two-pointer scheme on
    each row's columns sorted by mass: the lightest unfinished column ("small") is topped up by the
    heaviest untouched one ("large"); a large that drops below 1 is finished next as a small.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim < 1 or rows.shape[-1] < 1:
        raise ValueError(f"alias_table: rows must be (..., V) with V >= 1, got shape {rows.shape}")
    shape = rows.shape
    V = shape[-1]
    w = rows.reshape(-1, V)
    R = w.shape[0]
    tot = w.sum(1, keepdims=True)
    if np.any(~(tot > 0)) or np.any(w < 0):
        raise ValueError("alias_table: rows must be non-negative with positive sums")
    w = w * (V / tot)                                   # scaled masses, mean 1 per row
    order = np.argsort(w, axis=1, kind="stable").ravel()  # ascending per row, flattened
    wf = w.ravel()
    prob = np.ones(R * V)
    alias = np.tile(np.arange(V), R)
    base = np.arange(R) * V                             # flat offset of each row
    s_ptr = np.zeros(R, np.int64)                       # next original small (sorted position)
    l_ptr = np.full(R, V - 1)                           # current large (sorted position)
    carry = np.full(R, -1)                              # a depleted large waiting to be finished
    for _ in range(V):                                  # each step finishes one column of every row
        has_carry = carry >= 0
        nxt = order[base + np.minimum(s_ptr, V - 1)]
        small = nxt + has_carry * (carry - nxt)         # arithmetic select (np.where is slow here)
        s_ptr = s_ptr + ~has_carry
        large = order[base + np.maximum(l_ptr, 0)]
        sf, lf = base + small, base + large
        ws = wf[sf]
        # a valid donor: an untouched column other than `small`, still heavier than 1
        ok = (l_ptr >= s_ptr) & (large != small) & (ws < 1.0)
        # finished with prob 1 when no donor is needed (or float round-off left none)
        prob[sf] = 1.0 - ok * (1.0 - ws)
        alias[sf] = small + ok * (large - small)
        wl = wf[lf] - ok * (1.0 - ws)
        wf[lf] = wl
        depleted = ok & (wl < 1.0)
        carry = depleted * (large + 1) - 1
        l_ptr = l_ptr - depleted
    prob = prob.reshape(R, V)
    alias = alias.reshape(R, V)
    # guard against float round-off: a token with w = 0 is never kept, and never its own alias
    zero = rows.reshape(-1, V) <= 0
    prob = np.where(zero, 0.0, prob)
    alias = np.where(zero & (alias == np.arange(V)), np.argmax(rows.reshape(-1, V), axis=1)[:, None], alias)
    return prob.reshape(shape), alias.reshape(shape)


def alias_draw(prob_flat: np.ndarray, alias_flat: np.ndarray, row: np.ndarray, u: np.ndarray, V: int) -> np.ndarray:
    """Draw one column per entry. prob_flat, alias_flat: flattened (rows * V,) tables; row (...,)
    row indices; u (...,) uniforms in [0, 1). One uniform serves both the column (floor(u V)) and
    the keep test (the fractional part u V - floor(u V), again uniform in [0, 1))."""
    if not (isinstance(u, np.ndarray) and isinstance(row, np.ndarray) and row.dtype.kind in "iu"):
        raise TypeError(f"alias_draw: u must be a float array and row an integer array, got {type(u).__name__} and "
                        f"{getattr(row, 'dtype', type(row).__name__)}")
    uv = u * V
    col = uv.astype(np.int64)
    flat = row * V + col
    a = alias_flat[flat]
    # select by arithmetic: np.where on a random mask is several times slower here
    return a + (uv - col < prob_flat[flat]) * (col - a)
