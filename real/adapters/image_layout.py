"""The token stream of one generated image in a multimodal LM (``real.adapters.imagelm``): pure index arithmetic,
no model.

``ImageLayout`` holds an image's layout in the LM's id space (H x W codes in raster order, an optional
row-end token forced after every W-th code, a header that closes the prompt, a trailer). The engine
feeds only codes (the *visible* stream); the model's stream carries a row-end entry behind every code
that ends a row. The functions here map between the two for one fed block of S codes (with code
indices ``ci`` (S,): the position of each code in the image): where each code and each forced row end
lands in the block (``ImageLayout.block``), the model-stream positions (``ImageLayout.stream_positions``),
the (S, K) visible attention mask widened to the block's entries (``entry_mask``), where a rollback
cuts the model stream (``visible_cut``) and which entries a kept root path holds (``kept_entries``). An adapter asks
``ImageLayout.feed`` once per fed block: the block's stream ids, entries, positions and mask together (``Fed``).
All inputs and outputs are CPU tensors; ``tests/test_image_layout.py`` checks them against the
complete sequence ``ImageLayout.sequence`` writes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = ["ImageLayout", "Fed", "KIND_PREFIX", "KIND_CODE", "KIND_ROW_END", "entry_mask", "visible_cut",
           "kept_entries"]

# kind of a model-stream entry (int8 per cache entry): prompt prefix, image code, forced row end
KIND_PREFIX, KIND_CODE, KIND_ROW_END = 0, 1, 2


class Fed(NamedTuple):
    """A fed block of S codes in the model's stream, worked out at once (``ImageLayout.feed``): ``ids`` (B, S') the
    model ids with the forced row ends in place; ``a``, ``ends`` (S,) and ``kind``, ``owner``, ``is_nl`` (S',) as
    ``ImageLayout.block`` gives them; ``positions`` (S',) the model-stream positions of the entries and ``mask``
    (S', K') the widened attention mask, both None when the block is fed at the default positions with the causal
    mask."""
    ids: torch.Tensor
    a: torch.Tensor
    ends: torch.Tensor
    kind: torch.Tensor
    owner: torch.Tensor
    is_nl: torch.Tensor
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@dataclass(frozen=True)
class ImageLayout:
    """Token layout of one generated image in the LM's id space.

    ``height`` x ``width`` codes in raster order; ``row_end`` (LM id or None) follows every row;
    ``header`` ids close the prompt (boi, size tokens, ...); ``trailer`` ids follow the last row."""
    height: int
    width: int
    row_end: int | None = None
    header: tuple[int, ...] = ()
    trailer: tuple[int, ...] = ()

    def __post_init__(self):
        if self.height < 1 or self.width < 1:
            raise ValueError(f"image grid must be at least 1 x 1, got {self.height} x {self.width}")

    @property
    def num_tokens(self) -> int:
        """Codes per image, height * width."""
        return self.height * self.width

    def sequence(self, code_ids: torch.Tensor) -> torch.Tensor:
        """Complete id sequence of an image: header, rows (+ row end), trailer. code_ids (H*W,) LM ids."""
        c = torch.as_tensor(code_ids, dtype=torch.long).reshape(-1).cpu()
        if c.numel() != self.num_tokens:
            raise ValueError(f"an image of {self.height} x {self.width} has {self.num_tokens} codes, got {c.numel()}")
        rows = c.view(self.height, self.width)
        if self.row_end is not None:
            rows = torch.cat([rows, torch.full((self.height, 1), self.row_end, dtype=torch.long)], 1)
        return torch.cat([torch.tensor(self.header, dtype=torch.long), rows.reshape(-1),
                          torch.tensor(self.trailer, dtype=torch.long)])

    def check(self, seq: torch.Tensor, code_ids: torch.Tensor) -> None:
        """Raise ValueError naming the first place where ``seq`` (LM ids) breaks the layout: header,
        a code at every code position (``code_ids`` (V,) the LM ids of the codes), the row end exactly
        at every row end, the trailer at the end."""
        s = torch.as_tensor(seq, dtype=torch.long).reshape(-1).cpu()
        codes = set(torch.as_tensor(code_ids).reshape(-1).tolist())
        h, t = len(self.header), len(self.trailer)
        W = self.width + (self.row_end is not None)
        n = h + self.height * W + t
        if s.numel() != n:
            raise ValueError(f"image sequence has {s.numel()} tokens, the layout {self.height}x{self.width} needs {n}")
        if s[:h].tolist() != list(self.header):
            raise ValueError(f"header {s[:h].tolist()} != {list(self.header)}")
        body = s[h:h + self.height * W].view(self.height, W)
        for r in range(self.height):   # a check over at most a few thousand ids, not a hot path
            bad = [j for j in range(self.width) if int(body[r, j]) not in codes]
            if bad:
                raise ValueError(f"row {r}, column {bad[0]}: id {int(body[r, bad[0]])} is not an image code")
            if self.row_end is not None and int(body[r, -1]) != self.row_end:
                raise ValueError(f"row {r} ends with id {int(body[r, -1])}, not the row-end token {self.row_end}")
        if t and s[-t:].tolist() != list(self.trailer):
            raise ValueError(f"trailer {s[-t:].tolist()} != {list(self.trailer)}")

    def block(self, ci: torch.Tensor):
        """Entries of a fed block of S codes with code indices ``ci`` (S,) (CPU long): returns
        ``a`` (S,) the entry index of each code in the block, ``ends`` (S,) bool (the code ends a row
        and a row-end entry follows it at a + 1; all False without a row-end token), and per block
        entry (S',) with S' = S + ends.sum(): ``kind`` (int8, KIND_CODE / KIND_ROW_END), ``owner``
        (long, the code each entry belongs to), ``is_nl`` (bool, the entry is a row end). The logit
        row that predicts the code after code i is entry a[i] + ends[i]."""
        S = int(ci.numel())
        ends = self.row_ends(ci)
        e = ends.long()
        a = torch.arange(S) + torch.cumsum(e, 0) - e
        n = S + int(e.sum())
        kind = torch.full((n,), KIND_CODE, dtype=torch.int8)
        owner = torch.empty(n, dtype=torch.long)
        owner[a] = torch.arange(S)
        is_nl = torch.zeros(n, dtype=torch.bool)
        if n > S:
            nl = a[ends] + 1
            kind[nl] = KIND_ROW_END
            owner[nl] = torch.arange(S)[ends]
            is_nl[nl] = True
        return a, ends, kind, owner, is_nl

    def feed(self, ci: torch.Tensor, ids: torch.Tensor, prefix_len: int | None = None,
             mask: torch.Tensor | None = None, cached_kind: torch.Tensor | None = None) -> Fed:
        """Everything an adapter needs to feed a block of S codes at code indices ``ci`` (S,) (CPU long), in one
        call: the codes' model ids ``ids`` (B, S) with the forced row ends inserted (B, S') (on the ids' device), the
        block's entries (``block``) and, given the ``prefix_len`` and a visible mask ``mask`` (S, K) bool, the
        entries' model-stream positions (``stream_positions``) and the mask widened to the stream (``entry_mask``;
        ``cached_kind`` (C,) int8 the kind of every cached entry). Without them the block is fed at the default
        positions with the causal mask (``Fed.positions`` / ``Fed.mask`` None)."""
        a, ends, kind, owner, is_nl = self.block(ci)
        n = int(kind.numel())
        if n > ids.shape[1]:
            full = torch.full((ids.shape[0], n), self.row_end, dtype=torch.long, device=ids.device)
            full[:, a.to(ids.device)] = ids
            ids = full
        if prefix_len is None:
            return Fed(ids, a, ends, kind, owner, is_nl)
        return Fed(ids, a, ends, kind, owner, is_nl, self.stream_positions(ci, owner, is_nl, prefix_len),
                   entry_mask(mask, owner, is_nl, cached_kind))

    def stream_positions(self, ci: torch.Tensor, owner: torch.Tensor, is_nl: torch.Tensor,
                         prefix_len: int) -> torch.Tensor:
        """Model-stream positions (S',) of a block's entries from the code indices ``ci`` (S,) and the
        block's ``owner`` / ``is_nl`` (S',) (``block``): ``position`` of each entry's code from prefix_len."""
        return self.position(prefix_len, ci[owner], is_nl.long())

    def row_ends(self, ci):
        """Whether the code at index ``ci`` ends a row, so that a row end is forced behind it: a bool array shaped as
        ``ci`` (numpy or torch), all False without a row-end token."""
        ends = (ci + 1) % self.width == 0
        return ends if self.row_end is not None else ends & False

    def position(self, base, ci, forced):
        """The model-stream position of the code at index ``ci`` in an image whose first code sits at ``base``, or of
        the row end behind it where ``forced`` (1 / True): base + ci + (rows completed before it, when row ends are
        forced) + forced. Integer arrays (numpy or torch) that broadcast together, e.g. base (R, 1), ci and forced
        (R, S); the one formula of both image adapters (``stream_positions``, ``BatchedImageLM.rope_positions``)."""
        return base + ci + (ci // self.width if self.row_end is not None else 0) + forced

    def stream_len(self, n_codes: int) -> int:
        """Model-stream entries of the first ``n_codes`` codes of an image (their forced row ends included)."""
        return n_codes + (n_codes // self.width if self.row_end is not None else 0)


def entry_mask(m: torch.Tensor, owner: torch.Tensor, is_nl: torch.Tensor, cached_kind: torch.Tensor) -> torch.Tensor:
    """Widen a visible attention mask ``m`` (S, K) bool (``real.protocol``: the S block codes against
    the last K - S visible cached entries and the block) to the model stream: (S', K') bool over the
    block's entries (``owner`` / ``is_nl`` (S',) from ``ImageLayout.block``) against the cached entries
    from the (K - S)-th last visible one on (row ends included; ``cached_kind`` (C,) int8 the kind of
    every cached entry) and the block. Entry x sees entry y iff owner(y) is visible to owner(x),
    except that a code does not see its own row end (which comes after it); a cached row end is
    seen with the code before it."""
    S = m.shape[0]
    new = m[:, -S:][owner][:, owner] & (~is_nl[None, :] | is_nl[:, None] | (owner[:, None] != owner[None, :]))
    R = m.shape[1] - S
    if R:                     # the last R visible cached entries and the row ends that follow them
        first = int(torch.nonzero(cached_kind != KIND_ROW_END).reshape(-1)[-R])
        col = torch.cumsum((cached_kind[first:] != KIND_ROW_END).long(), 0) - 1
        new = torch.cat([m[:, :R][owner][:, col], new], 1)
    return new


def visible_cut(kind: torch.Tensor, n: int) -> int:
    """Model-stream length left after dropping the last ``n`` >= 1 visible entries with the row ends
    that follow them; ``kind`` (C,) int8 the kind of every cached entry."""
    vis = torch.nonzero(kind != KIND_ROW_END).reshape(-1)
    return int(vis[-n])


def kept_entries(a: torch.Tensor, ends: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Block entries (k',) (in order) of the codes ``idx`` (k,) of a block (``a``, ``ends`` (S,) from
    ``ImageLayout.block``): each code's entry, followed by its row end where it has one."""
    pair = torch.stack([a[idx], a[idx] + 1], 1)
    return pair[torch.stack([torch.ones_like(ends[idx]), ends[idx]], 1)]
