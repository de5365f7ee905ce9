"""LlamaGen, the VQ tokenizer and the EAGLE drafter: cache consistency, tree masks, checkpoint layouts."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from real.models import llamagen as lg, llamagen_io
from real.nn import layers
from real.models.eagle import EagleDrafter, EagleConfig, load_lantern_drafter, save_lantern_drafter, record_features, train_eagle
from real.registry import tiny_llamagen_pair
from real.models.vq import VQModel, codebook_neighbors, load_vq, vq_config
from theory.rules import lantern_neighbors

torch.set_num_threads(1)  # tiny models: threads only contend (see test_real_engine)


@pytest.fixture(scope="module")
def target():
    return tiny_llamagen_pair(seed=0)[0]


def _stepwise(model, cond, tokens, cfg):
    B = 2 if cfg else 1
    t = tokens.view(1, -1).expand(B, -1)
    outs = [model.prefill(cond, cfg=cfg).logits]
    for j in range(t.shape[1]):
        outs.append(model.forward(t[:, j:j + 1]).logits)
    return torch.cat(outs, 1)


@pytest.mark.parametrize("cfg", [False, True])
def test_block_forward_equals_step_by_step(target, cfg):
    toks = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    B = 2 if cfg else 1
    step = _stepwise(target, 4, toks, cfg)                                  # (B, 13, V)
    block = target.prefill(4, toks.view(1, -1).expand(B, -1), cfg=cfg).logits
    diff = (block - step).abs().max().item()
    # verification-style: prefill 5 tokens then one block of 7 on the cache
    target.prefill(4, toks[:5].view(1, -1).expand(B, -1), cfg=cfg)
    ver = target.forward(toks[5:].view(1, -1).expand(B, -1)).logits
    diff2 = (ver - step[:, 6:]).abs().max().item()
    # rollback 4 entries and re-feed: same logits again
    target.rollback(4)
    again = target.forward(toks[8:].view(1, -1).expand(B, -1)).logits
    diff3 = (again - step[:, 9:]).abs().max().item()
    print(f"max |block - step| = {diff:.2e}, verify block {diff2:.2e}, after rollback {diff3:.2e} "
          f"(logit scale {step.abs().max():.2f})")
    assert max(diff, diff2, diff3) < 1e-4


def test_tree_mask_positions_and_keep(target):
    """A block [a, b, c] with b, c siblings after a (tree mask, equal positions) scores c as the chain
    [a, c] does; keep([0, 2]) compacts the cache to that chain."""
    g = torch.Generator().manual_seed(1)
    pre, a, b, c, e = torch.randint(0, target.vocab_size, (5, 1), generator=g)
    chain = target.prefill(2, torch.stack([pre, a, c, e]).view(1, -1)).logits    # rows: ., pre, a, c, e
    target.prefill(2, pre.view(1, 1))
    L0 = target.cache_len
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    out = target.forward(torch.cat([a, b, c]).view(1, 3), position_ids=torch.tensor([L0, L0 + 1, L0 + 1]),
                         attn_mask=mask).logits
    assert (out[0, 0] - chain[0, 2]).abs().max() < 1e-4          # after a
    assert (out[0, 2] - chain[0, 3]).abs().max() < 1e-4          # after [a, c]
    assert (out[0, 1] - out[0, 2]).abs().max() > 1e-3            # b's row is really different
    target.keep(torch.tensor([0, 2]))
    assert target.cache_len == L0 + 2
    nxt = target.forward(e.view(1, 1)).logits
    assert (nxt[0, 0] - chain[0, 4]).abs().max() < 1e-4
    with pytest.raises(ValueError, match="attn_mask"):
        target.forward(a.view(1, 1), attn_mask=torch.ones(2, 2, dtype=torch.bool))


def test_configs_match_published_sizes():
    for name, (n_layer, dim, hidden) in {"B": (12, 768, 2048), "L": (24, 1024, 2816), "XL": (36, 1280, 3584),
                                         "XXL": (48, 1536, 4096)}.items():
        c = lg.config(name, image_size=384)
        assert (c.n_layer, c.dim, c.head_dim, c.vocab_size, c.block_size) == (n_layer, dim, 64, 16384, 576)
        # SwiGLU hidden: the multiple of 256 at or above int(2 * 4 * dim / 3), computed here by hand
        assert c.ffn_hidden == hidden and c.ffn_hidden % 256 == 0 and 0 <= c.ffn_hidden - int(8 * dim / 3) < 256
    t2i = lg.config("XL", image_size=512, model_type="t2i")
    assert (t2i.cls_token_num, t2i.caption_dim, t2i.block_size) == (120, 2048, 1024)
    m = lg.LlamaGen(lg.config("B"))
    n = sum(p.numel() for p in m.parameters())
    assert abs(n - 111e6) / 111e6 < 0.05                        # "111M" in the LlamaGen release


def test_rope_zero_on_prefix_and_2d_on_grid():
    tab = layers.rope_table_2d(4, 16, 10000.0, prefix=3)
    assert tab.shape == (3 + 16, 8, 2) and tab[:3].abs().max() == 0
    # token j = (row a, col b): first 4 pairs rotate by a * w, the last 4 by b * w, w_m = 10000^(-m/4)
    w = torch.tensor([10000.0 ** (-2 * m / 8) for m in range(4)])
    for j in range(16):
        a, b = divmod(j, 4)
        ang = torch.cat([a * w, b * w])
        assert torch.allclose(tab[3 + j, :, 0], ang.cos(), atol=1e-6) and torch.allclose(tab[3 + j, :, 1], ang.sin(), atol=1e-6)


# --------------------------------------------------------------------------- checkpoints

def _layout_keys(n_layer: int, c2i: bool = True) -> set[str]:
    """LlamaGen's published state-dict keys, written out from the release's key names."""
    keys = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    keys |= {"cls_embedding.embedding_table.weight"} if c2i else \
        {"cls_embedding.cap_proj.fc1.weight", "cls_embedding.cap_proj.fc2.weight", "cls_embedding.uncond_embedding"}
    for i in range(n_layer):
        keys |= {f"layers.{i}.attention.wqkv.weight", f"layers.{i}.attention.wo.weight",
                 f"layers.{i}.feed_forward.w1.weight", f"layers.{i}.feed_forward.w2.weight",
                 f"layers.{i}.feed_forward.w3.weight", f"layers.{i}.attention_norm.weight", f"layers.{i}.ffn_norm.weight"}
    return keys


@pytest.mark.parametrize("wrap", ["model", "module", "state_dict", None])
def test_llamagen_checkpoint_round_trip(tmp_path, target, wrap):
    sd = target.state_dict()
    assert set(sd) == _layout_keys(target.config.n_layer)
    path = tmp_path / "ckpt.pt"
    torch.save({wrap: sd, "steps": 3} if wrap else sd, path)
    m = lg.load_llamagen(path, target.config)
    toks = torch.randint(0, target.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(m.prefill(5, toks, cfg=True).logits, target.prefill(5, toks, cfg=True).logits)


def test_llamagen_t2i_layout_and_safetensors(tmp_path):
    from safetensors.torch import save_file

    t, _ = tiny_llamagen_pair(seed=2, model_type="t2i")
    assert set(t.state_dict()) == _layout_keys(t.config.n_layer, c2i=False)
    save_file({k: v.contiguous() for k, v in t.state_dict().items()}, str(tmp_path / "w.safetensors"))
    m = lg.load_llamagen(str(tmp_path / "w.safetensors"), t.config)
    P, C = t.config.cls_token_num, t.config.caption_dim
    cap = llamagen_io.left_pad_caption(torch.randn(P, C), torch.arange(P) < 5)
    assert cap.mask.tolist() == [False] * (P - 5) + [True] * 5 and cap.embedding[: P - 5].abs().max() == 0
    x = torch.randint(0, t.vocab_size, (2, 4))
    assert torch.equal(m.prefill(cap, x, cfg=True).logits, t.prefill(cap, x, cfg=True).logits)


def test_mismatched_checkpoint_names_keys_and_shapes(target):
    sd = dict(target.state_dict())
    del sd["layers.1.feed_forward.w3.weight"]
    sd["layers.9.attention.wqkv.weight"] = torch.zeros(3, 3)
    sd["output.weight"] = torch.zeros(100, target.config.dim)
    with pytest.raises(ValueError) as e:
        lg.load_llamagen({"model": sd}, target.config)
    msg = str(e.value)
    assert "missing keys (1): layers.1.feed_forward.w3.weight" in msg
    assert "unexpected keys (1): layers.9.attention.wqkv.weight" in msg
    assert "output.weight: checkpoint (100, 128) vs model (256, 128)" in msg
    with pytest.raises(ValueError, match="no state dict"):
        lg.load_llamagen({"optimizer": {"lr": 1}}, target.config)


# --------------------------------------------------------------------------- VQ

def test_decode_code_rejects_bad_codes_and_grids():
    """Both VQ decoders (LlamaGen's, Chameleon's VQGAN) share the code/grid checks: each bad input is named."""
    from real.models.chameleon_vqgan import ChameleonVQGAN, VQGANConfig

    vqgan = ChameleonVQGAN(VQGANConfig(n_embed=64, embed_dim=8, ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=32,
                                       resolution=8)).random_init(0)
    for m, V in ((VQModel(vq_config("tiny")).random_init(0), vq_config("tiny").codebook_size), (vqgan, 64)):
        with pytest.raises(ValueError, match="5 codes are not a square grid"):
            m.decode_code(torch.zeros(5, dtype=torch.long))
        with pytest.raises(ValueError, match=r"grid \(3, 3\) does not hold 4 codes"):
            m.decode_code(torch.zeros(1, 4, dtype=torch.long), grid=(3, 3))
        with pytest.raises(ValueError, match=rf"codes must lie in \[0, {V}\)"):
            m.decode_code(torch.full((1, 4), V))
        assert m.decode_code(torch.zeros(2, 4, dtype=torch.long), grid=(1, 4)).shape[:2] == (2, 3)


def test_vq_layout_round_trip_and_decode(tmp_path):
    c = vq_config("tiny", codebook_show_usage=True)
    vq = VQModel(c).random_init(0)
    sd = vq.state_dict()
    for k in ("quantize.embedding.weight", "quantize.codebook_used", "post_quant_conv.weight", "quant_conv.weight",
              "decoder.conv_in.weight", "decoder.mid.1.q.weight", "decoder.conv_blocks.0.res.0.norm1.weight",
              "decoder.conv_blocks.0.upsample.conv.weight", "decoder.conv_out.weight", "encoder.conv_blocks.0.downsample.conv.weight"):
        assert k in sd, k
    assert torch.allclose(vq.quantize.codebook().norm(dim=-1), torch.ones(c.codebook_size))
    torch.save({"model": sd}, tmp_path / "vq.pt")
    vq2 = load_vq(tmp_path / "vq.pt", c)
    codes = torch.randint(0, c.codebook_size, (2, 16), generator=torch.Generator().manual_seed(0))
    img = vq2.decode_code(codes)
    assert img.shape == (2, 3, 4 * c.downsample, 4 * c.downsample) and img.min() >= -1 and img.max() <= 1
    assert torch.equal(img, vq.decode_code(codes))
    # the quantizer maps (scaled) codebook vectors back to their own codes
    z = vq.quantize.codebook()[codes].reshape(2, 4, 4, -1).permute(0, 3, 1, 2) * 3.0
    assert torch.equal(vq.quantize.quantize(z), codes)
    assert vq.encode(img).shape == (2, 16)
    bad = dict(sd)
    bad["quantize.embedding.weight"] = torch.zeros(10, 8)
    with pytest.raises(ValueError, match="quantize.embedding.weight: checkpoint"):
        load_vq({"model": bad}, c)


def test_codebook_neighbors_match_theory_reference():
    E = torch.randn(60, 8, generator=torch.Generator().manual_seed(0))
    assert np.array_equal(codebook_neighbors(E, 12, chunk=7).numpy(), lantern_neighbors(E.numpy(), 12))


# --------------------------------------------------------------------------- EAGLE drafter

LANTERN_KEYS = {"embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight",
                "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
                "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
                "layers.0.post_attention_layernorm.weight"}


def test_eagle_lantern_layout_round_trip(tmp_path, target):
    d = EagleDrafter.from_target(target, seed=1)
    assert set(d.state_dict()) == LANTERN_KEYS                   # no input_layernorm on layer 0
    save_lantern_drafter(d, str(tmp_path / "drafter"), input_type="c2i")
    import json

    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    cfg.pop("block_size")                                          # as in the release: block size from input_type
    (tmp_path / "drafter" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="input_type"):
        EagleConfig.from_lantern_json({**cfg, "input_type": "x"})
    d2 = load_lantern_drafter(str(tmp_path / "drafter"), target.output)
    assert d2.config.block_size == 576 and d2.config.hidden_size == target.config.dim
    d2 = load_lantern_drafter(str(tmp_path / "drafter"), target.output, config=d.config)
    feats = record_features(target, 3, torch.arange(10), cfg=True)
    toks = torch.randint(0, target.vocab_size, feats.shape[:2])
    for m in (d, d2):
        m.start(target.config.cls_token_num, 2)
    assert torch.equal(d.forward(toks, features=feats).logits, d2.forward(toks, features=feats).logits)
    sd = dict(d.state_dict())
    sd["layers.0.input_layernorm.weight"] = torch.ones(target.config.dim)
    torch.save(sd, tmp_path / "bad.bin")
    with pytest.raises(ValueError, match="unexpected keys \\(1\\): layers.0.input_layernorm.weight"):
        load_lantern_drafter(str(tmp_path / "bad.bin"), target.output, config=d.config)


def test_eagle_cache_and_training(target):
    """Cached pair-by-pair drafting equals one block; training on recorded features lowers the loss and
    raises the drafter's top-1 agreement with the target."""
    from real.decode import engine
    from real.decode.sampling import Processing

    d = EagleDrafter.from_target(target, seed=5)
    feats = record_features(target, 1, torch.arange(20))
    toks = torch.randint(0, target.vocab_size, (1, feats.shape[1]), generator=torch.Generator().manual_seed(0))
    d.start(1, 1)
    full = d.forward(toks, features=feats).logits
    d.start(1, 1)
    steps = torch.cat([d.forward(toks[:, j:j + 1], features=feats[:, j:j + 1]).logits for j in range(toks.shape[1])], 1)
    assert (full - steps).abs().max() < 1e-4
    train_out = d.train_forward(toks, feats, 1)
    assert (d.head(train_out) - full).abs().max() < 1e-4

    from theory import rules

    proc = Processing(cfg_scale=1.0)
    greedy = Processing(temperature=0.0)

    def tpc():
        return engine.summarize([engine.speculative_generate(target, d, c, num_tokens=64, verifier=rules.greedy(), drafting=4,
                                                             processing=greedy) for c in (0, 1)])["tokens_per_target_call"]

    before = tpc()
    imgs = [engine.ar_generate(target, c % 10, num_tokens=64, processing=proc, seed=c).tokens for c in range(24)]
    tokens = torch.stack(imgs)
    feats = torch.cat([record_features(target, c % 10, imgs[c]) for c in range(24)])
    log = train_eagle(d, tokens, feats, prefix_len=1, steps=150, batch_size=8, lr=3e-3, seed=0)
    first = np.mean([r["loss"] for r in log[:10]])
    last = np.mean([r["loss"] for r in log[-10:]])
    top1 = (np.mean([r["top1"] for r in log[:10]]), np.mean([r["top1"] for r in log[-10:]]))
    print(f"EAGLE training: loss {first:.3f} -> {last:.3f}, top-1 {top1[0]:.2f} -> {top1[1]:.2f}")
    after = tpc()
    print(f"greedy tokens per target call with the drafter: {before:.2f} untrained -> {after:.2f} trained")
    assert last < 0.7 * first and top1[1] > top1[0] + 0.1
    assert after > before


