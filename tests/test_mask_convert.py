"""Conversions (cu_seqlens, mask_mod, block_mask, block_sparsity) against the dense mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longca.attention import mask_convert as mc
from longca.attention.masks import PATTERNS, MaskError, build, from_slices, pattern_params

try:  # the oracles' small parameters; tests/ may or may not be a package
    from tests.test_masks import SMALL
except ImportError:  # pragma: no cover
    from test_masks import SMALL

DOC_PATTERNS = sorted(n for n in PATTERNS if "documents" in pattern_params(n))


def _dense_blocks(dense: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    sq, sk = dense.shape
    nq, nk = -(-sq // bq), -(-sk // bk)
    pad = torch.zeros(nq * bq, nk * bk, dtype=torch.bool)
    pad[:sq, :sk] = dense
    return pad.view(nq, bq, nk, bk).any(3).any(1)


def _mod_dense(mask) -> torch.Tensor:
    mod = mc.mask_mod(mask)
    q = torch.arange(mask.seqlen_q).unsqueeze(1)
    k = torch.arange(mask.seqlen_k).unsqueeze(0)
    return mod(0, 0, q, k)


@pytest.mark.parametrize("name", DOC_PATTERNS)
def test_cu_seqlens(name):
    m = build(name, 1000, seed=1, **SMALL.get(name, {}))
    cu = mc.cu_seqlens(m)
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == 1000
    assert torch.equal(cu.diff(), torch.tensor(m.documents, dtype=torch.int32))


def test_cu_seqlens_needs_documents():
    with pytest.raises(MaskError, match="no documents"):
        mc.cu_seqlens(build("causal", 10))


def test_dense_helper():
    m = build("causal", 7)
    assert torch.equal(mc.dense(m, "cpu"), m.to_dense())


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("n", [1, 257, 1000])
def test_mask_mod_equals_dense(name, n):
    m = build(name, n, seed=2, **SMALL.get(name, {}))
    assert torch.equal(_mod_dense(m), m.to_dense())


def test_row_intervals_k():
    assert mc.row_intervals(build("causal", 100))[0].shape == (1, 100)
    assert mc.row_intervals(build("shared_question", 100, documents=[10, 90]))[0].shape[0] == 2
    lo, hi = mc.row_intervals(build("causal", 100), pad_to=64)
    assert lo.shape == (1, 128) and (lo[:, 100:] == hi[:, 100:]).all()


def test_mask_mod_under_vmap():
    m = build("global_sliding_window", 200, window=9, global_tokens=3)
    mod = mc.mask_mod(m)
    q, k = torch.arange(200), torch.arange(200)
    out = torch.vmap(torch.vmap(lambda qi, ki: mod(0, 0, qi, ki), in_dims=(None, 0)),
                     in_dims=(0, None))(q, k)
    assert torch.equal(out, m.to_dense())


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("n,bq,bk", [(257, 16, 16), (1000, 64, 32), (1000, 128, 128)])
def test_block_sparsity_equals_dense(name, n, bq, bk):
    m = build(name, n, seed=3, **SMALL.get(name, {}))
    blocks, density = mc.block_sparsity(m, bq, bk)
    expected = _dense_blocks(m.to_dense(), bq, bk)
    assert torch.equal(blocks, expected)
    assert density == pytest.approx(expected.float().mean().item())


@st.composite
def valid_slice_lists(draw):
    """Pair-disjoint slice lists by construction: row bands, disjoint key ranges per band."""
    sq, sk = draw(st.integers(1, 40)), draw(st.integers(2, 40))
    cuts = sorted(set(draw(st.lists(st.integers(1, sq - 1), max_size=3)) if sq > 1 else []))
    bounds = [0, *cuts, sq]
    items = []
    for q0, q1 in zip(bounds, bounds[1:]):
        kcuts = sorted(set(draw(st.lists(st.integers(1, sk - 1), max_size=2))))
        kb = [0, *kcuts, sk]
        for k0, k1 in zip(kb, kb[1:]):
            kind = draw(st.sampled_from(["full", "causal", "inv_causal", "bi_causal", None]))
            if kind == "bi_causal" and k1 - k0 < q1 - q0:
                kind = "full"
            if kind is not None:
                items.append([q0, q1, k0, k1, kind])
    if not items:
        items.append([0, sq, 0, sk, "full"])
    return sq, sk, items, draw(st.integers(1, 12)), draw(st.integers(1, 12))


@settings(max_examples=150, deadline=None)
@given(valid_slice_lists())
def test_conversions_on_random_custom_masks(case):
    sq, sk, items, bq, bk = case
    m = from_slices("h", sq, sk, items)
    dense = m.to_dense()
    assert m.area() == int(dense.sum())
    assert torch.equal(_mod_dense(m), dense)
    assert torch.equal(mc.block_sparsity(m, bq, bk)[0], _dense_blocks(dense, bq, bk))


@pytest.mark.parametrize("name,n,block", [
    ("causal", 300, 128),
    ("sliding_window", 256, 64),
    ("varlen_causal", 300, 128),
    ("shared_question", 256, 32),
    ("global_sliding_window", 300, 64),
    ("varlen_block_causal", 256, 64),
])
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_matches_sdpa(name, n, block):
    from torch.nn.attention.flex_attention import flex_attention

    m = build(name, n, seed=1, **SMALL.get(name, {}))
    bm = mc.block_mask(m, block_size=block)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for _ in range(3))
    out = flex_attention(q, k, v, block_mask=bm)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m.to_dense())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


_BLOCK_MASK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                      "q_indices", "full_q_num_blocks", "full_q_indices")


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("n,block", [(1024, 128), (1000, 64), (2048, 128)])
def test_block_mask_is_what_create_block_mask_makes_of_the_mask_mod(name, n, block, monkeypatch):
    """Built from the row table without compiling, tile by tile: the same partial and full tiles in
    the same order as torch's own create_block_mask over the same mask_mod (a band at a time too)."""
    from torch.nn.attention.flex_attention import create_block_mask

    monkeypatch.setattr(mc, "TILE_BAND_ELEMENTS", 3 * block * 128 * block)  # several bands per mask
    m = build(name, n, seed=2, **SMALL.get(name, {}))
    mc.clear_block_mask_cache()
    ours = mc.block_mask(m, block_size=block)
    theirs = create_block_mask(mc.mask_mod(m), None, None, n, n, device="cpu", BLOCK_SIZE=block)
    for field in _BLOCK_MASK_FIELDS:
        torch.testing.assert_close(getattr(ours, field), getattr(theirs, field), rtol=0, atol=0, msg=field)
    assert ours.seq_lengths == theirs.seq_lengths and ours.BLOCK_SIZE == theirs.BLOCK_SIZE


