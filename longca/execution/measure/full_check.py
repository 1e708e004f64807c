"""The full-size check: a kernel at a length the gate does not reach (8K on a GPU), against exact
attention computed in float32 block by block (``longca.attention.chunked_reference``).

The gate checks every cell at ``gate_seqlen`` tokens with a float64 reference; a kernel could still
go wrong only at length (a tile schedule, a split, an index past 2^16).  This checks each kernel ×
mask × direction once at one long length, with the gate's tolerances: output, and for backward
dq, dk, dv.  ``scripts/full_check.py`` runs it over a grid and keeps each result.
"""

from __future__ import annotations

from typing import Any

import torch

from ...attention import chunked_reference
from ...attention.problem import Problem
from ...kernels.base import Kernel
from .gate import GATE_TOLERANCE, relative_error


def full_size_check(kernel: Kernel, problem: Problem, rows: int = 512) -> dict[str, Any]:
    """``{"ok", "error", "tolerance", "detail"}`` for ``kernel`` on ``problem`` at its full length."""
    backward = problem.direction == "bwd"
    q, k, v, grad_out = problem.make_inputs(requires_grad=backward, seed=problem.seed + 1)
    prepared = kernel.prepare(problem)
    out = kernel.forward(q, k, v, prepared)
    q32, k32, v32 = (t.detach().to(torch.float32).requires_grad_(backward) for t in (q, k, v))
    ref = chunked_reference.attention(q32, k32, v32, problem.mask, rows=rows)
    errors = {"out": relative_error(kernel.dequantize(out, prepared), ref)}
    if backward:
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        ref_grads = torch.autograd.grad(ref, (q32, k32, v32), grad_out.to(torch.float32))
        for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
            errors[name] = relative_error(g, rg)
    tol = GATE_TOLERANCE[problem.direction][problem.dtype]
    worst = max(errors.values())
    detail = ", ".join(f"{n} {e:.2e}" for n, e in errors.items())
    return {"ok": worst <= tol, "error": worst, "tolerance": tol,
            "detail": f"relative L2 error vs float32 reference at {problem.seqlen} tokens: {detail} (tolerance {tol:.0e})"}
