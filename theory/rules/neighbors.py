"""LANTERN's codebook neighbour table (docs/theory.md section 6): building it from codebook vectors
(``lantern_neighbors``, the release's ranking), validating one at an API boundary (``check_neighbors``), and sums of
rows over every code's neighbours (``neighbor_sum``, section 6's masses p(N(y))).
numpy in, numpy out for the builder; the check takes numpy, torch or JAX tables."""
from __future__ import annotations

import array_api_compat

from ..core.xp import Array, mark, namespace

__all__ = ["check_neighbors", "lantern_neighbors", "neighbor_sum", "neighbor_scatter", "neighbor_matrix", "MATRIX_V"]


def check_neighbors(neighbors, name: str = "neighbors", width: int | None = None) -> None:
    """Validate a neighbour table at an API boundary (ValueError naming ``name``): a 2-D integer array
    (numpy, torch, JAX; not a Python list) with at least ``width`` columns, entries in [0, V) for V rows,
    and no row listing its own code or one code twice in the first ``width`` columns."""
    if isinstance(neighbors, (list, tuple)) or not hasattr(neighbors, "shape"):
        raise ValueError(f"{name} must be a (V, K) integer array (numpy or torch), got {type(neighbors).__name__}")
    try:
        xp = namespace(neighbors)
    except TypeError:
        raise ValueError(f"{name} must be a (V, K) integer array (numpy or torch), got {type(neighbors).__name__}") from None
    if len(neighbors.shape) != 2:
        raise ValueError(f"{name} must be a 2-D (V, K) table, got shape {tuple(neighbors.shape)}")
    V, K = int(neighbors.shape[0]), int(neighbors.shape[1])
    if not xp.isdtype(neighbors.dtype, "integral"):
        raise ValueError(f"{name} must hold integer code ids, got dtype {neighbors.dtype}")
    if width is not None and width > K:
        raise ValueError(f"{name}: {width} neighbours per code are needed, the table has {K} columns")
    if V == 0 or K == 0:
        raise ValueError(f"{name} is empty (shape {tuple(neighbors.shape)})")
    nb = xp.astype(neighbors[:, : (K if width is None else width)], xp.int64)
    lo, hi = int(xp.min(nb)), int(xp.max(nb))
    if lo < 0 or hi >= V:
        raise ValueError(f"{name} entries must be code ids in [0, {V}) (V = its number of rows); found values in "
                         f"[{lo}, {hi}] (-1 padding is not allowed)")
    rows = xp.arange(V, device=array_api_compat.device(nb))
    if bool(xp.any(nb == rows[:, None])):
        bad = int(xp.argmax(xp.astype(xp.any(nb == rows[:, None], axis=1), xp.int8)))
        raise ValueError(f"{name}: row {bad} lists its own code; rows list the OTHER codes (as LANTERN's table)")
    srt = xp.sort(nb, axis=1)
    dup = xp.any(srt[:, 1:] == srt[:, :-1], axis=1)
    if bool(xp.any(dup)):
        raise ValueError(f"{name}: row {int(xp.argmax(xp.astype(dup, xp.int8)))} lists a code twice")


def lantern_neighbors(embeddings, K: int | None = None, *, normalize: bool = False):
    """Neighbour table (V, K) int64 from codebook vectors (V, d): the other codes by increasing Euclidean
    distance, the code itself excluded, ties by lower index (section 6). numpy in, numpy out.

    ``normalize=False`` (default, as released: LANTERN ranks the raw VQ embedding weights) or True (rows
    l2-normalised first: our earlier table; equal to the default on a codebook of unit vectors)."""
    import numpy as np

    if isinstance(embeddings, (list, tuple)) and not embeddings:
        raise ValueError("embeddings is empty")
    E = np.asarray(embeddings, dtype=np.float64)
    if E.ndim != 2:
        raise ValueError(f"embeddings must be (V, d), got shape {E.shape}")
    if not np.all(np.isfinite(E)):
        raise ValueError("embeddings contain NaN or infinite entries")
    if normalize:
        n = np.linalg.norm(E, axis=1, keepdims=True)
        if np.any(n == 0):
            raise ValueError("embeddings: a zero vector cannot be l2-normalised (normalize=True)")
        E = E / n
    V = E.shape[0]
    K = V - 1 if K is None else K
    if not 1 <= K <= V - 1:
        raise ValueError(f"K must be in [1, {V - 1}], got {K}")
    sq = (E * E).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2 * E @ E.T
    np.fill_diagonal(d2, np.inf)
    order = np.argsort(d2, axis=1, kind="stable")[:, :K]
    return order.astype(np.int64)


MATRIX_V = 4096    # numpy: up to this many codes "x in N(y)" is read from the (V, V) 0/1 matrix


