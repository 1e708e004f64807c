"""FlashMask: LongCA's masks as its column-wise row indices (longca/attention/flashmask.py), checked
against the dense mask for all 14 patterns, and the adapter (longca/kernels/flashmask.py) on the CPU
through a stand-in Paddle that follows flashmask_attention's documented rules (the indices expanded
as the docs say, softmax attention in plain torch, DLPack and paddle.grad as identities on torch
tensors): forward and backward through its autograd bridge are exact attention on the mask; without
Paddle >= 3.0 a cell is `unsupported` and names what is missing."""

import sys
import types

import numpy as np
import pytest
import torch
from stand_in import assert_matches_reference, fresh_adapter, install_library

from longca.attention import masks
from longca.attention.flashmask import FlashMaskIndices, NotRepresentable, flashmask_dense, to_flashmask
from longca.attention.masks import AttnMask, AttnSlice
from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.cell import CellSpec, run_cell

CAUSAL_ONLY = {"causal", "causal_blockwise", "shared_question", "sliding_window_causal", "varlen_causal",
               "varlen_causal_long"}


@pytest.mark.parametrize("pattern", sorted(masks.PATTERNS))
@pytest.mark.parametrize("seqlen", [256, 1000, 2500])
def test_every_pattern_converts_exactly(pattern, seqlen):
    mask = masks.build(pattern, seqlen)
    fm = to_flashmask(mask)
    assert fm.indices.dtype == np.int32 and fm.indices.shape[0] == seqlen and fm.indices.shape[1] in (1, 2, 4)
    assert np.array_equal(flashmask_dense(fm, seqlen), mask.to_dense().numpy())
    # A mask that attends nothing above the diagonal goes in causal: FlashMask skips that triangle.
    assert fm.causal == (pattern in CAUSAL_ONLY)


def test_the_documented_forms_expand_as_the_docs_say():
    # causal, one index: column j attends rows [j, LTS).
    fm = FlashMaskIndices(np.array([[3], [3], [4], [4]], dtype=np.int32), causal=True)
    assert flashmask_dense(fm, 4).astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1]]
    # bidirectional, [LTS, UTE]: rows >= LTS on and below the diagonal and rows < UTE above it are masked.
    fm = FlashMaskIndices(np.array([[2, 0], [4, 0], [4, 1], [4, 3]], dtype=np.int32), causal=False)
    assert flashmask_dense(fm, 4).astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 1, 1, 1]]


def test_a_column_with_two_masked_runs_below_the_diagonal_is_refused_naming_it():
    mask = AttnMask("two_runs", 8, 8, (AttnSlice(2, 3, 0, 1, "full"), AttnSlice(5, 6, 0, 1, "full"),
                                       AttnSlice(0, 8, 1, 8, "full")))
    with pytest.raises(NotRepresentable, match=r"key column 0 is attended by rows \[2, 3\), \[5, 6\)"):
        to_flashmask(mask)


def _stand_in_flashmask(query, key, value, startend_row_indices=None, *, causal=False, **_):
    b, s, hq, d = query.shape
    assert startend_row_indices.dtype == torch.int32 and startend_row_indices.shape[:3] == (b, 1, key.shape[1])
    fm = FlashMaskIndices(startend_row_indices[0, 0].numpy(), causal=causal)
    allowed = torch.from_numpy(flashmask_dense(fm, s))
    group = hq // key.shape[2]
    with torch.enable_grad():  # Paddle's autograd does not follow torch's grad mode
        k, v = key.repeat_interleave(group, 2), value.repeat_interleave(group, 2)
        scores = torch.einsum("bqhd,bkhd->bhqk", query, k) / d ** 0.5
        p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return torch.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.fixture
def flashmask(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashmask", None)  # Paddle's path: no PyTorch binding here
    install_library(monkeypatch, "paddle.nn.functional", flashmask_attention=_stand_in_flashmask)
    paddle = sys.modules["paddle"]
    paddle.__version__, paddle.is_compiled_with_cuda = "3.1.0", lambda: True
    paddle.grad = lambda outputs, inputs, grad_outputs, retain_graph: torch.autograd.grad(
        outputs, inputs, grad_outputs, retain_graph=retain_graph)
    dlpack = types.SimpleNamespace(from_dlpack=lambda capsule: _paddle_tensor(torch.utils.dlpack.from_dlpack(capsule)),
                                   to_dlpack=lambda t: torch.utils.dlpack.to_dlpack(t.detach()))
    paddle.utils = types.SimpleNamespace(dlpack=dlpack)
    return fresh_adapter("flashmask")


def _paddle_tensor(t):
    # A stand-in Paddle tensor is the torch tensor; `stop_gradient = False` is requires_grad.
    return t.requires_grad_(True) if t.is_floating_point() else t


@pytest.mark.parametrize("pattern", ["causal", "varlen_full", "shared_question", "global_sliding_window"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_the_adapter_through_a_stand_in_paddle_is_exact_attention(flashmask, pattern, direction):
    problem = Problem.from_spec(ProblemSpec(mask=pattern, seqlen=384, dtype="float64", heads_q=4, heads_kv=2, head_dim=8,
                                            direction=direction))
    prepared = flashmask.prepare(problem)
    assert prepared["causal"] == (pattern in CAUSAL_ONLY)
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    out = flashmask.forward(q, k, v, prepared)
    assert_matches_reference(out, q, k, v, grad_out, problem.mask, backward=direction == "bwd")


@pytest.mark.parametrize(("version", "cuda", "words"), [("2.6.2", True, "needs a GPU build >= 3.0"),
                                                       ("3.0.0", False, "is a CPU build")])
def test_an_old_or_cpu_paddle_is_named(monkeypatch, version, cuda, words):
    install_library(monkeypatch, "paddle", __version__=version, is_compiled_with_cuda=lambda: cuda)
    from longca import kernels

    adapter = type(kernels.get("flashmask"))()
    assert words in adapter.available() and version in adapter.available()


def test_without_paddle_a_cell_is_unsupported_and_says_what_to_install():
    row = run_cell(CellSpec(kernel="flashmask", mask="causal", seqlen=512, dtype="bfloat16", heads_q=4, heads_kv=2,
                            gate_seqlen=256))
    assert row["status"] == "unsupported"
    assert "PaddlePaddle is not installed" in row["reason"] and ">= 3.0" in row["reason"]


def test_paddles_documented_causal_example_expands_to_its_printed_matrix():
    # flashmask_attention's docstring (Paddle 3.3): causal, every column masked from row 8 down.
    fm = FlashMaskIndices(np.full((10, 1), 8, dtype=np.int32), causal=True)
    printed = [[1] * (i + 1) + [0] * (9 - i) for i in range(8)] + [[0] * 10] * 2
    assert flashmask_dense(fm, 10).astype(int).tolist() == printed


def test_a_cells_mask_is_converted_once_for_its_checks_and_its_prepare(flashmask, monkeypatch):
    from longca.kernels import flashmask as adapter_module

    made = []
    real = adapter_module.to_flashmask
    monkeypatch.setattr(adapter_module, "to_flashmask", lambda mask: made.append(mask.name) or real(mask))
    problem = Problem.from_spec(ProblemSpec(mask="varlen_causal", seqlen=384, dtype="float64", heads_q=4, heads_kv=2, head_dim=8))
    assert flashmask.supports_mask(problem) is None
    flashmask.prepare(problem)
    assert made == ["varlen_causal"]