def test_t5_captions_are_left_padded_features():
    """Caption conditions from a (tiny, random) T5 encoder: real tokens moved to the end, padding
    zeroed and masked, as the t2i model expects."""
    from types import SimpleNamespace

    transformers = pytest.importorskip("transformers")
    enc = transformers.T5EncoderModel(transformers.T5Config(vocab_size=50, d_model=16, d_kv=4, num_heads=2, num_layers=1,
                                                            d_ff=32)).eval()

    def tok(prompts, max_length, **kw):
        ids = torch.zeros(len(prompts), max_length, dtype=torch.long)
        mask = torch.zeros(len(prompts), max_length, dtype=torch.long)
        for i, p in enumerate(prompts):
            w = [1 + (hash(x) % 48) for x in p.split()][:max_length]
            ids[i, :len(w)], mask[i, :len(w)] = torch.tensor(w), 1
        return SimpleNamespace(input_ids=ids, attention_mask=mask)

    caps = llamagen_io.t5_captions(["a red cat", "dog"], encoder=enc, tokenizer=tok, max_length=6)
    with torch.no_grad():
        ids = tok(["a red cat"], 6).input_ids
        ref = enc(input_ids=ids, attention_mask=(ids > 0).long()).last_hidden_state[0]
    assert caps[0].mask.tolist() == [False] * 3 + [True] * 3 and caps[1].mask.tolist() == [False] * 5 + [True]
    assert torch.allclose(caps[0].embedding[3:], ref[:3], atol=1e-6) and caps[0].embedding[:3].abs().max() == 0


