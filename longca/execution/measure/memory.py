"""The memory part of a kernel cell: what one call needs, from a clean allocator peak.

``peak_mem_bytes`` is the most memory PyTorch's allocator held at once during one eager call of the
cell, above what was held before it: the call's inputs (q, k, v and the upstream gradient), its
mask metadata, outputs, saved statistics and temporaries.  For a backward cell the call is forward
then backward (the backward cannot run without its forward).  The call is measured warm, so that
compilation, plans and process-wide caches (cuDNN-frontend graphs, Triton autotuning) are not
counted and the figure does not depend on which cells ran before in the process.  The collector is
off while the figure is read (longca/execution/measure/call_memory.py says why).  Garbage left from
before stays allocated through the window and is in the baseline too, so it does not move the
figure, and collecting it first cost a whole pass over the process's objects (0.1-0.3 s a cell where
torch.compile and the kernel libraries are loaded).  The allocator's cache is not emptied either: the
peak counts allocated bytes, which do not depend on what the cache holds.  Memory allocated outside
PyTorch's allocator is not seen.  On a CPU there is no allocator peak: None.

Two ways to read it, the same figure (``memory_via`` says which):

* ``timing`` (``call_memory.CallReading``): from calls a graphed cell's timing makes anyway.  Its inputs and
  ``prepare`` are built inside one window (their peak, and what they keep); a backward's forward is
  made next; after the eager warm-up call, the host probe's first call is a warm call of the cell,
  read in a second window: the figure is the larger of the set-up's peak and what was held when the
  call began plus the call's own peak.  No call is made for the figure alone.
* ``own call`` (``measure_memory``): where the timing is taken from the store or timed eagerly, one
  unmeasured call (none if the cell's timing just ran in this process), then one call read whole.
"""

from __future__ import annotations

from typing import Any

import torch

from ...attention.problem import Problem
from ...kernels.base import Kernel
from .call_memory import VIA_OWN_CALL, Window, collector_quiet, part


def _one_call(kernel: Kernel, problem: Problem) -> None:
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    prepared = kernel.prepare(problem)
    out = kernel.forward(q, k, v, prepared)
    if problem.direction == "bwd":
        torch.autograd.grad(out, (q, k, v), grad_out)


def measure_memory(kernel: Kernel, problem: Problem, warm: bool = False) -> dict[str, Any]:
    """The memory part of a cell's row from a call of its own: ``peak_mem_bytes`` (None off CUDA)
    and ``memory_via``.  ``warm``: this process has just made the cell's calls (its timing), so no
    unmeasured call is needed first."""
    device = problem.device
    if device.type != "cuda":
        return part(None, None)
    if not warm:
        _one_call(kernel, problem)  # what stays cached after it is not the call's own need
    with collector_quiet(), Window(device) as window:
        _one_call(kernel, problem)
    return part(window.peak, VIA_OWN_CALL)
