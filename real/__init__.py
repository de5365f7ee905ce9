"""Speculative decoding for real AR image models (torch; imports ``theory``).

  protocol   the model protocol (prefill / forward / rollback / keep) every target and draft follows
  sampling   logits processing shared by draft and target (CFG, temperature, top-k, top-p)
  engine     speculative_generate (chain drafts, theory.verify_chain, KV rollback), tree_generate (static
             draft trees, theory.tree.verify_tree, tree-masked target forward, keep) and ar_generate
  methods    method names -> theory.rules verifiers
  llamagen   LlamaGen c2i / t2i GPT (configs B, L, XL, XXL, tiny), upstream checkpoint loader
  vq         LlamaGen's VQ-16 tokenizer (codes <-> pixels), codebook neighbour tables for LANTERN
  eagle      EAGLE-1 drafter in the LANTERN release layout, training on recorded target features
  hf         any transformers causal LM as target or draft
  llama      gpt-fast-style static-cache Llama loaded from a transformers LlamaForCausalLM
  imagelm    multimodal transformers LMs over their image codes (forced layout tokens kept inside)
  chameleon  Chameleon / Lumina-mGPT adapter (ChameleonForConditionalGeneration), tiny configs, loader
  chameleon_vqgan  Chameleon's VQGAN decoder (vqgan.yaml + vqgan.ckpt), codes -> pixels
  janus      Janus / Janus-Pro adapter (generation head, generation embeddings), tiny configs, loader
  emu3       Emu3 adapter (visual tokens, end-of-line rows), tiny configs, loader
  registry   named model pairs for `coolsd generate --model NAME`
"""
