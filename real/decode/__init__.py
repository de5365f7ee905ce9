"""The model-agnostic decoder: ``engine.generate`` (the one loop over rounds), the step functions
(``steps``: round 0, plain AR, chain rounds; ``tree_steps``: static trees; ``jacobi``: drafter-free
Jacobi rounds), logits processing
(``sampling``) and method names -> verifiers (``methods``).

May import ``theory``, ``real.protocol`` and ``real.nn`` (only for ``layers.inference_weights``, the scope of
packed weights ``generate`` opens per call); never ``real.models``, ``real.adapters``, ``real.registry`` or
``real.zoo``: models reach the decoder only through the ``real.protocol`` contract.
"""
