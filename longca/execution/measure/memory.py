"""The memory part of a kernel cell: what one call needs, from a clean allocator peak.

``peak_mem_bytes`` is the most memory PyTorch's allocator held at once during one eager call of the
cell, above what was held before it: the call's inputs (q, k, v and the upstream gradient), its
mask metadata, outputs, saved statistics and temporaries.  For a backward cell the call is forward
then backward (the backward cannot run without its forward).  One call runs first, unmeasured, so
that compilation, plans and process-wide caches (cuDNN-frontend graphs, Triton autotuning) are not
counted and the figure does not depend on which cells ran before in the process.  Garbage is
collected before the baseline and the collector is off during the measured call: a collection inside
the window freed tensors an earlier cell left in reference cycles, so the call read too little (once
below zero).  Memory allocated outside PyTorch's allocator is not seen.  On a CPU there is no
allocator peak: None.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from ...attention.problem import Problem
from ...kernels.base import Kernel


def _one_call(kernel: Kernel, problem: Problem) -> None:
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    prepared = kernel.prepare(problem)
    out = kernel.forward(q, k, v, prepared)
    if problem.direction == "bwd":
        torch.autograd.grad(out, (q, k, v), grad_out)


@contextmanager
def collector_quiet() -> Iterator[None]:
    """Collect garbage now, and none until the block ends: what the block frees is its own."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def measure_memory(kernel: Kernel, problem: Problem) -> dict[str, Any]:
    """The memory part of a cell's row: ``peak_mem_bytes`` (None off CUDA)."""
    device = problem.device
    if device.type != "cuda":
        return {"peak_mem_bytes": None}
    _one_call(kernel, problem)  # warm: what stays cached after it is not the call's own need
    with collector_quiet():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        _one_call(kernel, problem)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    return {"peak_mem_bytes": int(peak - base)}
