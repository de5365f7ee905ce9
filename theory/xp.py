"""Public array-API helpers (numpy, JAX, torch): the names other packages may use from ``theory._xp``.

``namespace`` (the arrays' namespace), ``gather`` (x[..., idx] along the last axis), ``gather_rows``,
``normalize``, ``positive_part``, ``sample_categorical`` (inverse-CDF draws from rows). Shapes are in
each function's docstring in ``theory._xp``.
"""
from ._xp import Array, gather, gather_rows, namespace, normalize, positive_part, sample_categorical

__all__ = ["Array", "gather", "gather_rows", "namespace", "normalize", "positive_part", "sample_categorical"]
