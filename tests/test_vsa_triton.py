"""The VSA adapter (longca/kernels/vsa_triton.py) on the CPU: a per-head block pattern becomes VSA's
per-head lists of kept 64-token key tiles exactly, and the adapter's call through a stand-in library
that follows VSA's semantics (each query tile attends the key tiles listed for it, key heads as many
as query heads) is exact per-head attention, forward and gradients; without the library the cell
is `unsupported`, saying what to install."""

import itertools

import pytest
import torch
from stand_in import assert_matches_reference, fresh_adapter, head_block_problem, install_library

from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.cell import CellSpec, run_cell

TILE = 64


def _stand_in_vsa(q, k, v, q2k_idx, q2k_num, tile_sizes):
    """VSA's ``block_sparse_attn_triton`` in plain torch: q, k, v (batch, heads, tokens, d) with as many
    key heads as query heads; query tile i of head h attends the key tiles q2k_idx[b, h, i, :q2k_num]."""
    b, h, s, d = q.shape
    assert k.shape == q.shape and tile_sizes.tolist() == [TILE] * (s // TILE)
    allowed = torch.zeros(b, h, s // TILE, s // TILE, dtype=torch.bool)
    for index in itertools.product(range(b), range(h), range(s // TILE)):
        allowed[index][q2k_idx[index][:q2k_num[index]].long()] = True
    allowed = allowed.repeat_interleave(TILE, 2).repeat_interleave(TILE, 3)
    scores = (q @ k.transpose(-1, -2)) / d ** 0.5
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return probs @ v, torch.logsumexp(scores, dim=-1)


@pytest.fixture
def vsa(monkeypatch):
    install_library(monkeypatch, "fastvideo_kernel.block_sparse_attn", block_sparse_attn_triton=_stand_in_vsa)
    return fresh_adapter("vsa_triton")


def _problem(block, variable_unit=None, **over):
    return head_block_problem(block, variable_unit, **{"seed": 2, "batch": 2, **over})


@pytest.mark.parametrize("block, variable_unit", [(64, None), (128, None), (128, 64)])
def test_each_query_heads_kept_tiles_reach_vsa_and_give_exact_attention(vsa, block, variable_unit):
    problem = _problem(block, variable_unit)
    prepared = vsa.prepare(problem)
    assert prepared["q2k_idx"].shape[:3] == (1, 4, 512 // TILE) and prepared["kv_expanded"] is True
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    out = vsa.forward(q, k, v, prepared)
    assert_matches_reference(out, q, k, v, grad_out, problem.mask)


def test_blocks_vsa_cannot_tile_and_other_masks_are_refused(vsa):
    assert "64-token tiles; the pattern's tiles are multiples of 32 tokens" in vsa.supports_mask(_problem(32))
    assert "multiples of 32 tokens" in vsa.supports_mask(_problem(128, variable_unit=32))
    assert "block_sparse_heads" in vsa.supports_mask(Problem.from_spec(ProblemSpec(mask="causal", seqlen=128)))


def test_without_the_library_a_cell_is_unsupported_and_says_what_to_install():
    row = run_cell(CellSpec(kernel="vsa_triton", mask="sparse", pattern="block_sparse_heads", seqlen=512,
                            dtype="bfloat16", heads_q=4, heads_kv=2, gate_seqlen=256,
                            mask_params={"kept": 0.3, "block": 64, "heads": 2, "group": 2}))
    assert row["status"] == "unsupported"
    assert "is not importable" in row["reason"] and "fastvideo-kernel" in row["reason"]
