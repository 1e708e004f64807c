"""CP machinery without a process group: block restriction, layouts, the guarded LSE merge, pieces."""

import random

import pytest
import torch

from longca.attention import masks
from longca.attention.masks import AttnMask
from longca.cp import layout as layouts
from longca.cp.blocks import Span, restrict
from longca.cp.local import BlockAttention, merge_into, to_pieces

PATTERNS = ["full", "causal", "sliding_window", "sliding_window_causal", "varlen_full", "varlen_causal",
            "shared_question", "causal_blockwise", "prefix_lm_causal", "prefix_lm_varlen",
            "global_sliding_window", "varlen_block_causal"]
PARAMS = {"sliding_window": {"window": 23}, "sliding_window_causal": {"window": 31},
          "global_sliding_window": {"window": 17, "global_tokens": 5}, "varlen_block_causal": {"block": 16}}
DOCS = {"histogram": {"edges": [8, 24, 90], "weights": [1, 1]}}


def _mask(name: str, seqlen: int, seed: int) -> AttnMask:
    params = dict(PARAMS.get(name, {}))
    if name in masks.DOCUMENT_PATTERNS and name != "varlen_block_causal":
        params.update(DOCS)
    return masks.build(name, seqlen, seed=seed, **params)


def _dense(slices, lq, lk):
    return AttnMask("block", lq, lk, tuple(slices)).to_dense()


def _random_spans(seqlen: int, rng: random.Random):
    cuts = sorted(rng.sample(range(1, seqlen), rng.randint(1, 6)))
    ranges = list(zip([0] + cuts, cuts + [seqlen]))
    rng.shuffle(ranges)
    take = ranges[: rng.randint(1, len(ranges))]
    spans, off = [], 0
    for a, b in take:
        spans.append(Span(a, b, off))
        off += b - a
    return tuple(spans), off


@pytest.mark.parametrize("name", PATTERNS)
def test_restrict_equals_dense_submatrix(name):
    """Any query spans × key spans: the restricted slices are exactly the dense mask's sub-block."""
    rng = random.Random(name)
    for seed in range(3):
        seqlen = rng.choice([96, 130, 257])
        mask = _mask(name, seqlen, seed)
        dense = mask.to_dense()
        for _ in range(6):
            qs, lq = _random_spans(seqlen, rng)
            ks, lk = _random_spans(seqlen, rng)
            q_idx = torch.cat([torch.arange(s.start, s.end) for s in qs])
            k_idx = torch.cat([torch.arange(s.start, s.end) for s in ks])
            got = restrict(mask, qs, ks)
            assert torch.equal(_dense(got, lq, lk), dense[q_idx][:, k_idx]), (name, seed, qs, ks)
            masks.check_disjoint(got)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "per_document_zigzag"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_layouts_partition_the_sequence(layout, world):
    mask = _mask("varlen_causal", 203, 1)
    lay = layouts.build(layout, mask, world)
    x = torch.randn(1, 203, 2, 3)
    shards = [lay.dispatch(x, r) for r in range(world)]
    assert all(s.shape[1] == lay.shard_len for s in shards)
    assert torch.equal(lay.assemble(shards), x)
    covered = torch.cat([lay.index(r) for r in range(world)])
    assert sorted(covered[covered >= 0].tolist()) == list(range(203))


def test_zigzag_balances_causal_work():
    mask = masks.build("causal", 4096)
    for world in (2, 4, 8):
        lay = layouts.build("zigzag", mask, world)
        every = lay.concatenated(range(world))
        areas = [sum(s.area() for s in restrict(mask, lay.shards[r], every)) for r in range(world)]
        assert sum(areas) == mask.area()
        assert max(areas) / min(areas) < 1.01
        contiguous = layouts.build("contiguous", mask, world)
        every_c = contiguous.concatenated(range(world))
        areas_c = [sum(s.area() for s in restrict(mask, contiguous.shards[r], every_c)) for r in range(world)]
        assert max(areas_c) / min(areas_c) > 2  # the imbalance zigzag removes


def test_per_document_zigzag_balances_packed_documents():
    mask = masks.build("varlen_causal", 8192, seed=2, histogram={"edges": [256, 1024, 4096], "weights": [1, 2]})
    assert len(mask.documents) > 2
    world = 4
    areas = {}
    for name in ("contiguous", "per_document_zigzag"):
        lay = layouts.build(name, mask, world)
        every = lay.concatenated(range(world))
        areas[name] = [sum(s.area() for s in restrict(mask, lay.shards[r], every)) for r in range(world)]
        assert sum(areas[name]) == mask.area()
    spread = {k: max(v) / min(v) for k, v in areas.items()}
    assert spread["per_document_zigzag"] < 1.05 < spread["contiguous"]


