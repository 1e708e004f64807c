"""The FlashInfer adapter (longca/kernels/flashinfer_block_sparse.py) on the CPU: a per-head block
pattern reaches FlashInfer's variable-block-sparse wrapper as its per-KV-head block map with the
pattern's block sizes, and the adapter's call through a stand-in wrapper that follows the library's
documented semantics (head-major tensors, query head h reads KV head h // group, block (i, j) of KV
head g attended where the map says so) is exact per-head attention; the backward, a batch, other
masks and a missing library are `unsupported`, saying why."""


import pytest
import torch
from stand_in import fresh_adapter, head_block_problem, install_library

from longca.attention import reference
from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.cell import CellSpec, run_cell


class StandInWrapper:
    """``flashinfer.VariableBlockSparseAttentionWrapper`` in plain torch (its docstring's rules)."""

    def __init__(self, workspace, backend="auto"):
        assert workspace.dtype == torch.uint8
        self.backend = backend

    def plan(self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads, head_dim,
             causal=False, q_data_type="float16", kv_data_type=None):
        heads, rows, cols = block_mask_map.shape
        assert heads == num_kv_heads and block_row_sz.shape == (heads, rows) and block_col_sz.shape == (heads, cols)
        assert not causal and q_data_type == kv_data_type
        allowed = [block_mask_map[g].repeat_interleave(block_row_sz[g].long(), 0)
                   .repeat_interleave(block_col_sz[g].long(), 1) for g in range(heads)]
        self.allowed = torch.stack(allowed)          # (heads_kv, tokens, tokens)
        self.group, self.dtype = num_qo_heads // num_kv_heads, q_data_type

    def run(self, q, k, v):
        assert q.dtype == self.dtype and q.is_contiguous() and k.is_contiguous()
        h, s, d = q.shape
        allowed = self.allowed.repeat_interleave(self.group, 0)
        k, v = k.repeat_interleave(self.group, 0), v.repeat_interleave(self.group, 0)
        scores = (q @ k.transpose(-1, -2)) / d ** 0.5
        return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


@pytest.fixture
def flashinfer(monkeypatch):
    install_library(monkeypatch, "flashinfer", VariableBlockSparseAttentionWrapper=StandInWrapper)
    return fresh_adapter("flashinfer_block_sparse")


def _problem(block, variable_unit=None, **over):
    return head_block_problem(block, variable_unit, **{"seed": 3, "batch": 1, **over})


@pytest.mark.parametrize("block, variable_unit", [(32, None), (64, None), (128, None), (64, 16)])
def test_each_kv_heads_kept_blocks_reach_flashinfer_and_give_exact_attention(flashinfer, block, variable_unit):
    problem = _problem(block, variable_unit)
    prepared = flashinfer.prepare(problem)
    assert prepared["wrapper"].allowed.shape == (2, 512, 512) and prepared["layout_copies"] is True
    q, k, v, _ = problem.make_inputs(requires_grad=False)
    out = flashinfer.forward(q, k, v, prepared)
    assert out.shape == q.shape
    assert torch.allclose(out, reference.attention(q, k, v, problem.mask), atol=1e-10)
    assert flashinfer.notes(prepared)["backend"] == "fa2"   # not on Hopper: FlashInfer's own fallback


def test_backward_batches_and_other_masks_are_refused_with_the_reason(flashinfer):
    assert flashinfer.supports(_problem(64, direction="bwd")) is not None
    assert "one sequence per call" in flashinfer.supports_mask(_problem(64, batch=2))
    assert "block_sparse_heads" in flashinfer.supports_mask(Problem.from_spec(ProblemSpec(mask="causal", seqlen=128)))


def test_without_the_library_a_cell_is_unsupported_and_says_what_to_install():
    row = run_cell(CellSpec(kernel="flashinfer_block_sparse", mask="sparse", pattern="block_sparse_heads",
                            seqlen=512, dtype="bfloat16", heads_q=4, heads_kv=2, gate_seqlen=256,
                            mask_params={"kept": 0.3, "block": 64, "heads": 2, "group": 2}))
    assert row["status"] == "unsupported"
    assert "is not importable" in row["reason"] and "flashinfer-python" in row["reason"]