def test_bf16_keeps_rope_in_float32(target):
    """Cast to bf16 (the GPU setting): RoPE tables stay float32 (as upstream), logits stay float32 and
    close to the float32 model's, and greedy speculative decoding equals greedy decoding up to bf16's own ties:
    the verification pass (L + 1 positions in one forward) and the AR step (one position) may round the logits
    differently (other matmul shapes: other kernels and summation orders on some CPUs), so the two may part only
    where the target's two guided logits lie within two bf16 units of the row's scale of each other. Measured on an
    AMD EPYC (torch 2.13 CPU): they part at token 25, guided logits 5.6875 against 5.625 (2 ulps at that scale); on
    an Intel Xeon they did not part."""
    from real.decode import engine
    from real.decode.sampling import Processing
    from theory import rules

    t16 = lg.load_llamagen(target.state_dict(), target.config, dtype=torch.bfloat16)
    d16 = lg.truncated(t16, 1)
    toks = torch.randint(0, target.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    a = target.prefill(1, toks, cfg=True).logits
    b = t16.prefill(1, toks, cfg=True).logits
    assert t16.rope.dtype == torch.complex64 and b.dtype == torch.float32        # complex64: float32 cos, sin
    rel = ((a - b).norm() / a.norm()).item()
    print(f"bf16 vs float32 logits: relative error {rel:.3g}")
    assert rel < 0.05
    proc = Processing(temperature=0.0, cfg_scale=2.0)
    ar = engine.ar_generate(t16, 1, num_tokens=32, processing=proc)
    sd = engine.speculative_generate(t16, d16, 1, num_tokens=32, verifier=rules.greedy(), drafting=4, processing=proc)
    a, s = ar.tokens.reshape(-1), sd.tokens.reshape(-1)
    if not torch.equal(a, s):
        i = int((a != s).nonzero()[0, 0])                       # the first token where they part
        with torch.no_grad():                                   # the AR prefix teacher-forced: its guided logits at i
            g = proc.combined(t16.prefill(1, a[None, :i].expand(2, -1), cfg=True).logits[:, -1]).float()
        tie = 2 * torch.finfo(torch.bfloat16).eps * g.abs().max().item()
        gap = (g[a[i]] - g[s[i]]).abs().item()
        print(f"greedy SD leaves greedy AR at token {i}: guided logits {g[a[i]].item()} vs {g[s[i]].item()}")
        assert gap <= tie, f"token {i}: SD chose {int(s[i])} whose guided logit is {gap:.3g} below AR's (> {tie:.3g})"
        assert g.max().item() - g[s[i]].item() <= tie          # (SD's token is a best one within the tie too)