def test_merge_guards_rows_without_keys():
    acc_out = torch.zeros(1, 1, 3, 2)
    acc_lse = torch.full((1, 1, 3), float("-inf"))
    out = torch.tensor([[[[1.0, 2.0], [0.0, 0.0], [5.0, 6.0]]]])
    lse = torch.tensor([[[0.5, float("-inf"), 1.0]]])
    merge_into(acc_out, acc_lse, out, lse)
    merge_into(acc_out, acc_lse, torch.full_like(out, 3.0), torch.tensor([[[0.5, float("-inf"), float("-inf")]]]))
    assert torch.isfinite(acc_out).all()
    assert torch.allclose(acc_out[0, 0, 0], torch.tensor([2.0, 2.5]))   # equal weights
    assert torch.equal(acc_out[0, 0, 1], torch.zeros(2)) and acc_lse[0, 0, 1] == float("-inf")
    assert torch.allclose(acc_out[0, 0, 2], torch.tensor([5.0, 6.0]))


@pytest.mark.parametrize("calls", ["auto", "pieces"])
@pytest.mark.parametrize("kernel", ["sdpa_math", "sdpa_flash"])
def test_block_attention_pieces_match_reference(kernel, calls):
    """A whole mask as one block, as one call (``auto``: a dense mask on the CPU) or as pieces +
    merge: both reproduce the exact reference, forward and backward."""
    from longca.attention import reference
    from longca.cp.local import FusedBlock

    torch.manual_seed(0)
    for name in ("causal", "sliding_window", "varlen_causal", "global_sliding_window"):
        mask = _mask(name, 100, 0)
        block = BlockAttention(kernel, torch.device("cpu"), 4, 2, 8, calls=calls)
        assert block.calls == ("fused" if calls == "auto" else "pieces")
        spans = (Span(0, 100, 0),)
        pieces = block.pieces(restrict(mask, spans, spans))
        assert isinstance(pieces, FusedBlock) == (calls == "auto")
        q, k, v, do = (torch.randn(1, 100, h, 8, dtype=torch.float64) for h in (4, 2, 2, 4))
        acc = block.new_accumulators(q)
        block.forward(q, k, v, pieces, acc)
        out, lse = block.finish(acc, q.dtype)
        ref, ref_lse = reference.attention(q, k, v, mask, return_lse=True)
        assert torch.allclose(out, ref, atol=1e-6), name
        dq = block.new_dq(q)
        dk, dv = block.backward(do, q, k, v, out, block.backward_lse(lse), pieces, dq)
        qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
        rg = torch.autograd.grad(reference.attention(qr, kr, vr, mask), (qr, kr, vr), do)
        for got, want in zip((block.dq_result(dq, torch.float64), dk, dv), rg):
            assert torch.allclose(got.double(), want, atol=1e-5), name


def test_flash_without_mask_tensor_is_unsupported_for_diagonal_pieces():
    from longca.attention.masks import AttnSlice
    from longca.cp.base import Unsupported

    with pytest.raises(Unsupported, match="bi_causal"):
        to_pieces([AttnSlice(0, 4, 0, 8, "bi_causal")], frozenset({"full", "causal"}), "sdpa_flash")


def test_block_rows_that_attend_nothing_get_no_weight_when_fused():
    """A block whose first rows attend no key (a ring step's off-diagonal block of a causal mask):
    the one-call path gives them LSE -inf and a zero output, so merging it changes nothing there."""
    from longca.attention.masks import AttnSlice

    block = BlockAttention("sdpa_flash", torch.device("cpu"), 2, 1, 4)
    pieces = block.pieces([AttnSlice(4, 8, 0, 4, "full")])
    q, k, v = torch.randn(1, 8, 2, 4), torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4)
    acc = block.new_accumulators(q)
    block.forward(q, k, v, pieces, acc)
    out, lse = block.finish(acc, torch.float32)   # (b, s, h, d), (b, h, s)
    assert torch.isneginf(lse[..., :4]).all() and torch.isfinite(lse[..., 4:]).all()
    assert torch.equal(out[:, :4], torch.zeros_like(out[:, :4])) and torch.isfinite(out).all()


def test_auto_local_kernel_is_the_first_available_and_an_unknown_calls_value_is_refused():
    from longca.cp.local import AUTO_LOCAL_KERNELS, resolve_local_kernel

    assert resolve_local_kernel("auto", torch.device("cpu")) == AUTO_LOCAL_KERNELS["cpu"][0]
    assert resolve_local_kernel("sdpa_math", torch.device("cpu")) == "sdpa_math"
    with pytest.raises(ValueError, match="local_calls 'one'"):
        BlockAttention("sdpa_math", torch.device("cpu"), 2, 1, 4, calls="one")
