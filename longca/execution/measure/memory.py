"""The memory part of a kernel cell: what one call needs, from a clean allocator peak.

``peak_mem_bytes`` is the most memory PyTorch's allocator held at once during one eager call of the
cell, above what was held before it: the call's inputs (q, k, v and the upstream gradient), its
mask metadata, outputs, saved statistics and temporaries.  For a backward cell the call is forward
then backward (the backward cannot run without its forward).  The call is measured warm, so that
compilation, plans and process-wide caches (cuDNN-frontend graphs, Triton autotuning) are not
counted and the figure does not depend on which cells ran before in the process: after the cell's
own timing in this process (which made those calls), or else after one unmeasured call.  The
collector is off during the measured call: a collection inside the window freed tensors an earlier
cell left in reference cycles, so the call read too little (once below zero).  Garbage left from
before stays allocated through the window and is in the baseline too, so it does not move the
figure, and collecting it first cost a whole pass over the process's objects (0.1-0.3 s a cell where
torch.compile and the kernel libraries are loaded).  The allocator's cache is not emptied either: the
peak counts allocated bytes, which do not depend on what the cache holds.  Memory allocated outside
PyTorch's allocator is not seen.  On a CPU there is no allocator peak: None.
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
    """No garbage collection until the block ends: what the block frees is its own."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def measure_memory(kernel: Kernel, problem: Problem, warm: bool = False) -> dict[str, Any]:
    """The memory part of a cell's row: ``peak_mem_bytes`` (None off CUDA).  ``warm``: this process
    has just made the cell's calls (its timing), so no unmeasured call is needed first."""
    device = problem.device
    if device.type != "cuda":
        return {"peak_mem_bytes": None}
    if not warm:
        _one_call(kernel, problem)  # what stays cached after it is not the call's own need
    with collector_quiet():
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        _one_call(kernel, problem)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    return {"peak_mem_bytes": int(peak - base)}