def neighbor_matrix(nb: Array, V: int) -> Array | None:
    """The neighbourhood as a (V, V) bool matrix, N[y, z] = z is listed in nb[y] (``mark``), for numpy tables of at
    most ``MATRIX_V`` codes (None otherwise): whether x is in N(y) for every y as one gather of column x, in place of
    the (V, K) comparison with x."""
    if not (array_api_compat.is_numpy_array(nb) and V <= MATRIX_V):
        return None
    return mark(nb, V)


def neighbor_sum(a: Array, nb: Array, mask: Array) -> Array:
    """sum of a over each code's neighbours (every column of ``nb``) at the entries where ``mask``, 0 elsewhere.

    a (..., V) float or int; nb (V, K) int64 on a's device; mask (..., V) bool, broadcastable to a. Section 6's
    masses p(N(y)) and min(p, q)(N(y)). Computed on the transposed rows (V, rows): a loop over the K
    neighbour ranks, each a gather of whole contiguous rows (a[..., nb[:, j]] for every row at once); the
    sum runs in column order (sequential, not numpy's pairwise order: equal to the dense (..., V, K) sum to
    rounding)."""
    xp = namespace(a)
    V = a.shape[-1]
    rows = xp.reshape(a, (-1, V))
    # (V, rows) C-ordered: flattening the transposed view copies it in that order (take then reads whole rows)
    at = xp.reshape(xp.reshape(rows.T, (-1,)), (V, rows.shape[0]))
    if array_api_compat.is_numpy_array(at) and array_api_compat.is_numpy_array(nb) and nb.shape[1] > 1:
        s = _csr_sum(at, nb)
        return xp.where(mask, xp.reshape(s.T, a.shape), xp.zeros_like(a))
    s = xp.take(at, nb[:, 0], axis=0)
    for j in range(1, nb.shape[1]):   # a loop over neighbour ranks, each vectorised over codes and rows
        s = s + xp.take(at, nb[:, j], axis=0)
    return xp.where(mask, xp.reshape(s.T, a.shape), xp.zeros_like(a))


def neighbor_scatter(u: Array, nb: Array) -> Array:
    """The transpose of ``neighbor_sum``: t[..., z] = sum of u[..., y] over the codes y whose neighbours (every column
    of ``nb``) list z, i.e. u @ N with N[y, z] = [z in nb[y]] (0/1), in O(V K) per row instead of the (V, V) product.

    u (..., V) float; nb (V, K) int64 on u's device. numpy: one sparse product (``_table_csr``, transposed); torch and others: one scatter-add of the (rows, V K) gathered weights (``index_add``)."""
    xp = namespace(u)
    V = u.shape[-1]
    rows = xp.reshape(u, (-1, V))
    K = nb.shape[1]
    if array_api_compat.is_numpy_array(u) and array_api_compat.is_numpy_array(nb):
        import numpy as np
        import scipy.sparse as sp

        return np.reshape(np.asarray(_table_csr(nb, u.dtype, V).T @ rows.T).T, u.shape)
    if array_api_compat.is_torch_array(u):
        src = xp.take(rows, xp.reshape(xp.broadcast_to(xp.arange(V, device=u.device)[:, None], (V, K)), (-1,)), axis=1)
        out = xp.zeros_like(rows).index_add_(1, xp.reshape(nb, (-1,)), src)
        return xp.reshape(out, u.shape)
    N = xp.astype(mark(nb, V, xp), u.dtype)                                       # (V, V): other namespaces
    return xp.reshape(rows @ N, u.shape)


def _csr_sum(at, nb):
    """numpy: s[y] = sum_j at[nb[y, j]] (V, rows) as one sparse product (scipy CSR, weights 1, row y's entries in the
    table's column order, unsorted: a product with a dense array reads them in that order): exact products, each
    row's sum accumulated from 0 in the gather loop's sequential column order, in at's dtype, so the same bits
    (tests/test_likelihood_grid.py), without a (V, rows) temporary per neighbour rank."""
    import numpy as np

    return np.asarray(_table_csr(nb, at.dtype, at.shape[0]) @ at)


def _table_csr(nb, dtype, cols: int):
    """The table nb (V, K) as a scipy CSR matrix (V, cols) of ones in ``dtype``: row y holds its K neighbours, in the
    table's column order (unsorted), the one sparse form of ``neighbor_sum`` and ``neighbor_scatter``."""
    import numpy as np
    import scipy.sparse as sp

    V, K = nb.shape
    return sp.csr_matrix((np.ones(V * K, dtype), np.ascontiguousarray(nb).reshape(-1), np.arange(0, V * K + 1, K)),
                         shape=(V, cols))
