"""Experiments and studies built on the toolkit (they import ``theory``, ``sim`` and ``real``; nothing
there imports them): ``demo`` (``coolsd demo``: the main job, predicted vs measured trade-offs on the
shipped MNIST models), ``sweep`` (``coolsd sweep``: sharded quality/speed frontiers), ``anneal`` (``coolsd theory
anneal``: Proposition 2 at equal E[tau] on synthetic chains)."""
