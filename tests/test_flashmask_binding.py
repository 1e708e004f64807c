"""FlashMask through its PyTorch binding (longca/kernels/flashmask.py), on the CPU: the row indices
every mask becomes reach ``flashmask.flashmask_attention`` in the layout its torch interface asserts
(``[batch, 1, seqlen_k, 1|2|4]`` int32, the causal flag that goes with the width), and through a
stand-in binding that follows the interface's documented rules (indices expanded as
``flashmask_to_densemask`` does, head ``h`` of the indices for query head ``h * n_heads / heads_q``,
GQA key heads) the adapter is exact attention on every mask, forward and gradients through the
binding's own autograd.  The binding wins over Paddle when both are there; bf16 only; without
either the row names both."""

import sys

import numpy as np
import pytest
import torch
from stand_in import assert_matches_reference, fresh_adapter, install_library

from longca.attention import masks
from longca.attention.flashmask import FlashMaskIndices, flashmask_dense, to_flashmask
from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.cell import CellSpec, run_cell

CAUSAL_WIDTHS, BIDIRECTIONAL_WIDTHS = (1, 2), (2, 4)
CALLS = []


def _stand_in_binding(query, key, value, startend_row_indices=None, *, causal=False, window_size=None, **_):
    """The interface's checks (flashmask_interface.flashmask_attention) and its documented mask, in torch."""
    b, sq, hq, d = query.shape
    hk, idx = key.shape[2], startend_row_indices
    assert window_size is None
    assert idx.dtype == torch.int32 and idx.dim() == 4 and idx.shape[0] == b and idx.shape[2] == key.shape[1]
    assert idx.shape[1] in (1, hq, hk) and hq % hk == 0
    assert idx.shape[3] in (CAUSAL_WIDTHS if causal else BIDIRECTIONAL_WIDTHS)
    CALLS.append((tuple(idx.shape), causal))
    ratio = hq // idx.shape[1]
    allowed = torch.stack([torch.stack([torch.from_numpy(flashmask_dense(
        FlashMaskIndices(idx[i, h // ratio].numpy(), causal), sq)) for h in range(hq)]) for i in range(b)])
    k, v = key.repeat_interleave(hq // hk, 2), value.repeat_interleave(hq // hk, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", query, k) * d ** -0.5
    p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.fixture
def binding(monkeypatch):
    CALLS.clear()
    install_library(monkeypatch, "flashmask", flashmask_attention=_stand_in_binding)
    monkeypatch.setitem(sys.modules, "paddle", None)  # the binding alone
    return fresh_adapter("flashmask")


def _problem(pattern, direction="fwd", **over):
    spec = dict(mask=pattern, seqlen=256, dtype="float64", batch=2, heads_q=4, heads_kv=2, head_dim=8,
                direction=direction, device="cpu")
    return Problem.from_spec(ProblemSpec(**{**spec, **over}))


@pytest.mark.parametrize("pattern", sorted(masks.PATTERNS))
def test_every_masks_indices_reach_the_binding_in_its_layout(binding, pattern):
    problem = _problem(pattern)
    prepared = binding.prepare(problem)
    fm = to_flashmask(problem.mask)
    indices = prepared["indices"]
    assert prepared["backend"] == "torch" and prepared["causal"] == fm.causal
    assert indices.dtype == torch.int32 and indices.is_contiguous()
    assert tuple(indices.shape) == (2, 1, 256, fm.indices.shape[1])   # [batch, 1 head for all, seqlen_k, n]
    assert fm.indices.shape[1] in (CAUSAL_WIDTHS if fm.causal else BIDIRECTIONAL_WIDTHS)
    assert all(np.array_equal(indices[i, 0].numpy(), fm.indices) for i in range(2))


@pytest.mark.parametrize("pattern", sorted(masks.PATTERNS))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_the_adapter_through_a_stand_in_binding_is_exact_attention_with_gqa(binding, pattern, direction):
    problem = _problem(pattern, direction, seqlen=192)
    prepared = binding.prepare(problem)
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    out = binding.forward(q, k, v, prepared)
    assert CALLS == [((2, 1, 192, prepared["indices_per_column"]), prepared["causal"])]  # one call per cell
    assert_matches_reference(out, q, k, v, grad_out, problem.mask, backward=direction == "bwd")


def test_the_binding_is_bf16_only_and_its_rows_say_so(binding, monkeypatch):
    monkeypatch.setattr(binding, "devices", ("cpu", "cuda"))
    assert binding.supports(_problem("causal", dtype="bfloat16")) is None
    assert "bfloat16 only" in binding.supports(_problem("causal", dtype="float16"))
    assert binding.notes(binding.prepare(_problem("causal")))["backend"] == "torch"


def test_the_binding_is_preferred_over_paddle(monkeypatch):
    install_library(monkeypatch, "flashmask", flashmask_attention=_stand_in_binding)
    install_library(monkeypatch, "paddle", __version__="3.1.0", is_compiled_with_cuda=lambda: True)
    assert fresh_adapter("flashmask").prepare(_problem("causal"))["backend"] == "torch"


def test_without_binding_and_paddle_the_row_names_both():
    row = run_cell(CellSpec(kernel="flashmask", mask="causal", seqlen=512, dtype="bfloat16", heads_q=4, heads_kv=2,
                            gate_seqlen=256))
    assert row["status"] == "unsupported"
    assert "PyTorch binding is not importable" in row["reason"] and "build_kernels.sh OUT_DIR flashmask" in row["reason"]
    assert "PaddlePaddle is not installed" in row["reason"]
