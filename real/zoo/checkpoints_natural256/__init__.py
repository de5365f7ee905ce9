"""Shipped weights of the natural256 zoo (``real.zoo.zoos``) and their manifest."""
