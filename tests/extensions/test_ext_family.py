"""Extension recipe 3 (issue 47): a new model family. This file is the whole change: a model that follows
``real.protocol.ARModel`` (one cache length, so ``real.protocol.OneRow`` runs it one image at a time), its draft, its
builder and spec (``real.registry.register``), and runs through ``coolsd generate`` with ``--fidelity``.

The family, class-conditional bigram tables: the next token's logits are a table row indexed by (class, last token),
(C, V, V) float32. A bigram's row at a position depends on that position's token alone, so attention masks and
positions do not change it (tree and chain rounds see the same rows). The draft is a noisier table of the same shape
(an independent draft)."""
import contextlib
import io
import json

import numpy as np
import pytest
import torch

from real import registry, specs
from real.protocol import ModelOutput

V, C, T = 12, 3, 10


class Bigram:
    """An ``ARModel``: logits (B, S, V) = table[class, token] for every appended token; the prefix's row is
    table[class, V - 1] (a start token); the CFG row (``cfg``) reads the class-mean table."""
    batched = False
    needs_features = False

    def __init__(self, logits: torch.Tensor):
        self.table, self.vocab_size, self.device = logits, logits.shape[-1], torch.device("cpu")
        self._cls, self._rows, self._len, self._last = 0, 1, 0, 0

    @property
    def cache_len(self) -> int:
        return self._len

    def _rows_of(self, tokens: torch.Tensor) -> torch.Tensor:
        tabs = [self.table[self._cls], self.table.mean(0)][:self._rows]
        return torch.stack([tabs[b][tokens[b]] for b in range(self._rows)])         # (B, S, V)

    def prefill(self, cond, tokens=None, *, cfg: bool = False, return_hidden: bool = False) -> ModelOutput:
        self._cls, self._rows, self._len = int(cond), 2 if cfg else 1, 1
        start = torch.full((self._rows, 1), V - 1, dtype=torch.long)
        out = self._rows_of(start)
        if tokens is not None and tokens.shape[1]:
            out = torch.cat([out, self.forward(tokens.expand(self._rows, -1)).logits], 1)
        return ModelOutput(out.float())

    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden: bool = False) -> ModelOutput:
        self._len, self._last = self._len + tokens.shape[1], tokens.shape[1]
        return ModelOutput(self._rows_of(tokens.long()).float())

    def rollback(self, n: int) -> None:
        self._len -= int(n)

    def keep(self, indices: torch.Tensor) -> None:
        self._len -= self._last - len(indices)


def _build(opts) -> registry.Bundle:
    g = torch.Generator().manual_seed(int(opts.seed or 0))
    logits = 2.0 * torch.randn(C, V, V, generator=g)
    target = Bigram(logits)
    draft = Bigram(logits + torch.randn(C, V, V, generator=g)) if opts.draft != "none" else None
    n = opts.num_images or 1
    return registry.Bundle(target, draft, [i % C for i in range(n)], T, codebook=None, info={"draft": opts.draft})


@pytest.fixture(scope="module")
def bigram():
    registry.register("bigram-toy", _build, "class-conditional bigram tables (tests/extensions)",
                      spec=specs.ModelSpec("bigram-toy", drafts=("small",), default_draft="small", codebook="none",
                                           batched=False, tokens=T))
    yield
    registry.MODELS.pop("bigram-toy")
    specs.SPECS.pop("bigram-toy")


def _generate(tmp_path, *argv):
    from coolsd.cli import main

    out, err, save = io.StringIO(), io.StringIO(), tmp_path / "s.npz"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["generate", "--model", "bigram-toy", "--num-images", "6", "--seed", "2", "--json", "--fidelity",
                   "--save", str(save), *argv])
    return rc, (json.loads(out.getvalue()) if rc == 0 else None), err.getvalue(), save


def test_the_family_generates_and_is_scored_exactly(bigram, tmp_path):
    rc, d, err, save = _generate(tmp_path, "--method", "vanilla", "--L", "3")
    assert rc == 0, err
    assert d["image_tokens"] == T and d["num_images"] == 6 and d["tokens_per_target_call"] > 1
    z = np.load(save)
    assert z["tokens"].shape == (6, T) and np.allclose(z["log_p_hat"], z["log_p"], atol=1e-5)    # lossless
    rc, d, err, save = _generate(tmp_path, "--method", "cool-sd", "--delta", "4", "--L", "3")
    z = np.load(save)
    assert rc == 0 and not np.allclose(z["log_p_hat"], z["log_p"])                               # relaxed


def test_its_spec_is_enforced(bigram, tmp_path):
    rc, _, err, _ = _generate(tmp_path, "--batch-size", "2")           # one image at a time (batched=False)
    assert rc != 0 and "--batch-size 2" in err
    rc, _, err, _ = _generate(tmp_path, "--method", "lantern")         # control: no codebook, no LANTERN
    assert rc != 0 and "codebook" in err
