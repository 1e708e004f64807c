"""The gate's mask keeps the full-size mask's structure: never full or causal unless the pattern is."""

import pytest
import torch

from longca.attention import masks
from longca.attention.masks import gate

SEQLENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
GATES = [64, 256, 1024]
PLAIN = {"full", "causal"}


def _gate_mask(pattern: str, seqlen: int, n: int, seed: int = 1, **params):
    full_size = masks.build(pattern, seqlen, seed=seed, **params)
    return full_size, masks.build(pattern, n, seed=seed, **gate.gate_params(pattern, full_size, n))


@pytest.mark.parametrize("n", GATES)
@pytest.mark.parametrize("pattern", sorted(set(masks.PATTERNS) - PLAIN))
def test_no_pattern_is_gated_as_full_or_causal(pattern, n):
    full_dense = masks.full(n).to_dense()
    causal_dense = masks.causal(n).to_dense()
    for seqlen in SEQLENS:
        if seqlen < n:
            continue
        _, gated = _gate_mask(pattern, seqlen, n)
        dense = gated.to_dense()
        assert gated.seqlen_q == n
        assert not torch.equal(dense, full_dense), (pattern, seqlen, n, dict(gated.params))
        assert not torch.equal(dense, causal_dense), (pattern, seqlen, n, dict(gated.params))
        assert gated.area() not in (masks.full(n).area(), masks.causal(n).area())


@pytest.mark.parametrize("pattern", sorted(masks.DOCUMENT_PATTERNS))
def test_documents_are_several_with_a_boundary_inside_a_tile(pattern):
    for seqlen in SEQLENS:
        _, gated = _gate_mask(pattern, seqlen, 1024)
        docs = gated.documents
        assert len(docs) >= gate.MIN_DOCUMENTS, (pattern, seqlen, docs)
        edges = [sum(docs[:k]) for k in range(1, len(docs))]
        assert any(e % 64 for e in edges), (pattern, seqlen, edges)


def test_documents_follow_the_full_size_mask_when_it_has_enough():
    full_size = masks.build("varlen_causal", 131072, seed=1)
    docs = gate.gate_documents(full_size, 1024)
    assert sum(docs) == 1024 and len(docs) >= gate.MIN_DOCUMENTS
    # Scaled boundaries: each gate boundary is a full-size boundary times 1024 / 131072, rounded.
    full_edges = {round(sum(full_size.documents[:k]) / 128) for k in range(1, len(full_size.documents))}
    assert {sum(docs[:k]) for k in range(1, len(docs))} <= full_edges


def test_lengths_are_scaled_then_kept_inside_the_shape():
    full_size = masks.build("sliding_window", 131072, window=8192)
    assert gate.gate_params("sliding_window", full_size, 1024) == {"window": 64}      # 8192 / 128
    clamped = masks.build("sliding_window", 1024)                                      # window 1023: full
    assert gate.gate_params("sliding_window", clamped, 1024) == {"window": 256}       # a quarter
    tiny = masks.build("sliding_window_causal", 131072, window=16)
    assert gate.gate_params("sliding_window_causal", tiny, 1024) == {"window": 16}    # a 64th


def test_plain_patterns_stay_plain():
    for pattern in PLAIN:
        full_size, gated = _gate_mask(pattern, 8192, 1024)
        assert gate.gate_params(pattern, full_size, 1024) == {}
        assert torch.equal(gated.to_dense(), masks.build(pattern, 1024).to_dense())


def test_custom_and_block_sparse_keep_their_own_parameters():
    slices = [[0, 2, 0, 2, "causal"], [2, 4, 0, 4, "full"]]
    full_size, gated = _gate_mask("custom", 4096, 256, slices=slices)
    assert gated.params["base_seqlen"] == 4 and gated.params["slices"] == full_size.params["slices"]
    full_size, gated = _gate_mask("block_sparse", 8192, 1024, block=128, density=0.3)
    assert gated.params["block"] == 128 and gated.params["density"] == 0.3
