"""Our own model implementations: ``llamagen`` (LlamaGen c2i / t2i GPT) and ``llamagen_io`` (published
checkpoints, captions), ``eagle`` (EAGLE-1 drafter), ``llama`` (FastLlama, a static-cache Llama), ``vq``
(LlamaGen's VQ-16 tokenizer, codebook neighbour tables) and ``chameleon_vqgan`` (Chameleon's VQGAN decoder).

May import ``theory``, ``real.protocol`` and ``real.nn``; never the decoder (``real.decode``), the adapters or
the registry.
"""