def test_block_mask_is_cached_on_slices():
    mc.clear_block_mask_cache()
    small = SMALL["varlen_causal"]
    a = mc.block_mask(build("varlen_causal", 256, seed=4, **small), block_size=64)
    b = mc.block_mask(build("varlen_causal", 256, seed=4, **small), block_size=64)
    c = mc.block_mask(build("varlen_causal", 256, seed=5, **small), block_size=64)
    assert a is b and a is not c
    assert mc.mask_key(build("causal", 8)) == mc.mask_key(build("causal", 8, seed=3))


@pytest.mark.parametrize("call,match", [
    (lambda: mc.block_mask(build("causal", 8), block_size=0), "block_size"),
    (lambda: mc.block_sparsity(build("causal", 8), 0, 4), "block_q"),
    (lambda: mc.block_sparsity(build("causal", 8), 4, -1), "block_k"),
])
def test_bad_block_sizes(call, match):
    with pytest.raises(MaskError, match=match):
        call()


def test_block_sparsity_at_128k():
    m = build("varlen_block_causal", 128 * 1024, seed=0)
    blocks, density = mc.block_sparsity(m, 128, 128)
    assert blocks.shape == (1024, 1024) and 0 < density < 0.5
    full, dens_full = mc.block_sparsity(build("causal", 128 * 1024), 128, 128)
    assert dens_full == pytest.approx((1024 * 1025 / 2) / 1024**2)
