"""The correctness gate: a kernel against the exact reference, on the cell's mask at a short length.

Every kernel cell passes the gate before it is timed (a wrong kernel is ``wrong``, never fast).
The gate's problem is the cell's own (shapes, dtype, direction, seed) at ``gate_seqlen`` tokens,
its mask the cell's pattern with its structure kept at that length
(``longca.attention.masks.gate``): windows, global tokens, blocks, prefixes and several documents
whose boundaries fall inside tiles, so that no pattern is checked as ``full`` or ``causal``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ...attention import masks, reference
from ...attention.masks import gate as gate_masks
from ...attention.problem import Problem
from ...kernels.base import Kernel

# Correctness tolerances on ‖out − ref‖ / ‖ref‖, per dtype of the kernel's inputs.  The reference is
# float64.  fp32 allows for TF32-class matrix units (~3e-4); bf16 has 8 mantissa bits, so one
# rounding of each operand already costs ~4e-3; backward gradients accumulate over the whole
# sequence, hence the looser bound.  fp8 (e4m3, 3 mantissa bits): the reference takes the same fp8
# inputs, so what is left is the kernels' own rounding of P (and of O where the output is fp8) to
# e4m3; the bound is one e4m3 unit roundoff, 2^-4.  No LongCA kernel takes an fp8 backward.
GATE_TOLERANCE = {
    "fwd": {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2,
            torch.float8_e4m3fn: 2 ** -4},
    "bwd": {torch.float64: 1e-9, torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2},
}


def gate_problem(problem: Problem, target: int) -> Problem:
    """``problem`` at the gate's length (``target``, capped at the problem's length and rounded to
    a custom mask's base length or a block-sparse mask's block), its mask's structure kept."""
    n = masks.gate_seqlen(problem.mask_name, problem.seqlen, target, problem.mask_params)
    params = gate_masks.gate_params(problem.mask_name, problem.mask, n)
    return dataclasses.replace(problem, seqlen=n, mask_params=params, mask=None)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    if not torch.isfinite(out64).all():
        return math.inf  # NaN never passes
    return (torch.linalg.vector_norm(out64 - ref64) / torch.linalg.vector_norm(ref64).clamp_min(1e-300)).item()


def correctness_gate(kernel: Kernel, problem: Problem) -> tuple[bool, float, float, str]:
    """Compare output (and dq/dk/dv for backward) with the float64 reference.

    Returns ``(ok, worst_error, tolerance, detail)``.
    """
    backward = problem.direction == "bwd"
    q, k, v, grad_out = problem.make_inputs(requires_grad=backward, seed=problem.seed + 1)
    prepared = kernel.prepare(problem)
    out = kernel.forward(q, k, v, prepared)
    checked_out = kernel.dequantize(out, prepared)
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(backward) for t in (q, k, v))
    ref = reference.attention(q64, k64, v64, problem.mask)
    errors = {"out": relative_error(checked_out, ref)}
    if backward:
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out.to(torch.float64))
        for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
            errors[name] = relative_error(g, rg)
    tol = GATE_TOLERANCE[problem.direction][problem.dtype]
    worst_name = max(errors, key=errors.get)
    worst = errors[worst_name]
    detail = ", ".join(f"{n} {e:.2e}" for n, e in errors.items())
    return worst <= tol, worst, tol, f"relative L2 error vs float64 reference: {detail} (tolerance {tol:.0e})"


def measure_gate(kernel: Kernel, problem: Problem, target: int) -> dict[str, Any]:
    """The gate's part of a cell's row: verdict, error, tolerance, and the problem it checked
    (``gate_seqlen`` tokens, ``gate_area`` attended pairs)."""
    checked = gate_problem(problem, target)
    ok, err, tol, detail = correctness_gate(kernel, checked)
    return {"gate_ok": ok, "gate_error": err, "gate_tolerance": tol, "gate_detail": detail,
            "gate_seqlen": checked.seqlen, "gate_area": checked.mask.area()}
