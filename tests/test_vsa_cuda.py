"""VSA's CUDA kernel (longca/kernels/vsa_cuda.py) on the CPU, through a stand-in of the library's
autograd op ``block_sparse_attn_sm90`` that follows the C++ checks of ``block_sparse_h100.cu``
(one sequence, key heads dividing the query heads forward; as many key heads as query heads for a
backward, whose inverted lists are per query head): the forward is GQA native and exact, a
backward cell expands K and V and is exact; what the kernel cannot take (batch, head dim, dtype,
tiles, other masks) is refused naming why; a fastvideo-kernel without the ThunderKittens extension
says how to build it."""

import itertools

import pytest
import torch
from stand_in import assert_matches_reference, fresh_adapter, head_block_problem, install_library

from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.cell import CellSpec, run_cell

TILE = 64
CALLS = []


def _stand_in_sm90(q, k, v, q2k_idx, q2k_num, tile_sizes):
    b, hq, s, d = q.shape
    hk = k.shape[1]
    assert b == 1 and hq % hk == 0 and tile_sizes.tolist() == [TILE] * (s // TILE)
    assert q2k_idx.shape[:3] == (b, hq, s // TILE) and q2k_num.shape == (b, hq, s // TILE)
    if torch.is_grad_enabled() and q.requires_grad:
        assert hk == hq, "k2q_block_sparse_index heads dimension - idx 1 - must match for all inputs"
    CALLS.append(hk)
    allowed = torch.zeros(b, hq, s // TILE, s // TILE, dtype=torch.bool)
    for index in itertools.product(range(b), range(hq), range(s // TILE)):
        allowed[index][q2k_idx[index][:q2k_num[index]].long()] = True
    allowed = allowed.repeat_interleave(TILE, 2).repeat_interleave(TILE, 3)
    k, v = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
    scores = (q @ k.transpose(-1, -2)) / d ** 0.5
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return probs @ v, torch.logsumexp(scores, dim=-1, keepdim=True)


@pytest.fixture
def vsa(monkeypatch):
    CALLS.clear()
    install_library(monkeypatch, "fastvideo_kernel._C.fastvideo_kernel_ops", block_sparse_fwd=object(),
                    block_sparse_bwd=object())
    install_library(monkeypatch, "fastvideo_kernel.block_sparse_attn", block_sparse_attn_sm90=_stand_in_sm90)
    return fresh_adapter("vsa_cuda")


def _problem(block=64, variable_unit=None, **over):
    return head_block_problem(block, variable_unit, **{"seed": 3, **over})


@pytest.mark.parametrize("block, variable_unit", [(64, None), (128, None), (128, 64)])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_forward_is_gqa_native_and_a_backward_expands_kv_both_exact(vsa, block, variable_unit, direction):
    problem = _problem(block, variable_unit, direction=direction)
    prepared = vsa.prepare(problem)
    assert prepared["kv_expanded"] is (direction == "bwd")
    q, k, v, grad_out = problem.make_inputs(requires_grad=direction == "bwd")
    out = vsa.forward(q, k, v, prepared)
    assert CALLS == [4 if direction == "bwd" else 2]    # key heads handed to the kernel
    assert_matches_reference(out, q, k, v, grad_out, problem.mask, backward=direction == "bwd")


def test_what_the_kernel_cannot_take_is_refused_naming_why(vsa):
    assert "takes one sequence" in vsa.supports_mask(_problem(batch=2, head_dim=64))
    assert "head dims 64, 128, not 8" in vsa.supports_mask(_problem(head_dim=8))
    assert "64-token tiles" in vsa.supports_mask(_problem(32, head_dim=64))
    assert "block_sparse_heads" in vsa.supports_mask(Problem.from_spec(ProblemSpec(mask="causal", seqlen=128)))
    assert vsa.supports_mask(_problem(head_dim=128)) is None
    assert vsa.dtypes == (torch.bfloat16,)


def test_a_fastvideo_kernel_without_its_thunderkittens_extension_says_how_to_build_it(monkeypatch):
    install_library(monkeypatch, "fastvideo_kernel.block_sparse_attn", block_sparse_attn_sm90=_stand_in_sm90)
    from longca import kernels

    reason = type(kernels.get("vsa_cuda"))().available()
    assert "fastvideo_kernel._C.fastvideo_kernel_ops is not importable" in reason
    assert "build_kernels.sh OUT_DIR vsa_cuda" in reason
    install_library(monkeypatch, "fastvideo_kernel._C.fastvideo_kernel_ops", sta_fwd=object())
    reason = type(kernels.get("vsa_cuda"))().available()
    assert "no block_sparse_fwd, block_sparse_bwd" in reason and "without its ThunderKittens" in reason


def test_without_the_library_a_cell_is_unsupported_and_says_what_to_build():
    row = run_cell(CellSpec(kernel="vsa_cuda", mask="sparse", pattern="block_sparse_heads", seqlen=512,
                            dtype="bfloat16", heads_q=4, heads_kv=2, head_dim=128, gate_seqlen=256,
                            mask_params={"kept": 0.3, "block": 64, "heads": 2, "group": 2}))
    assert row["status"] == "unsupported"
    assert "is not importable" in row["reason"] and "vsa_cuda" in row["reason"]
