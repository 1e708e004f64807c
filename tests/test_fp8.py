"""fp8 (e4m3) cells: inputs, the gate's tolerance, kernels that refuse it and why, the fp8 matmul
ceiling.  The GPU kernels' fp8 paths (flash_attn3, cudnn_fe) are measured on the GPU box."""

import dataclasses

import pytest
import torch

from longca import kernels
from longca.attention.problem import Problem
from longca.execution.measure import ceilings, cp_cell
from longca.execution.measure.cell import CellSpec, run_cell
from longca.execution.measure.gate import GATE_TOLERANCE
from longca.kernels.base import Kernel
from longca.kernels.cudnn_frontend import E4M3_MAX, fp8_mask_kwargs, fp8_scale_values

SMALL = dict(seqlen=512, heads_q=4, heads_kv=2, head_dim=64, warmup=1, reps=3, gate_seqlen=256,
             dtype="float8_e4m3fn")


def test_fp8_inputs_are_e4m3_numbers_the_reference_reads_exactly():
    problem = Problem("causal", 256, 1, 4, 2, 64, torch.float8_e4m3fn, "cpu", "fwd")
    q, k, v, _ = problem.make_inputs(requires_grad=False)
    assert q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn
    q64 = q.to(torch.float64)
    assert torch.equal(q64.to(torch.float8_e4m3fn).to(torch.float64), q64)  # exact round trip
    assert 0 < q64.abs().max() < 448  # unit scale: normal inputs stay in range


@pytest.mark.parametrize("mask", ["causal", "varlen_causal", "sliding_window_causal"])
def test_fp8_arithmetic_passes_the_gate_with_room(mask):
    row = run_cell(CellSpec(kernel="test_fp8", mask=mask, **SMALL))
    assert row["status"] == "ok", row["reason"]
    assert row["dtype"] == "float8_e4m3fn"
    assert row["gate_tolerance"] == GATE_TOLERANCE["fwd"][torch.float8_e4m3fn] == 2 ** -4
    # P rounded to e4m3 costs ~2-3 %: well inside one unit roundoff, so the bound is not tight.
    assert row["gate_error"] < 0.6 * row["gate_tolerance"], row["gate_detail"]


def test_fp8_without_the_p_scale_is_wrong():
    # At 1K tokens most probabilities are below e4m3's smallest normal (2^-6): unscaled, they lose
    # their digits (measured: 10.6 % at 1K causal, against 2.6 % for the scaled rounding).
    row = run_cell(CellSpec(kernel="test_fp8_wrong", mask="causal", **{**SMALL, "seqlen": 1024, "gate_seqlen": 1024}))
    assert row["status"] == "wrong", row.get("gate_detail")
    assert "median_ms" not in row


def test_fp8_backward_is_unsupported_naming_why():
    row = run_cell(CellSpec(kernel="test_fp8", mask="causal", direction="bwd", **SMALL))
    assert row["status"] == "unsupported"
    assert "fp8 backward" in row["reason"]


def test_16_bit_kernels_refuse_fp8_and_fa4_says_blackwell(monkeypatch):
    problem = Problem("causal", 256, 1, 4, 2, 64, torch.float8_e4m3fn, "cuda", "fwd")
    sdpa = kernels.get("sdpa_cudnn")
    monkeypatch.setattr(type(sdpa), "available", lambda self: None)
    assert sdpa.supports(problem) == "sdpa_cudnn does not take float8_e4m3fn"
    fa4 = kernels.get("flash_attn4")
    monkeypatch.setattr(type(fa4), "available", lambda self: None)
    assert "Blackwell" in fa4.supports(problem)
    fa3 = kernels.get("flash_attn3")  # the same class: available patched above
    assert fa3.supports(problem) is None
    assert "forward only" in fa3.supports(dataclasses.replace(problem, direction="bwd", mask=None))


def test_deterministic_variants_time_only_the_backward(monkeypatch):
    problem = Problem("causal", 256, 1, 4, 2, 64, torch.bfloat16, "cuda", "fwd")
    for name, default in (("flash_attn3_deterministic", "flash_attn3"), ("cudnn_fe_deterministic", "cudnn_fe")):
        kernel = kernels.get(name)
        monkeypatch.setattr(type(kernel), "available", lambda self: None)
        assert kernel.deterministic and not kernels.get(default).deterministic
        assert "only in the backward" in kernel.supports(problem)
        assert kernel.supports(dataclasses.replace(problem, direction="bwd", mask=None)) is None
        assert Kernel.notes(kernel, {})["deterministic"] is True  # what every adapter's notes extend


def test_cudnn_fp8_graph_arguments():
    # sdpa_fp8 names the band's bounds differently from sdpa; P's scale is e4m3's largest value.
    assert fp8_mask_kwargs({"diagonal_alignment": "TOP_LEFT", "diagonal_band_right_bound": 0,
                            "diagonal_band_left_bound": 129}) == {
        "diagonal_alignment": "TOP_LEFT", "right_bound": 0, "left_bound": 129}
    scales = fp8_scale_values()
    assert scales["scale_s"] == E4M3_MAX == float(torch.finfo(torch.float8_e4m3fn).max)
    assert scales["scale_s"] * scales["descale_s"] == 1.0


def test_cp_cells_refuse_fp8_before_planning():
    problem = Problem("causal", 256, 1, 4, 2, 64, torch.float8_e4m3fn, "cpu", "fwd")
    strategy, reason = cp_cell._planned(None, problem)
    assert strategy is None and "not float8_e4m3fn" in reason


def test_fp8_matmul_ceiling_is_measured():
    entry = ceilings.matmul_tflops("cpu", "float8_e4m3fn", max_n=256)
    assert entry["dtype"] == "float8_e4m3fn" and entry["tflops"] > 0
