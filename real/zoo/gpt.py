"""The zoo's class-conditional LlamaGen target, its small independent draft and its EAGLE-1 drafter.

All three are *our* implementations (``real.models.llamagen.LlamaGen``, ``real.models.eagle.EagleDrafter``) over a
zoo's shipped VQ tokenizer (``real.zoo.zoos``; ``zoo`` defaults to "mnist": a 7x7 grid of 512 codes, class prefix
of 10 digits + the CFG null class, index 10; "natural256": 16x16 = 256 tokens of 1,024 codes, 16 classes + null),
image tokens in raster order. Public API (shipped weights ``{target,draft,eagle}.safetensors`` of each zoo)::

    load_target(zoo=) -> LlamaGen      load_draft(zoo=) -> LlamaGen      load_eagle(target, zoo=) -> EagleDrafter
    train_logits(model, labels (B,), codes (B, T)) -> logits (B, T, V)     whole sequences, no cache
    nll_per_token(model, labels, codes) -> float                          mean NLL in nats per image token
    fixed_batch(zoo=) -> (labels (64,), codes (64, T))                      held-out batch the tests score

``train_logits`` runs the model's own modules (``LlamaGen.layers``, norms, head) on whole sequences with a
causal mask, the computation ``prefill`` does with its KV cache (a test checks they agree), so the
training scripts and the engine score the same model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from real.models import llamagen as lg

from . import zoos

TARGET = "target.safetensors"
DRAFT = "draft.safetensors"
EAGLE = "eagle.safetensors"
NUM_CLASSES = 10               # the MNIST zoo's (other zoos: real.zoo.zoos)
NULL_CLASS = NUM_CLASSES       # the CFG null class (LlamaGen's extra class-embedding row)
TOKENS = 49
VOCAB = 512


def null_class(zoo: str = "mnist") -> int:
    """The CFG null class of ``zoo`` (its number of classes)."""
    return zoos.get(zoo).num_classes


def llamagen_config(dim: int, n_layer: int, n_head: int, multiple_of: int = 32,
                    class_dropout_prob: float = 0.1, zoo: str = "mnist") -> lg.LlamaGenConfig:
    """A c2i LlamaGen config over the zoo's tokenizer (mnist: V = 512, 7x7 tokens, 10 classes + null)."""
    z = zoos.get(zoo)
    return lg.LlamaGenConfig(dim=dim, n_layer=n_layer, n_head=n_head, multiple_of=multiple_of,
                             num_classes=z.num_classes, class_dropout_prob=class_dropout_prob, model_type="c2i",
                             vocab_size=z.vocab, cls_token_num=1, block_size=z.tokens)


def _check_batch(labels: torch.Tensor, codes: torch.Tensor, model) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.as_tensor(labels, dtype=torch.long, device=model.device).reshape(-1)
    codes = torch.as_tensor(codes, dtype=torch.long, device=model.device)
    if codes.ndim != 2 or codes.shape[0] != labels.shape[0] or codes.shape[1] > model.config.block_size:
        raise ValueError(f"codes must be (B, T <= {model.config.block_size}) with B = labels (B,) = {labels.shape[0]}, "
                         f"got {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= model.vocab_size):
        raise ValueError(f"codes must lie in [0, {model.vocab_size})")
    n_cls = model.cls_embedding.embedding_table.num_embeddings
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= n_cls):
        raise ValueError(f"labels must lie in [0, {n_cls}) ({n_cls - 1} = null class)")
    return labels, codes


def train_logits(model: lg.LlamaGen, labels: torch.Tensor, codes: torch.Tensor, *, dropout: float = 0.0,
                 return_hidden: bool = False):
    """Teacher-forced logits (B, T, V) of codes (B, T) given class labels (B,) (10 = null class):
    input [class; x_0 .. x_{T-2}], row j predicts x_j (the null class is the last class index). ``dropout`` > 0 drops the attention and feed-forward
    outputs before each residual add (training only; 0 reproduces ``LlamaGen.prefill`` exactly).
    With ``return_hidden`` also the last hidden states (B, T, D) after the final norm."""
    labels, codes = _check_batch(labels, codes, model)
    h = torch.cat([model.cls_embedding.embedding_table(labels)[:, None], model.tok_embeddings(codes[:, :-1])], 1)
    S = h.shape[1]
    rot = model.rope[:S].to(h.device)
    mask = torch.ones(S, S, dtype=torch.bool, device=h.device).tril_()[None, None]
    for layer in model.layers:   # Block.forward with optional residual dropout
        a = layer.attention(layer.attention_norm(h), rot, mask)
        h = h + (F.dropout(a, dropout, True) if dropout > 0 else a)
        m = layer.feed_forward(layer.ffn_norm(h))
        h = h + (F.dropout(m, dropout, True) if dropout > 0 else m)
    h = model.norm(h)
    logits = model.output(h).float()
    return (logits, h) if return_hidden else logits


