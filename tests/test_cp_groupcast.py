"""`groupcast`'s layout (`whole_documents`) and what it fetches: equal shards, balanced areas,
documents kept whole where that balances, and fewer rows fetched than a per-document zigzag needs.
Its numbers against the reference come from the gloo gate (tests/test_cp_distributed.py)."""

import pytest

from longca.attention.masks import patterns
from longca.cp import layout as layouts
from longca.cp.blocks import Span, area, restrict
from longca.cp.blocks import merge_slices
from longca.cp.groupcast import BALANCE_TOLERANCE, needed_rows, whole_documents

# The documents the published GPU grid draws (config/gpu.yaml's default histogram), at a few
# shard counts and lengths; seed 1 as the published CP cells.
CASES = [(name, per_rank, world) for name in ("varlen_causal", "varlen_full", "shared_question")
         for per_rank, world in ((8192, 2), (8192, 4), (16384, 4), (8192, 8))]


def _areas(mask, layout):
    everything = (Span(0, mask.seqlen_k, 0),)
    return [area(restrict(mask, shard, everything)) for shard in layout.shards]


def _fetched(mask, layout):
    needs = needed_rows(mask, layout)
    return [sum(b - a for s in range(layout.world) for a, b in needs[r][s]) for r in range(layout.world)]


@pytest.mark.parametrize("name, per_rank, world", CASES)
def test_shards_are_equal_cover_every_token_once_and_balance_area(name, per_rank, world):
    mask = getattr(patterns, name)(per_rank * world, seed=1)
    layout = whole_documents(mask, world)
    held = sorted(t for shard in layout.shards for s in shard for t in range(s.start, s.end))
    assert held == list(range(mask.seqlen_q))
    assert layout.padding == 0 and layout.shard_len == per_rank
    areas = _areas(mask, layout)
    assert max(areas) / (sum(areas) / world) < 1.05, areas  # (the tolerance itself: below)


@pytest.mark.parametrize("name, per_rank, world", CASES)
def test_it_fetches_fewer_rows_than_per_document_zigzag_needs(name, per_rank, world):
    mask = getattr(patterns, name)(per_rank * world, seed=1)
    ours, zigzag = whole_documents(mask, world), layouts.build("per_document_zigzag", mask, world)
    assert sum(_fetched(mask, ours)) < 0.9 * sum(_fetched(mask, zigzag))


DOCUMENTS = [3000, 500, 9000, 1200, 4000, 7000, 2068, 6000]


def _cut_documents(mask, layout) -> int:
    """Documents whose tokens are on more than one rank."""
    owner = {}
    for rank, shard in enumerate(layout.shards):
        for s in shard:
            owner.update((t, rank) for t in range(s.start, s.end))
    starts = [sum(mask.documents[:i]) for i in range(len(mask.documents) + 1)]
    return sum(len({owner[t] for t in range(a, b)}) > 1 for a, b in zip(starts, starts[1:]))


def test_two_ranks_keep_most_documents_whole_and_fetch_little():
    mask = patterns.varlen_causal(2 * 16384, seed=1, documents=DOCUMENTS)
    layout = whole_documents(mask, 2)
    assert _cut_documents(mask, layout) <= 3
    assert max(_fetched(mask, layout)) <= 0.25 * 16384
    areas = _areas(mask, layout)
    assert max(areas) <= BALANCE_TOLERANCE * sum(areas) / 2


@pytest.mark.parametrize("name, per_rank, world", CASES)
def test_rebalancing_reaches_its_tolerance_and_cuts_fewer_documents_than_zigzag(name, per_rank, world):
    mask = getattr(patterns, name)(per_rank * world, seed=1)
    layout = whole_documents(mask, world)
    areas = _areas(mask, layout)
    assert max(areas) <= BALANCE_TOLERANCE * sum(areas) / world
    assert _cut_documents(mask, layout) < len(mask.documents) == \
        _cut_documents(mask, layouts.build("per_document_zigzag", mask, world))


def test_a_document_longer_than_the_threshold_is_spread_by_zigzag():
    mask = patterns.varlen_causal(16384, seed=1, documents=[6000] + [1000] * 10 + [384])

    def owner_changes(layout) -> int:  # inside the 6000-token document
        owner = {t: r for r, shard in enumerate(layout.shards) for s in shard for t in range(s.start, s.end)}
        return sum(owner[t] != owner[t + 1] for t in range(5999))

    assert owner_changes(whole_documents(mask, 2, spread_above=0.5)) == 2  # head and tail on one rank
    assert owner_changes(whole_documents(mask, 2)) <= 1                    # whole, or cut once


@pytest.mark.parametrize("mask", [patterns.causal(1024), patterns.varlen_causal(1024, documents=[1024])])
def test_a_mask_without_several_documents_is_refused_by_name(mask):
    with pytest.raises(ValueError, match=f"whole_documents needs a mask of several documents; '{mask.name}'"):
        whole_documents(mask, 2)


def _pattern(slices, rows: int, cols: int):
    import torch

    allowed = torch.zeros(rows, cols, dtype=torch.bool)
    for s in slices:
        allowed[s.q_start:s.q_end, s.k_start:s.k_end] |= s.dense()
    return allowed


@pytest.mark.parametrize("name", ["varlen_causal", "varlen_full", "shared_question", "causal", "sliding_window_causal"])
@pytest.mark.parametrize("world", [2, 4])
def test_merged_slices_attend_exactly_the_same_pairs_in_fewer_slices(name, world):
    mask = (patterns.sliding_window_causal(2048 * world, window=300) if name == "sliding_window_causal"
            else getattr(patterns, name)(2048 * world, seed=1))
    plans = [layouts.build("auto", mask, world)]
    if mask.documents is not None and len(mask.documents) > 1:
        plans.append(whole_documents(mask, world))
    before = after = 0
    for layout in plans:
        for r in range(world):
            for s in range(world):
                block = restrict(mask, layout.shards[r], layout.shards[s])
                merged = merge_slices(block)
                n = layout.shard_len
                assert (_pattern(merged, n, n) == _pattern(block, n, n)).all(), (layout.name, r, s)
                before, after = before + len(block), after + len(merged)
    assert after < before


@pytest.mark.parametrize("name", ["varlen_causal", "varlen_full"])
def test_a_ranks_own_block_of_a_document_mask_has_disjoint_query_ranges_once_merged(name):
    """So FFA writes it without atomics (longca.cp.fused)."""
    from longca.cp.fused import ranges_disjoint

    mask = getattr(patterns, name)(4 * 16384, seed=1)
    layout = whole_documents(mask, 4)
    for shard in layout.shards:
        own = merge_slices(restrict(mask, shard, shard))
        assert ranges_disjoint([(x.q_start, x.q_end) for x in own])
