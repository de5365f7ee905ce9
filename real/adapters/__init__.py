"""The optional transformers adapters: ``hf`` (any causal LM), ``imagelm`` (multimodal LMs over their image
codes) with ``image_layout`` (the token stream's index arithmetic), ``imagelm_eagle`` and ``imagelm_loading``,
and the families ``chameleon`` (Chameleon / Lumina-mGPT), ``janus`` (Janus / Janus-Pro) and ``emu3``.

May import ``theory``, ``real.protocol``, ``real.nn`` and ``real.models``; never the decoder or the registry.
"""