@torch.no_grad()
def nll_per_token(model: lg.LlamaGen, labels: torch.Tensor, codes: torch.Tensor, batch_size: int = 250) -> float:
    """Mean negative log-likelihood (nats per image token) of codes (N, T) given labels (N,)."""
    labels, codes = _check_batch(labels, codes, model)
    total = 0.0
    for lb, cb in zip(labels.split(batch_size), codes.split(batch_size)):
        logits = train_logits(model, lb, cb)
        total += float(F.cross_entropy(logits.flatten(0, 1), cb.flatten(), reduction="sum"))
    return total / codes.numel()


@torch.no_grad()
def target_features(target: lg.LlamaGen, labels: torch.Tensor, codes: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """The target's last hidden states (N, T, D) at its input positions [class; x_0 .. x_{T-2}] (EAGLE's features)."""
    return torch.cat([train_logits(target, lb, cb, return_hidden=True)[1]
                      for lb, cb in zip(labels.split(batch_size), codes.split(batch_size))])


@torch.no_grad()
def draft_agreement(target: lg.LlamaGen, draft_logits, labels: torch.Tensor, codes: torch.Tensor) -> dict:
    """Teacher-forced agreement of a draft with the target on (labels, codes): top-1 agreement and the mean
    acceptance rate sum_x min(p, q) = 1 - TV(p, q) per token (no CFG, temperature 1).
    ``draft_logits(labels, codes)`` -> (N, T', V) the draft's logits for the LAST T' <= T positions (an EAGLE
    drafter cannot draft x_0: it gives T' = T - 1 rows for x_1 .. x_{T-1})."""
    q = torch.softmax(draft_logits(labels, codes), -1)
    p = torch.softmax(train_logits(target, labels, codes), -1)[:, -q.shape[1]:]
    return {"heldout_top1_agreement": float((p.argmax(-1) == q.argmax(-1)).double().mean()),
            "heldout_acceptance_rate": float(torch.minimum(p, q).sum(-1).double().mean())}


def heldout_tokens(zoo: str = "mnist") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (N, T), labels (N,)) of the zoo's held-out images under its shipped VQ (never trained on;
    mnist: 1,000 x 49)."""
    from . import vq

    x, y = zoos.get(zoo).data.heldout_split()
    return vq.encode(x, zoo=zoo).reshape(len(x), -1), y


def fixed_batch(zoo: str = "mnist") -> tuple[torch.Tensor, torch.Tensor]:
    """(labels (64,), codes (64, T)): the first 64 held-out images, the batch whose NLL the manifest records."""
    codes, labels = heldout_tokens(zoo)
    return labels[:64], codes[:64]


def _build(name: str, zoo: str = "mnist") -> lg.LlamaGen:
    from .checkpoint import load_shipped

    return load_shipped(lambda **c: lg.LlamaGen(lg.LlamaGenConfig(**c)), name, zoos.get(zoo).directory)


def load_target(zoo: str = "mnist") -> lg.LlamaGen:
    """The shipped target of ``zoo`` (hash-verified, eval mode, float32, CPU). A fresh object per call (it owns a
    KV cache)."""
    return _build(TARGET, zoo)


def load_draft(zoo: str = "mnist") -> lg.LlamaGen:
    """The shipped independent small draft of ``zoo`` (same tokenizer), fresh object per call."""
    return _build(DRAFT, zoo)


def load_eagle(target: lg.LlamaGen | None = None, zoo: str = "mnist"):
    """The shipped EAGLE-1 drafter of ``zoo`` on ``target`` (default: a fresh ``load_target(zoo)``); it drafts
    through the target's own LM head, so pass the target the engine will verify with. A zoo whose head was made by
    ``coolsd train-drafter`` ships it as the drafter directory ``eagle/`` (``real.drafter.files.load_drafter`` checks
    it); mnist's older head is ``eagle.safetensors`` with its manifest entry."""
    from real.models.eagle import EagleConfig, EagleDrafter

    from .checkpoint import load_into, manifest_entry, read_manifest

    directory = zoos.get(zoo).directory
    target = target if target is not None else load_target(zoo)
    if (directory / "eagle").is_dir():
        from real.drafter.files import load_drafter

        return load_drafter(directory / "eagle", target, zoo)
    if EAGLE not in read_manifest(directory).get("files", {}):
        raise ValueError(f"--model {zoo} ships no EAGLE head: train one with coolsd train-drafter --model {zoo} "
                         "(docs/recipes/zoo.md) and pass it with --drafter-dir")
    c = EagleConfig(**manifest_entry(EAGLE, directory)["config"])
    if c.hidden_size != target.config.dim or c.vocab_size != target.vocab_size:
        raise ValueError(f"the EAGLE drafter (hidden {c.hidden_size}, V {c.vocab_size}) does not fit this target "
                         f"(dim {target.config.dim}, V {target.vocab_size})")
    d = EagleDrafter(c, target.output)
    load_into(d, EAGLE, directory)
    return d.requires_grad_(False)
