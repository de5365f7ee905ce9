"""Experiments and studies built on the toolkit (they import ``theory``, ``sim`` and ``real``; nothing
there imports them): ``sweep`` (``coolsd sweep``: sharded quality/speed frontiers)."""
