"""`groupcast`'s layout (`whole_documents`) and what it fetches: equal shards, balanced areas,
documents kept whole where that balances, and fewer rows fetched than a per-document zigzag needs.
Its numbers against the reference come from the gloo gate (tests/test_cp_distributed.py)."""

import pytest

from longca.attention.masks import patterns
from longca.cp import layout as layouts
from longca.cp.blocks import Span, area, restrict
from longca.cp.groupcast import BALANCE_SLACK, needed_rows, whole_documents

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
    assert max(areas) / (sum(areas) / world) < 1.05, areas


@pytest.mark.parametrize("name, per_rank, world", CASES)
def test_it_fetches_fewer_rows_than_per_document_zigzag_needs(name, per_rank, world):
    mask = getattr(patterns, name)(per_rank * world, seed=1)
    ours, zigzag = whole_documents(mask, world), layouts.build("per_document_zigzag", mask, world)
    assert sum(_fetched(mask, ours)) < 0.9 * sum(_fetched(mask, zigzag))


DOCUMENTS = [3000, 500, 9000, 1200, 4000, 7000, 2068, 6000]


def test_without_spreading_short_documents_stay_whole_and_two_ranks_fetch_little():
    mask = patterns.varlen_causal(2 * 16384, seed=1, documents=DOCUMENTS)
    layout = whole_documents(mask, 2, (1.0,))
    owners = {}
    for rank, shard in enumerate(layout.shards):
        for s in shard:
            for t in range(s.start, s.end):
                owners[t] = rank
    starts = [sum(DOCUMENTS[:i]) for i in range(len(DOCUMENTS) + 1)]
    whole = [len({owners[t] for t in range(a, b)}) == 1 for a, b in zip(starts, starts[1:])]
    assert sum(whole) >= 6, whole
    assert max(_fetched(mask, layout)) < 0.1 * 16384


def test_one_threshold_is_kept_when_asked_and_more_spreading_balances_better():
    mask = patterns.varlen_causal(4 * 16384, seed=1)
    loose, tight = whole_documents(mask, 4, (1.0,)), whole_documents(mask, 4, (0.1,))
    spread = lambda lay: max(_areas(mask, lay)) / (sum(_areas(mask, lay)) / 4)
    assert spread(tight) < spread(loose)
    chosen = whole_documents(mask, 4)
    assert spread(chosen) <= BALANCE_SLACK * spread(tight) + 1e-9


@pytest.mark.parametrize("mask", [patterns.causal(1024), patterns.varlen_causal(1024, documents=[1024])])
def test_a_mask_without_several_documents_is_refused_by_name(mask):
    with pytest.raises(ValueError, match=f"whole_documents needs a mask of several documents; '{mask.name}'"):
        whole_documents(mask, 2)
