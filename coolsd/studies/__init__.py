"""Experiments and studies built on the toolkit (they import ``theory``, ``sim`` and ``real``; nothing
there imports them): ``sweep`` (``coolsd sweep``: sharded quality/speed frontiers), ``anneal`` (``coolsd theory
anneal``: Proposition 2 at equal E[tau] on synthetic chains)."""
