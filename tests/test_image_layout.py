"""real.adapters.image_layout without a model: which codes end a row, where codes and forced row ends land in the
model's stream and how long it is, against a brute-force walk over the complete token sequence that
``ImageLayout.sequence`` writes. (The stream bookkeeping of a cache is ``BatchedImageLM``'s, checked against
transformers references in tests/test_real_hf_models.py and tests/test_batched_imagelm.py.)
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from real.adapters.image_layout import ImageLayout

KIND_CODE, KIND_ROW_END = "code", "row end"      # the brute force's entry kinds

ROW_END = 7        # LM id of the row-end token; codes are LM ids 100 + k
HEADER, TRAILER = (3, 4), (5,)


def _stream(lay: ImageLayout):
    """Brute force: the image body of the complete sequence, as a list of (kind, code index) per entry
    (a row end carries the index of the code before it)."""
    seq = lay.sequence(100 + torch.arange(lay.num_tokens)).tolist()
    body = seq[len(lay.header):len(seq) - len(lay.trailer)]
    out, last = [], None
    for x in body:
        if x == lay.row_end:
            out.append((KIND_ROW_END, last))
        else:
            last = x - 100
            out.append((KIND_CODE, last))
    return out


def _block_brute(lay: ImageLayout, c0: int, S: int):
    """Entries of the block of codes c0 .. c0+S-1 (with the row end after each code that has one)."""
    st_ = _stream(lay)
    first = next(i for i, (k, c) in enumerate(st_) if k == KIND_CODE and c == c0)
    ent = [(i, k, c) for i, (k, c) in enumerate(st_) if i >= first and c0 <= c < c0 + S]
    return ent


@st.composite
def _case(draw):
    H, W = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    lay = ImageLayout(H, W, draw(st.sampled_from([None, ROW_END])), HEADER, TRAILER)
    T = H * W
    c0 = draw(st.integers(0, T - 1))
    S = draw(st.integers(1, T - c0))
    return lay, c0, S


@settings(max_examples=100, deadline=None)
@given(_case(), st.integers(0, 5))
def test_batched_adapters_positions_on_numpy_rows_match_the_sequence(case, P):
    """``row_ends``, ``position`` and ``stream_len`` as ``BatchedImageLM`` calls them (numpy (R, S) code indices, a
    base per row) put every code and every forced row end where the complete sequence has it. Control: the same
    positions without the rows completed before each code miss as soon as a row end precedes the block."""
    import numpy as np

    lay, c0, S = case
    ent = _block_brute(lay, c0, S)
    where = {(k, c): i for i, k, c in ent}
    ci = np.stack([c0 + np.arange(S), c0 + np.arange(S)])               # two rows, bases P and P + 3
    base = np.array([P, P + 3])
    ends = lay.row_ends(ci)
    assert ends.dtype == bool and ends[0].tolist() == [(KIND_ROW_END, c0 + j) in where for j in range(S)]
    for f, kind in ((False, KIND_CODE), (True, KIND_ROW_END)):
        pos = lay.position(base[:, None], ci, np.full(ci.shape, f))
        for j in range(S):      # a loop over the block's codes (test only)
            if (kind, c0 + j) in where:
                assert pos[0, j] == P + where[kind, c0 + j] and pos[1, j] == pos[0, j] + 3
    assert lay.stream_len(c0) == where[KIND_CODE, c0] and lay.stream_len(lay.num_tokens) == len(_stream(lay))
    if lay.row_end is not None and c0 >= lay.width:                       # control: rows before the block ignored
        assert (base[0] + ci[0, 0]) != P + where[KIND_CODE, c0]


def test_row_end_after_every_row_and_none_without_token():
    lay = ImageLayout(2, 3, ROW_END)
    assert lay.row_ends(torch.arange(6)).tolist() == [False, False, True, False, False, True]
    assert lay.stream_len(6) == 8 and lay.stream_len(3) == 4
    bare = ImageLayout(2, 3)                                                   # negative control
    assert not bare.row_ends(torch.arange(6)).any() and bare.stream_len(6) == 6


def test_layout_check_roundtrip_and_refusals():
    lay = ImageLayout(2, 2, ROW_END, HEADER, TRAILER)
    codes = 100 + torch.arange(4)
    seq = lay.sequence(codes)
    assert seq.tolist() == [3, 4, 100, 101, 7, 102, 103, 7, 5]
    lay.check(seq, 100 + torch.arange(8))
    bad = seq.clone()
    bad[4] = 101
    with pytest.raises(ValueError, match="row 0 ends"):
        lay.check(bad, 100 + torch.arange(8))
    with pytest.raises(ValueError, match="at least 1 x 1"):
        ImageLayout(0, 2)
