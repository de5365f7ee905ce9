"""The size checks of the exact-TV objective (T7) shared by the optimisers (``theory.markov.optimize``,
``theory.markov.gstar``): how many sequences and how much memory an exact TV needs, refused above the limits.
"""
from __future__ import annotations

import numpy as np

from ..core import checks
from . import tables as markov

EXACT_TV_LIMIT = 10**6           # start states x V^(L+1) sequences above which exact TV is not computed


# --------------------------------------------------------------------------- exact-TV objective: checks

def check_objective(objective: str) -> str:
    if objective not in ("bound", "exact_tv"):
        raise ValueError(f"objective must be 'bound' or 'exact_tv', got {objective!r}")
    return objective


def exact_size(mu: np.ndarray, V: int, L: int) -> int:
    return int(np.count_nonzero(mu > 0)) * V ** (L + 1)


def exact_ok(mu, V: int, L: int, max_sequences) -> bool:
    """Whether the exact TV is computed (else reported as None): within max_sequences (None: no
    limit) and within the memory budget (markov.exact_tv_bytes)."""
    S = int(np.count_nonzero(mu > 0))
    return ((max_sequences is None or exact_size(mu, V, L) <= max_sequences)
            and markov.exact_tv_bytes(S, V, L) <= checks.MAX_BYTES)


def check_exact_size(mu, V, L, max_sequences, jacobian: bool = False, max_bytes=checks.MAX_BYTES):
    """Refuse objective='exact_tv' above max_sequences or when its memory would exceed max_bytes.
    Measured peaks (RSS, JAX float64 on CPU; V=10..20, L=4..5): the gradient path (optimal_schedule)
    takes about 48 bytes per DP row (S V^L rows) plus ~48 MiB of JAX buffers; the Jacobian path
    (confirm_optimal_resampling) about 28 bytes per Jacobian entry (S V^L x L V^2: JAX's dense
    Jacobian, its scaled copy and the CSR matrix) plus ~150 MiB. The estimates below are within 20% of
    those measurements."""
    S = int(np.count_nonzero(mu > 0))
    n = exact_size(mu, V, L)
    if max_sequences is not None and n > checks.integer("max_sequences", max_sequences, lo=1):
        raise ValueError(f"max_sequences: objective='exact_tv' needs {S} start state(s) x V^(L+1) = {S} x "
                         f"{V}^{L + 1} = {n:.3g} sequences, above max_sequences={max_sequences:.3g}; use "
                         "objective='bound' or a smaller chain")
    rows = S * V ** L
    need = 28 * rows * L * V * V + 150 * 2**20 if jacobian else 48 * rows + 48 * 2**20
    checks.check_memory(f"objective='exact_tv' ({'Jacobian' if jacobian else 'gradient'} over {n:.3g} sequences)",
                        need, max_bytes, "use objective='bound', a smaller chain or a larger max_bytes")
