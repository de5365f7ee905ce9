"""The token stream of one generated image in a multimodal LM (``real.adapters.imagelm``): pure index arithmetic,
no model.

``ImageLayout`` holds an image's layout in the LM's id space (H x W codes in raster order, an optional
row-end token forced after every W-th code, a header that closes the prompt, a trailer). The engine
feeds only codes (the *visible* stream); the model's stream carries a row-end entry behind every code
that ends a row. The formulas here say which codes end a row (``ImageLayout.row_ends``), where a code or its row end
sits in the model's stream (``ImageLayout.position``) and how long the stream of the first n codes is
(``ImageLayout.stream_len``); ``real.adapters.batched_imagelm.BatchedImageLM`` keeps the one visible-vs-stream
bookkeeping of a cache with them. Inputs are CPU arrays (numpy or torch); ``tests/test_image_layout.py`` checks them
against the complete sequence ``ImageLayout.sequence`` writes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ImageLayout"]


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

    def row_ends(self, ci):
        """Whether the code at index ``ci`` ends a row, so that a row end is forced behind it: a bool array shaped as
        ``ci`` (numpy or torch), all False without a row-end token."""
        ends = (ci + 1) % self.width == 0
        return ends if self.row_end is not None else ends & False

    def position(self, base, ci, forced):
        """The model-stream position of the code at index ``ci`` in an image whose first code sits at ``base``, or of
        the row end behind it where ``forced`` (1 / True): base + ci + (rows completed before it, when row ends are
        forced) + forced. Integer arrays (numpy or torch) that broadcast together, e.g. base (R, 1), ci and forced
        (R, S); ``BatchedImageLM.rope_positions``."""
        return base + ci + (ci // self.width if self.row_end is not None else 0) + forced

    def stream_len(self, n_codes: int) -> int:
        """Model-stream entries of the first ``n_codes`` codes of an image (their forced row ends included)."""
        return n_codes + (n_codes // self.width if self.row_end is not None else 0)

