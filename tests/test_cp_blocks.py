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


@pytest.mark.parametrize("calls", ["auto", "pieces"])
def test_a_first_block_lands_in_an_unset_buffer_without_its_old_contents_leaking(calls):
    """The output accumulator is not zeroed up front (a one-call kernel writes the first block
    whole); every other first block must zero it first.  Here it starts as NaN, as unset memory can."""
    from longca.attention import reference

    mask = _mask("varlen_causal", 64, 1)
    block = BlockAttention("sdpa_math", torch.device("cpu"), 4, 2, 8, calls=calls)
    spans = (Span(0, 64, 0),)
    pieces = block.pieces(restrict(mask, spans, spans))
    q, k, v = (torch.randn(1, 64, h, 8, dtype=torch.float64) for h in (4, 2, 2))
    acc = block.new_accumulators(q)
    acc.out.fill_(float("nan"))
    block.forward(q, k, v, pieces, acc)
    out, _ = block.finish(acc, q.dtype)
    assert torch.allclose(out, reference.attention(q, k, v, mask), atol=1e-6)
    untouched = block.new_accumulators(q)       # a rank no block reached: zeros, LSE -inf
    untouched.out.fill_(float("nan"))
    out, lse = block.finish(untouched, q.dtype)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def _stand_in_ffa_forward(calls):
    """MagiAttention's ``_flex_flash_attn_forward`` as its code describes it, in plain torch on packed
    ``(tokens, heads, d)``: atomic mode corrects what ``out``/``lse`` hold by their LSE and adds the
    block; plain mode (``disable_fwd_atomic_reduction``) requires disjoint query ranges and writes
    the block, zero-filling rows whose LSE stays -inf (its post-process).  Records each call's mode."""
    from tests.test_magi_ffa import ffa_dense

    def forward(q, k, v, out, lse, q_ranges, k_ranges, attn_type_map, softmax_scale,
                disable_fwd_atomic_reduction, **_):
        from longca.cp.fused import ranges_disjoint

        calls.append("plain" if disable_fwd_atomic_reduction else "atomic")
        allowed = ffa_dense(q_ranges.tolist(), k_ranges.tolist(), attn_type_map.tolist(), q.shape[0], k.shape[0])
        group = q.shape[1] // k.shape[1]
        kx, vx = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.double(), kx.double()) * softmax_scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        block_lse = torch.logsumexp(scores, -1)                                  # (h, q)
        probs = torch.exp(scores - block_lse.unsqueeze(-1)).nan_to_num(0.0)
        block_out = torch.einsum("hqk,khd->qhd", probs, vx.double()).float()
        block_lse = block_lse.transpose(0, 1).float()                             # (q, h)
        if disable_fwd_atomic_reduction:
            assert ranges_disjoint(q_ranges.tolist()), "plain writes need disjoint query ranges"
            out.copy_(torch.where(torch.isneginf(block_lse).unsqueeze(-1), 0.0, block_out))
            lse.copy_(block_lse)
        else:
            merge_into(out.permute(1, 0, 2), lse.transpose(0, 1), block_out.permute(1, 0, 2), block_lse.transpose(0, 1))
    return forward


@pytest.mark.parametrize("name, first_plain", [("varlen_causal", True), ("causal", True),
                                               ("shared_question", False)])
def test_ffa_writes_a_ranks_first_block_without_atomics_when_its_query_ranges_are_disjoint(name, first_plain):
    """A rank's query shard against two key shards, as a ring step does, through FfaBlockOps with a
    stand-in for FFA's forward: the first block is written plainly into the unset buffer (its query
    ranges disjoint), the second reduced atomically; shared_question's rows attend two slices, so its
    first block zeroes the buffer and reduces.  The result is exact attention on the shard."""
    import types

    from longca.attention import reference
    from longca.cp.fused import FfaBlockOps
    from longca.cp.local import Accumulators

    calls: list[str] = []
    ops = FfaBlockOps(types.SimpleNamespace(_flex_flash_attn_forward=_stand_in_ffa_forward(calls),
                                            _flex_flash_attn_backward=None))
    mask = _mask(name, 96, 2)
    mine, theirs = Span(48, 96, 0), Span(0, 48, 0)
    q, k, v = (torch.randn(1, 96, h, 8) for h in (4, 2, 2))
    acc = Accumulators.unset((1, 48, 4, 8), q.device)
    acc.out.fill_(float("nan"))
    for spans in ((theirs,), (mine,)):
        k_shard = torch.cat([k[:, s.start:s.end] for s in spans], 1)
        v_shard = torch.cat([v[:, s.start:s.end] for s in spans], 1)
        slices = [s for s in restrict(mask, (mine,), spans) if s.area() > 0]
        ops.forward_into(q[:, 48:], k_shard, v_shard, ops.prepare(slices, q.device), 8 ** -0.5, acc)
    assert calls == ["plain" if first_plain else "atomic", "atomic"]
    out, _ = acc.result()
    ref = reference.attention(q.double(), k.double(), v.double(), mask)[:, 48:]
    assert torch.allclose(out.double(), ref, atol=1e-5)


def _rank_areas(strategy: str, mask, world: int, heads_q: int, heads_kv: int) -> list[int]:
    """Each rank's ``rank_area`` from the strategy's own ``plan``, rank by rank on torch's fake process
    group (collectives are no-ops; planning runs none that matter)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from longca import cp
    from longca.cp import sequence_parallel

    areas = []
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        sequence_parallel._groups.cache_clear()  # groups of the process group just destroyed
        try:
            strategy_ = cp.build(strategy, None, {})
            strategy_.plan(mask, heads_q, heads_kv, 16, torch.device("cpu"), torch.float32)
            areas.append(strategy_.rank_area)
        finally:
            dist.destroy_process_group()
            sequence_parallel._groups.cache_clear()
    return areas


@pytest.mark.parametrize("strategy", ["ulysses", "usp"])
@pytest.mark.parametrize("world", [2, 3, 4, 6])
@pytest.mark.parametrize("name, params", [("causal", {}), ("full", {}), ("sliding_window_causal", {"window": 40}),
                                          ("varlen_causal", {"histogram": {"edges": [16, 48, 160],
                                                                           "weights": [1, 1]}})])
def test_the_areas_of_a_sequence_parallel_rows_ranks_sum_to_the_masks(strategy, world, name, params):
    """A rank computes 1/U of its Ulysses group's heads: its area is an integer share of the group's,
    none lost to rounding, also where U does not divide the group's area (390 tokens on 4 or 6 ranks)."""
    mask = masks.build(name, 390, seed=3, **params)
    areas = _rank_areas(strategy, mask, world, 24, 12)
    assert sum(areas) == mask.area(), areas
