"""Speculative decoding for real AR image models (torch; imports ``theory``).

The folders are the boundaries (``tests/test_repo.py::test_real_layering`` enforces the import rules):

  protocol.py  the contract every target and draft follows (``ARModel`` / ``FeatureDrafter``: members and
               shapes the decoder calls); imports nothing of ours
  decode/      the model-agnostic decoder: engine (the one loop), steps (AR / chain rounds), tree_steps
               (static trees), sampling (CFG, temperature, top-k/p), methods (method names -> verifiers).
               May import only ``theory``, ``real.protocol`` and ``real.nn`` (the ``inference_weights``
               scope): never a model
  nn/          neural-network pieces: layers, blocks, kvcache, checkpoint; imports ``real.protocol`` only
  models/      our own model implementations: llamagen (+ llamagen_io), eagle, llama (FastLlama), vq,
               chameleon_vqgan; import ``real.nn``, ``real.protocol``, ``theory``
  adapters/    the optional transformers adapters: hf, imagelm (+ image_layout, imagelm_eagle,
               imagelm_loading), chameleon, janus, emu3; may also import ``real.models``
  registry.py  named model pairs for ``coolsd generate --model NAME`` (the composition root: may import all)
  zoo/         the shipped MNIST models (data, VQ, LlamaGen-architecture GPT, classifier, training)
"""
