"""real.adapters.image_layout without a model: the block arithmetic (where codes and forced row ends land, their
model-stream positions, the widened attention mask, rollback cuts, kept root paths) against a brute-force
walk over the complete token sequence that ``ImageLayout.sequence`` writes.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from real.adapters.image_layout import KIND_CODE, KIND_PREFIX, KIND_ROW_END, ImageLayout, entry_mask, kept_entries, visible_cut

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


@settings(max_examples=150, deadline=None)
@given(_case(), st.integers(0, 5))
def test_block_and_positions_match_the_sequence(case, P):
    lay, c0, S = case
    ci = c0 + torch.arange(S)
    a, ends, kind, owner, is_nl = lay.block(ci)
    ent = _block_brute(lay, c0, S)
    start = ent[0][0]
    assert kind.tolist() == [k for _, k, _ in ent]
    assert (owner + c0).tolist() == [c for _, _, c in ent]
    assert is_nl.tolist() == [k == KIND_ROW_END for _, k, _ in ent]
    code_at = {c: i - start for i, k, c in ent if k == KIND_CODE}
    assert a.tolist() == [code_at[c0 + j] for j in range(S)]
    has_end = {c for _, k, c in ent if k == KIND_ROW_END}
    assert ends.tolist() == [c0 + j in has_end for j in range(S)]
    assert lay.stream_positions(ci, owner, is_nl, P).tolist() == [P + i for i, _, _ in ent]


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


@settings(max_examples=100, deadline=None)
@given(_case(), st.integers(1, 4))
def test_feed_places_the_row_ends_and_gives_the_block_at_once(case, P):
    """``ImageLayout.feed``: the codes' ids land where the sequence has them, a forced row end behind each code that
    ends a row; its entries, positions and mask are ``block``'s, ``stream_positions``' and ``entry_mask``'s. Control:
    without a row-end token nothing is inserted."""
    lay, c0, S = case
    ci = c0 + torch.arange(S)
    ids = 100 + ci[None].repeat(2, 1)                     # two rows (a CFG pair), LM ids 100 + k
    m = torch.ones(S, S, dtype=torch.bool).tril()
    cached = _cached_kind(lay, P, c0)
    fed = lay.feed(ci, ids, P, m, cached)
    seq = lay.sequence(100 + torch.arange(lay.num_tokens)).tolist()[len(lay.header):]
    start = seq.index(100 + c0)
    assert fed.ids.tolist() == [seq[start:start + fed.kind.numel()]] * 2
    a, ends, kind, owner, is_nl = lay.block(ci)
    for got, want in zip(fed[1:6], (a, ends, kind, owner, is_nl)):
        assert torch.equal(got, want)
    assert torch.equal(fed.positions, lay.stream_positions(ci, owner, is_nl, P))
    assert torch.equal(fed.mask, entry_mask(m, owner, is_nl, cached))
    plain = lay.feed(ci, ids)                              # default positions, causal mask: nothing more
    assert plain.positions is None and plain.mask is None and torch.equal(plain.ids, fed.ids)
    bare = ImageLayout(lay.height, lay.width, None).feed(ci, ids)     # negative control: no row-end token
    assert torch.equal(bare.ids, ids) and not bare.ends.any()


def test_row_end_after_every_row_and_none_without_token():
    lay = ImageLayout(2, 3, ROW_END)
    _, ends, kind, _, _ = lay.block(torch.arange(6))
    assert ends.tolist() == [False, False, True, False, False, True]
    assert kind.tolist() == [KIND_CODE] * 3 + [KIND_ROW_END] + [KIND_CODE] * 3 + [KIND_ROW_END]
    _, ends, kind, _, _ = ImageLayout(2, 3).block(torch.arange(6))          # negative control
    assert not ends.any() and kind.tolist() == [KIND_CODE] * 6


def _cached_kind(lay: ImageLayout, P: int, n_codes: int) -> torch.Tensor:
    st_ = _stream(lay)
    n = next((i for i, (k, c) in enumerate(st_) if k == KIND_CODE and c == n_codes), len(st_))
    return torch.tensor([KIND_PREFIX] * P + [k for k, _ in st_[:n]], dtype=torch.int8)


@settings(max_examples=150, deadline=None)
@given(_case(), st.integers(1, 4), st.data())
def test_chain_mask_is_causal_over_the_model_stream(case, P, data):
    """A chain block (tril) seeing the last R visible cached entries: the widened mask is plain causal
    attention over the model stream from the R-th last visible cached entry on."""
    lay, c0, S = case
    R = data.draw(st.integers(0, P + c0))
    cached = _cached_kind(lay, P, c0)
    m = torch.cat([torch.ones(S, R, dtype=torch.bool), torch.ones(S, S, dtype=torch.bool).tril()], 1)
    _, _, _, owner, is_nl = lay.block(c0 + torch.arange(S))
    got = entry_mask(m, owner, is_nl, cached)
    C = len(cached)
    vis = [i for i in range(C) if cached[i] != KIND_ROW_END]
    first = vis[-R] if R else C
    n = owner.numel()
    cols = list(range(first, C)) + [C + j for j in range(n)]
    want = torch.tensor([[y <= C + x for y in cols] for x in range(n)], dtype=torch.bool)
    assert got.shape == want.shape and torch.equal(got, want)


def test_tree_mask_siblings_and_own_row_end():
    """Two sibling codes that both end a row (a tree level): each sees itself, not its sibling, and
    neither its own row end (which follows it) nor the sibling's; each row end sees its own code."""
    lay = ImageLayout(2, 2, ROW_END)
    ci = torch.tensor([1, 1])
    _, ends, kind, owner, is_nl = lay.block(ci)
    assert ends.tolist() == [True, True] and owner.tolist() == [0, 0, 1, 1]
    m = torch.eye(2, dtype=torch.bool)
    got = entry_mask(m, owner, is_nl, torch.zeros(0, dtype=torch.int8))
    want = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(got, want)


@settings(max_examples=100, deadline=None)
@given(_case(), st.integers(0, 3), st.data())
def test_visible_cut_drops_codes_with_their_row_ends(case, P, data):
    lay, c0, _ = case
    n_codes = c0 + 1
    kind = _cached_kind(lay, P, n_codes)
    n = data.draw(st.integers(1, P + n_codes))
    cut = visible_cut(kind, n)
    seen = 0
    for i in range(len(kind) - 1, -1, -1):      # walk back: drop n visible entries and what follows them
        if kind[i] != KIND_ROW_END:
            seen += 1
            if seen == n:
                break
    assert cut == i


def test_kept_entries_keep_row_ends_of_kept_codes():
    lay = ImageLayout(3, 2, ROW_END)
    a, ends, _, _, _ = lay.block(torch.arange(1, 5))       # codes 1..4: entries c1 nl c2 c3 nl c4
    assert kept_entries(a, ends, torch.tensor([0, 1, 2])).tolist() == [0, 1, 2, 3, 4]
    assert kept_entries(a, ends, torch.tensor([1])).tolist() == [2]
    assert kept_entries(a, ends, torch.tensor([], dtype=torch.long)).tolist() == []


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
