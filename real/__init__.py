"""Speculative decoding for real AR image models (torch; imports ``theory``).

  protocol   the model protocol (prefill / forward / rollback / keep) every target and draft follows
  sampling   logits processing shared by draft and target (CFG, temperature, top-k, top-p)
  engine     generate (one loop: batches of images, plain AR / chain / static-tree rounds, per-image
             records); speculative_generate, tree_generate, ar_generate (batch size 1)
  steps      the step function of each mode (ragged batches: per-row lengths, theory.verify_chain /
             theory.tree.verify_tree with per-row draft lengths)
  kvcache    the static per-row KV cache (write, mask, rollback, keep) of the models that own theirs
  methods    method names (theory.methods) -> verifiers with their tables on the model's device
  llamagen   LlamaGen c2i / t2i GPT (configs B, L, XL, XXL, tiny), upstream checkpoint loader
  llamagen_io  published checkpoints (download, sha256 pinning), flan-t5 captions
  vq         LlamaGen's VQ-16 tokenizer (codes <-> pixels), codebook neighbour tables for LANTERN
  eagle      EAGLE-1 drafter in the LANTERN release layout, training on recorded target features
  hf         any transformers causal LM as target or draft
  llama      gpt-fast-style static-cache Llama loaded from a transformers LlamaForCausalLM
  imagelm    multimodal transformers LMs over their image codes (forced layout tokens kept inside);
             image_layout (the token stream's index arithmetic), imagelm_eagle, imagelm_loading
  chameleon  Chameleon / Lumina-mGPT adapter (ChameleonForConditionalGeneration), tiny configs, loader
  chameleon_vqgan  Chameleon's VQGAN decoder (vqgan.yaml + vqgan.ckpt), codes -> pixels
  janus      Janus / Janus-Pro adapter (generation head, generation embeddings), tiny configs, loader
  emu3       Emu3 adapter (visual tokens, end-of-line rows), tiny configs, loader
  registry   named model pairs for `coolsd generate --model NAME`
"""
