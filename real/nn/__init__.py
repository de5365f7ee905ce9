"""Neural-network pieces shared by our models and the adapters: ``layers`` (dense layers with the CPU fast
paths, RMSNorm, RoPE, attention), ``blocks`` (the decoder block as pure functions, ``compile_blocks``),
``kvcache`` (the static per-row KV cache and the cache mixin), ``checkpoint`` (reading, key/shape checking
and sha256 pinning of weight files).

May import ``real.protocol`` only (no model, no decoder).
"""
