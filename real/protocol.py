"""The model protocol the engine speaks: what a target or a draft must provide.

Every model (LlamaGen, a transformers causal LM through ``real.adapters.hf``, Chameleon / Lumina-mGPT / Janus /
Emu3 adapters, the toy models of the MNIST zoo) is a stateful object that owns its KV cache:

* ``prefill(cond, tokens=None, *, cfg=False, return_hidden=False)`` resets the cache, runs the
  condition prefix (class id, caption embedding, prompt ids) followed by the optional image ``tokens``
  (B, S) in ONE forward, and returns ``ModelOutput`` with ``logits`` (B, 1 + S, V): row 0 is the
  next-token logits after the prefix, row j the logits after ``tokens[:, j-1]``. With ``cfg=True`` the
  model builds the classifier-free-guidance pair itself (B = 2: row 0 conditional, row 1 the model's
  own null condition: LlamaGen's null class / uncond caption embedding, a negative prompt, ...).
  ``return_hidden=True`` also returns ``hidden`` (B, P + S, D), the last hidden state (after the final
  norm, the input of the LM head) at every prefix and token position; P = prefix length.
* ``forward(tokens, *, position_ids=None, attn_mask=None, return_hidden=False)`` appends a block of
  S new image tokens (B, S) on top of the cache and returns logits (B, S, V) (+ hidden (B, S, D)).
  ``position_ids`` (S,) are the absolute positions of the new tokens in the linear sequence (prefix
  included; default ``cache_len + arange(S)``); ``attn_mask`` (S, S) bool says which new tokens a new
  token may attend to (default causal), every cached entry being visible; (S, K) with S < K <=
  cache_len + S also covers the last K - S cached entries (older ones stay visible), which lets a
  drafter extend a tree level by level. Together they express tree verification (tokens at equal
  depth share a position; the mask is the ancestor relation).
* ``rollback(n)`` drops the last n cache entries; ``keep(indices)`` compacts the cache after a
  block: of the entries written by the last ``forward``, keep those at ``indices`` (k,) (in order),
  drop the rest (adapters that cannot do it raise NotImplementedError with a sentence).
* ``cache_len`` (int): entries in the cache, prefix included.
* ``batched`` (bool): False for these single-length models; the decoder sees them through ``OneRow``.
  Models with per-row cache lengths follow ``BatchedTarget`` / ``BatchedFeatureDrafter`` (per-row
  ``cache_lens``, ``rollback(counts)``, ``keep(indices, counts)``, ``cache_bytes``), which is exactly what
  ``real.decode`` calls; ``real.nn.kvcache.CachedRows`` gives their cache members.
* ``vocab_size`` (int): V, the image-token vocabulary; logits are over image tokens only (an adapter of
  a multimodal LM maps image token k to its own id and slices the logits, see ``real.adapters.hf``).
* ``needs_features`` (bool, default False): see ``FeatureDrafter``.

Logits are float32 whatever the model dtype (bf16 on GPU); probabilities are formed by
``real.decode.sampling.Processing`` from them, never by the model.

A model that needs the target's hidden states (EAGLE-1 drafters, ``real.models.eagle``) is a
``FeatureDrafter``: ``needs_features = True``, ``start(prefix_len, batch, *, extra=0)`` instead of prefill,
``forward(tokens, *, features, ...)`` with ``features`` (B, S, D) the target's hidden states paired
with the tokens (EAGLE's (token_{t+1}, h_t) pairs), returning logits and its own hidden states.

Conditions (model-specific; these containers are shared so adapters agree):
``int`` / 0-d tensor class id (LlamaGen c2i), ``Caption`` (LlamaGen t2i), ``Prompt`` (token-id prompts).

Writing an adapter (Chameleon / Lumina-mGPT, Janus, Emu3, toy models): wrap the model's forward so
that the five members above hold, keep structural tokens (image start, end-of-row markers) inside the
adapter if the engine should only see image tokens, and check it the way ``tests/test_real_models.py``
and ``tests/test_real_hf.py`` check LlamaGen and ``real.adapters.hf``: ``prefill(cond, tokens)`` logits equal a
prefill followed by one-token forwards; ``rollback(n)`` then re-feeding gives the same logits;
greedy ``speculative_generate`` equals ``ar_generate`` at temperature 0 (with and without CFG); a tree
block (``attn_mask``, ``position_ids``) scores a branch as the chain does and ``keep`` compacts it.
Register a named pair in ``real.registry`` to make it available to ``coolsd generate --model``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

__all__ = ["ModelOutput", "ARModel", "FeatureDrafter", "BatchedTarget", "BatchedFeatureDrafter", "Caption", "Prompt",
           "check_pair", "as_conds", "OneRow", "as_batched", "prompt_rows", "left_pad", "left_pad_ids", "LAWS",
           "Proposal", "Drafting", "NO_DRAFT", "make_draft"]

NO_DRAFT = "none"   # the draft kind of drafter-free decoding (--draft jacobi): builders make no draft model


class ModelOutput(NamedTuple):
    """A model call's result: ``logits`` (B, S, V) float32 over the image vocabulary; ``hidden`` (B, S', D) the
    last hidden states when asked (S' = S after ``forward``, P + S after ``prefill``)."""
    logits: torch.Tensor                 # (B, S, V) float32, image-token vocabulary
    hidden: torch.Tensor | None = None   # (B, S', D) last hidden states (post final norm), when asked


@runtime_checkable
class ARModel(Protocol):
    """A target or plain draft (module docstring for the full contract)."""
    vocab_size: int

    @property
    def cache_len(self) -> int:
        """Entries in the cache, prefix included."""

    def prefill(self, cond, tokens: torch.Tensor | None = None, *, cfg: bool = False,
                return_hidden: bool = False) -> ModelOutput:
        """Reset the cache and run cond's prefix (P positions) then ``tokens`` (B, S) -> logits (B, 1 + S, V) (+
        hidden (B, P + S, D)); B = 2 with ``cfg``."""

    def forward(self, tokens: torch.Tensor, *, position_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = False) -> ModelOutput:
        """Append ``tokens`` (B, S) at ``position_ids`` (S,) under ``attn_mask`` (S, K) bool -> logits (B, S, V) (+
        hidden (B, S, D))."""

    def rollback(self, n: int) -> None:
        """Drop the last n cache entries."""

    def keep(self, indices: torch.Tensor) -> None:
        """Keep the last block's entries at ``indices`` (k,) (block-relative, in order); drop the rest of the
        block."""


@runtime_checkable
class FeatureDrafter(Protocol):
    """A drafter fed the target's hidden states (EAGLE-1; module docstring)."""
    vocab_size: int
    needs_features: bool

    @property
    def cache_len(self) -> int:
        """Entries in the cache."""

    def start(self, prefix_len: int, batch: int, *, extra: int = 0) -> None:
        """Reset the cache for ``batch`` rows whose target prefix has ``prefix_len`` positions; ``extra`` more
        entries per row than generation needs (``real.decode.score``'s per-offset passes append ~L T entries)."""

    def forward(self, tokens: torch.Tensor, *, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = True) -> ModelOutput:
        """Append ``tokens`` (B, S) paired with ``features`` (B, S, D), the target's hidden states -> logits
        (B, S, V) and the drafter's hidden states (B, S, D)."""

    def rollback(self, n: int) -> None:
        """Drop the last n cache entries."""


@runtime_checkable
class BatchedTarget(Protocol):
    """What ``real.decode`` calls on a target or an independent draft, with per-row cache lengths (LlamaGen, the
    zoo models; a single-length ``ARModel`` is seen through ``OneRow``). R = model rows (images, x2 with CFG).

    * ``vocab_size`` V; ``batched`` True; ``needs_features`` False; ``prefix_len`` the condition prefix's
      positions (a feature drafter's cache is sized by it);
    * ``cache_lens`` (R,) int64 entries per row, prefix included;
    * ``prefill(conds, tokens=None, *, cfg, return_hidden)``: conds a list of B conditions, tokens (B, S) ->
      logits (R, 1 + S, V) (+ hidden (R, P + S, D));
    * ``forward(tokens (R, S), *, position_ids (R, S) or (S,), attn_mask (S, K) bool, return_hidden)`` ->
      logits (R, S, V) (+ hidden (R, S, D));
    * ``rollback(counts)``: drop counts[r] entries of row r (an int: every row);
    * ``keep(indices (R, k) or (k,), counts (R,))``: of the last block, keep the first counts[r] of indices[r];
    * ``cache_bytes(rows)``: the memory ``prefill`` allocates for ``rows`` rows;
    * ``row_masks`` (bool): ``forward`` takes one attention mask per row, (R, S, K) (dynamic trees at B > 1);
    * ``extra_slots`` (int or None): cache entries per row past the image (a dynamic tree's block must fit), None:
      unbounded.
    ``real.nn.kvcache.CachedRows`` implements the cache members for every model that owns a ``KVCache``."""
    vocab_size: int
    batched: bool
    needs_features: bool
    prefix_len: int
    row_masks: bool
    extra_slots: int | None

    @property
    def cache_lens(self) -> np.ndarray:
        """(R,) int64 entries per row, prefix included."""

    def prefill(self, conds, tokens: torch.Tensor | None = None, *, cfg: bool = False,
                return_hidden: bool = False) -> ModelOutput:
        """Reset every row and run the conditions' prefixes, then ``tokens`` (B, S) -> logits (R, 1 + S, V)."""

    def forward(self, tokens: torch.Tensor, *, position_ids=None, attn_mask: torch.Tensor | None = None,
                return_hidden: bool = False) -> ModelOutput:
        """Append ``tokens`` (R, S) at ``position_ids`` (R, S) -> logits (R, S, V) (+ hidden (R, S, D))."""

    def rollback(self, counts) -> None:
        """Drop the last counts[r] entries of row r (int: every row)."""

    def keep(self, indices, counts=None) -> None:
        """Keep the last block's entries ``indices`` ((R, k) or (k,)), the first counts[r] in row r."""

    def cache_bytes(self, rows: int) -> int:
        """Memory of the cache ``prefill`` allocates for ``rows`` rows."""


@runtime_checkable
class BatchedFeatureDrafter(Protocol):
    """What ``real.decode`` calls on an EAGLE-style drafter with per-row cache lengths: as ``BatchedTarget`` but
    ``needs_features`` True, ``start(prefix_len, rows)`` instead of ``prefill`` (``prefix_len`` the target's),
    ``forward(tokens (R, S), *, features (R, S, D), position_ids, attn_mask)`` -> logits (R, S, V) and the
    drafter's hidden states (R, S, D), ``cache_bytes(rows, prefix_len)``, ``row_masks`` and ``extra_slots``."""
    vocab_size: int
    batched: bool
    needs_features: bool
    row_masks: bool
    extra_slots: int | None

    @property
    def cache_lens(self) -> np.ndarray:
        """(R,) int64 entries per row."""

    def start(self, prefix_len: int, batch: int) -> None:
        """Reset for ``batch`` rows whose target prefix has ``prefix_len`` positions."""

    def forward(self, tokens: torch.Tensor, *, features: torch.Tensor, position_ids=None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = True) -> ModelOutput:
        """Append (tokens (R, S), features (R, S, D)) -> logits (R, S, V), hidden (R, S, D)."""

    def rollback(self, counts) -> None:
        """Drop the last counts[r] entries of row r."""

    def keep(self, indices, counts=None) -> None:
        """As ``BatchedTarget.keep``."""

    def cache_bytes(self, rows: int, prefix_len: int) -> int:
        """Memory of the cache ``start(prefix_len, rows)`` allocates."""


# ----------------------------------------------------------------------------- the drafting contract

LAWS = ("sampled", "without_replacement", "point")
"""How a proposal's candidates were drawn, stated by the drafting mode (never inferred from its arrays): "sampled"
(each node's one candidate drawn from its q row: chains, Jacobi windows), "without_replacement" (a node's m candidates
a sequential draw without replacement from its q row: static and lossless dynamic trees), "point" (deterministic
candidates: top-k, greedy, n-gram lookups; the draft law is the point mass at the candidate, the release's qx = 1)."""


@dataclass
class Proposal:
    """What a drafting mode proposes for one round of a batch of B images (N drafted nodes; node 0 is the root, each
    image's last committed token; a chain is the tree whose node k has the single child k + 1):

    * ``tokens`` (B, N+1) int64 node tokens, the root at 0;
    * ``q`` (B, N+1, V) the draft row each node's candidates were drawn from (chains: (B, N, V), draft k from row
      k - 1; rows past a node's children are never read), or None with ``law="point"`` when nothing reads them;
    * ``law`` in ``LAWS``;
    * ``tree``: None (a chain), a ``theory.tree.Tree`` shared by the batch, or ``theory.tree.RowTrees`` per image;
    * ``depth`` (N+1,) or (B, N+1) int64 node depths (the target position of node k is the root's + depth[k]);
    * ``mask`` (N+1, N+1) or (B, N+1, N+1) bool tree attention (a sees b iff b is a or an ancestor), None: causal;
    * ``draft_forwards``: draft-model forwards the proposal took; ``parent`` (B, N+1) node parents (-1 at the root)
      when the tree differs per image; ``verify``: None (``theory.tree.verify_round``'s walk), or a mode's own verdict
      ``verify(p, q, tokens, u_accept, u_sample, verifier, max_depth) -> TreeVerdict`` (``real.decode.sjd_pac``);
      ``q_checked``: the q rows are known finite already (rows of the fixed law, or target rows a round checked
      before: SJD-PAC's window), so the round checks the target rows alone."""
    tokens: object
    q: object
    law: str
    tree: object = None
    depth: object = None
    mask: object = None
    draft_forwards: int = 0
    parent: object = None
    verify: object = None
    q_checked: bool = False

    def __post_init__(self):
        if self.law not in LAWS:
            raise ValueError(f"Proposal.law must be one of {LAWS}, got {self.law!r}")
        if self.q is None and self.law != "point":
            raise ValueError(f"a proposal drawn with law {self.law!r} must give its q rows (only 'point' may omit them)")


@runtime_checkable
class Drafting(Protocol):
    """A drafting mode (``real.decode.modes``): an immutable value holding its options; one batch's state lives in the
    ``real.decode.round.Run`` it is given (``run.state``). The engine's loop (``real.decode.engine.generate``) does not
    know which mode it runs: the target's prefill (then ``start``), and per round ``propose``, one target forward,
    ``theory.tree.verify_round``, the commit, ``advance``.

    * ``max_depth`` (int): the most drafted levels per round (chain L, tree depth, window - 1; 0: plain AR); the round
      cuts image b's to D'_b = min(max_depth, T - plain_tail - n_b - 1) (``plain_tail``: optional, default 0) and
      proposes nothing when every D'_b is 0 (a plain AR step);
    * ``needs_draft`` (bool): whether a draft model drives it (else ``generate``'s draft must be None);
    * ``trees`` (bool): whether its proposals are trees (records then mark plain steps as depth-0 tree rounds);
    * ``check(target, draft, num_tokens, verifier, processing, batch_size)``: ValueError before any work (models in
      the batched protocol, ``real.protocol.as_batched``; a drafter-free mode is also asked with target, draft and
      verifier None by the command line, before any model is built: the options alone);
    * ``start(run)``: after the target's prefill and the first token (a draft model is already started), the mode's
      initial ``run.state``;
    * ``from_prefill(run)`` (bool): round 0 verifies drafts made before the target's prefill (an independent draft's
      chain, the theory's convention of docs/theory.md section 11); else round 0 is the prefill alone;
    * ``propose(run, depth)`` -> ``Proposal``, ``depth`` (B,) int64 the images' D'_b (0 for finished images, which ride
      along and keep nothing);
    * ``advance(run, proposal, verdict, p, n0)``: after the commit, update the mode's own state (draft cache rollbacks,
      Jacobi windows); ``verdict`` a ``theory.tree.TreeVerdict`` with ``accepted`` on the host, ``p`` (B, N+1, V) the
      round's target rows, ``n0`` (B,) the committed lengths the round started from;
    * ``params()`` -> dict for the records."""
    max_depth: int
    needs_draft: bool
    trees: bool

    def check(self, target, draft, num_tokens: int, verifier, processing, batch_size: int) -> None: ...
    def start(self, run) -> object: ...
    def from_prefill(self, run) -> bool: ...
    def propose(self, run, depth: np.ndarray) -> Proposal: ...
    def advance(self, run, proposal: Proposal, verdict, p, n0: np.ndarray) -> None: ...
    def params(self) -> dict: ...


@dataclass
class Caption:
    """A caption as text-encoder features: ``embedding`` (N, C) (LlamaGen t2i: flan-t5-xl, N = 120,
    C = 2048, already left-padded), ``mask`` (N,) bool, True at real tokens (None: all real)."""
    embedding: torch.Tensor
    mask: torch.Tensor | None = None

    def __post_init__(self):
        if self.embedding.ndim != 2:
            raise ValueError(f"Caption.embedding must be (N, C), got shape {tuple(self.embedding.shape)}")
        if self.mask is not None and tuple(self.mask.shape) != (self.embedding.shape[0],):
            raise ValueError(f"Caption.mask must be ({self.embedding.shape[0]},), got {tuple(self.mask.shape)}")


@dataclass
class Prompt:
    """A prompt of token ids in the model's own vocabulary; ``uncond_ids`` is the prompt of the
    unconditional CFG row (required when generating with cfg)."""
    ids: torch.Tensor
    uncond_ids: torch.Tensor | None = None

    def __post_init__(self):
        self.ids = torch.as_tensor(self.ids, dtype=torch.long).reshape(-1)
        if self.ids.numel() == 0:
            raise ValueError("Prompt.ids is empty: a causal LM needs at least one prompt token")
        if self.uncond_ids is not None:
            self.uncond_ids = torch.as_tensor(self.uncond_ids, dtype=torch.long).reshape(-1)
            if self.uncond_ids.numel() == 0:
                raise ValueError("Prompt.uncond_ids is empty")


def prompt_rows(cond, cfg: bool, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``Prompt`` (or its ids) as left-padded model rows: one row, or with ``cfg`` the (ids, uncond_ids)
    pair. Returns ids (B, P) int64, real (B, P) bool (False at padding) and positions (B, P) int64 (0 on
    the padding, then 0, 1, ... over each row's real ids)."""
    prompt = cond if isinstance(cond, Prompt) else Prompt(cond)
    rows = [prompt.ids]
    if cfg:
        if prompt.uncond_ids is None:
            raise ValueError("CFG needs Prompt(ids, uncond_ids=...) for the unconditional row")
        rows.append(prompt.uncond_ids)
    return left_pad(rows, device)


def left_pad_ids(rows, device=None) -> tuple[torch.Tensor, np.ndarray]:
    """Prompt rows of token ids (a list of R (n_r,) int64 tensors, n_r >= 1) left-padded with 0 to the longest P:
    ids (R, P) int64 on ``device`` (None: the rows' own) and each row's padding width (R,) int64 on the host, known
    from the rows' lengths (no read-back of a device tensor: FastLlama's prefill on the device path)."""
    R, P = len(rows), max(r.numel() for r in rows)
    device = rows[0].device if device is None else device
    ids = torch.zeros(R, P, dtype=torch.long, device=device)
    for b, r in enumerate(rows):  # a loop over the prompt rows, once per prefill
        ids[b, P - r.numel():] = r.to(device)
    return ids, np.array([P - r.numel() for r in rows], np.int64)


def left_pad(rows, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``left_pad_ids``'s rows with their masks: the one left-pad of the toolkit (``prompt_rows``, the Llama and
    batched image-LM prefills). Returns ids (R, P) int64, real (R, P) bool (False at padding) and positions (R, P)
    int64 (0 on the padding, then 0, 1, ... over each row's real ids), on ``device`` (None: the rows' own)."""
    ids, pad = left_pad_ids(rows, device)
    real = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    for b, w in enumerate(pad.tolist()):  # a loop over the prompt rows, once per prefill
        real[b, w:] = True
    return ids, real, (real.long().cumsum(-1) - 1).clamp(min=0)


def as_conds(cond) -> list:
    """One condition or a list/tuple of B conditions (one per image) -> a non-empty list of one kind
    (class ids, ``Caption`` or ``Prompt``): a batch never mixes condition types."""
    conds = list(cond) if isinstance(cond, (list, tuple)) else [cond]
    if not conds:
        raise ValueError("no condition given: a batch needs at least one image")
    kind = lambda x: "Caption" if isinstance(x, Caption) else "Prompt" if isinstance(x, Prompt) else "class id"  # noqa: E731
    kinds = {kind(x) for x in conds}
    if len(kinds) > 1:
        raise ValueError(f"a batch mixes condition types {sorted(kinds)}: generate each kind in its own batch")
    return conds


def check_pair(target, draft) -> None:
    """Refuse a draft/target pair that cannot be verified against each other (different vocabularies)."""
    vt, vd = getattr(target, "vocab_size", None), getattr(draft, "vocab_size", None)
    if vt is None or vd is None:
        raise ValueError("target and draft must expose vocab_size (the image-token vocabulary)")
    if int(vt) != int(vd):
        raise ValueError(f"draft and target vocabularies differ: draft V={vd}, target V={vt}; speculative decoding "
                         "needs both over the same image tokens (same tokenizer)")


class Placed:
    """Mixin for an ``nn.Module`` model: its ``device`` and ``dtype`` are those of the parameter named
    ``_placed_by`` (dotted name; the model's weights all live there)."""
    _placed_by = ""

    @property
    def device(self) -> torch.device:
        """The device of the ``_placed_by`` parameter."""
        return self.get_parameter(self._placed_by).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the ``_placed_by`` parameter."""
        return self.get_parameter(self._placed_by).dtype


class OneRow:
    """A model whose cache has a single length (the transformers adapters: ``batched`` false) seen through
    the batched calls of ``real.decode.steps`` at batch size 1: rows (1, or the CFG pair) always agree, so
    per-row positions (R, S), counts (R,) and keep indices (R, k) reduce to the first row's."""
    batched = True

    def __init__(self, model):
        """Wrap ``model``, an ``ARModel`` / ``FeatureDrafter`` that keeps one cache length for all its rows."""
        self.model = model
        self._rows = 1

    def __getattr__(self, name):
        return getattr(self.model, name)

    row_masks = False        # one image at a time: a shared (S, K) mask is all it ever gets

    @property
    def extra_slots(self):
        """The model's spare cache entries past the image (None: unbounded, e.g. transformers' dynamic caches)."""
        return getattr(self.model, "extra_slots", None)

    @property
    def cache_lens(self) -> np.ndarray:
        """(rows,) int64: the model's single cache length, once per row."""
        return np.full(self._rows, int(self.model.cache_len), dtype=np.int64)

    def _one(self, a: np.ndarray, name: str) -> np.ndarray:
        """The first row of per-row values a (rows, ...), which must all agree."""
        if a.shape[0] != self._rows or not (a == a[:1]).all():
            raise ValueError(f"{type(self.model).__name__} keeps one cache length: its {self._rows} rows' {name} "
                             f"must agree, got {a.tolist()}")
        return a[0]

    def prefill(self, cond, tokens=None, *, cfg: bool = False, return_hidden: bool = False):
        """The model's ``prefill`` for one condition (a list must hold exactly one): tokens (B, S) -> logits
        (B, 1 + S, V), B = 2 with ``cfg``."""
        conds = as_conds(cond)
        if len(conds) != 1:
            raise ValueError(f"{type(self.model).__name__} generates one image at a time, got {len(conds)} conditions")
        self._rows = 2 if cfg else 1
        return self.model.prefill(conds[0], tokens, cfg=cfg, return_hidden=return_hidden)

    def start(self, prefix_len: int, batch: int, **kw) -> None:
        """The drafter's ``start`` for ``batch`` rows (``kw``: ``extra``, as ``FeatureDrafter.start``)."""
        self._rows = int(batch)
        self.model.start(prefix_len, batch, **kw)

    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden: bool = False, **kw):
        """The model's ``forward`` on tokens (B, S): ``position_ids`` (S,) or per row (R, S) (the rows must agree)
        -> logits (B, S, V); default positions are passed as None."""
        if position_ids is not None:
            pos = np.asarray(position_ids)
            pos = self._one(pos, "positions") if pos.ndim == 2 else pos.reshape(-1)
            default = self.model.cache_len + np.arange(pos.shape[0])
            position_ids = None if attn_mask is None and np.array_equal(pos, default) else torch.as_tensor(pos)
        return self.model.forward(tokens, position_ids=position_ids, attn_mask=attn_mask, return_hidden=return_hidden,
                                  **kw)

    def rollback(self, n) -> None:
        """Drop n entries: n an int or (R,) counts that must agree across rows."""
        self.model.rollback(int(self._one(np.broadcast_to(np.asarray(n), (self._rows,)), "rollbacks")))

    def keep(self, indices, counts=None) -> None:
        """Keep the last block's entries ``indices`` ((k,), or (R, k) rows that must agree), the first ``counts``
        (int or agreeing (R,), default k) of them."""
        idx = np.asarray(indices)
        idx = self._one(idx, "kept entries") if idx.ndim == 2 else idx
        c = idx.shape[0] if counts is None else int(self._one(np.broadcast_to(np.asarray(counts), (self._rows,)), "counts"))
        self.model.keep(torch.as_tensor(idx[:c], dtype=torch.long))


def make_draft(kind: str, table: dict):
    """The draft model of ``kind`` from ``table`` (kind -> a builder taking no argument): the one place a model builder
    (``real.registry``, the adapters' tiny pairs) picks its draft; None for drafter-free decoding (``NO_DRAFT``);
    ValueError naming the kinds otherwise."""
    if kind == NO_DRAFT:
        return None
    if kind not in table:
        raise ValueError(f"unknown draft kind {kind!r}; choose {', '.join(table)}")
    return table[kind]()


def as_batched(model):
    """``model`` as the decoder calls it: itself when it keeps per-row cache lengths (``batched``), else wrapped in
    ``OneRow`` (one image at a time); None stays None."""
    return model if model is None or model.batched else OneRow(model)
