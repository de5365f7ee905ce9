"""The model-agnostic decoder: ``engine.generate`` (the one loop over rounds), ``round`` (one round, whatever the
drafting mode: propose, one target forward, ``theory.tree.verify_round``, commit, advance), the drafting modes
(``modes``: ``chain`` (plain AR and chains), ``tree`` (static trees), ``dynamic_tree``, ``jacobi``; the contract is
``real.protocol.Drafting``), logits processing (``sampling``), per-image random streams (``rng``), batch sizing
(``memory``), argument checks (``checks``), method names -> verifiers (``methods``) and exact scoring of generated
images (``score``).

May import ``theory``, ``real.protocol`` and ``real.nn`` (only for ``layers.inference_weights``, the scope of
packed weights ``generate`` opens per call); never ``real.models``, ``real.adapters``, ``real.registry`` or
``real.zoo``: models reach the decoder only through the ``real.protocol`` contract.
"""
