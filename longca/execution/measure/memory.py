"""The memory part of a kernel cell: what one call needs, from a clean allocator peak.

``peak_mem_bytes`` is the most memory PyTorch's allocator held at once during one eager call of the
cell, above what was held before it: the call's inputs (q, k, v and the upstream gradient), its
mask metadata, outputs, saved statistics and temporaries.  For a backward cell the call is forward
then backward (the backward cannot run without its forward).  The call is measured warm, so that
compilation, plans and process-wide caches (cuDNN-frontend graphs, Triton autotuning) are not
counted and the figure does not depend on which cells ran before in the process.  The collector is
off while the figure is read: a collection inside the window freed tensors an earlier cell left in
reference cycles, so the call read too little (once below zero).  Garbage left from before stays
allocated through the window and is in the baseline too, so it does not move the figure, and
collecting it first cost a whole pass over the process's objects (0.1-0.3 s a cell where
torch.compile and the kernel libraries are loaded).  The allocator's cache is not emptied either: the
peak counts allocated bytes, which do not depend on what the cache holds.  Memory allocated outside
PyTorch's allocator is not seen.  On a CPU there is no allocator peak: None.

Two ways to read it, the same figure (``memory_via`` says which):

* ``timing`` (``CallReading``): from calls a graphed cell's timing makes anyway.  Its inputs and
  ``prepare`` are built inside one window (their peak, and what they keep); a backward's forward is
  made next; after the eager warm-up call, the host probe's first call is a warm call of the cell,
  read in a second window: the figure is the larger of the set-up's peak and what was held when the
  call began plus the call's own peak.  No call is made for the figure alone.
* ``own call`` (``measure_memory``): where the timing is taken from the store or timed eagerly, one
  unmeasured call (none if the cell's timing just ran in this process), then one call read whole.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from ...attention.problem import Problem
from ...kernels.base import Kernel

VIA_TIMING = "timing"
VIA_OWN_CALL = "own call"


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


class _Window:
    """The allocator's peak over a block above what was allocated when it began (``peak``), and
    what was allocated then (``start``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start: int | None = None
        self.peak: int | None = None

    def __enter__(self) -> "_Window":
        torch.cuda.synchronize(self.device)
        self.start = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device) - self.start


def _part(peak: int | None, via: str | None) -> dict[str, Any]:
    return {"peak_mem_bytes": None if peak is None else int(peak), "memory_via": via}


def measure_memory(kernel: Kernel, problem: Problem, warm: bool = False) -> dict[str, Any]:
    """The memory part of a cell's row from a call of its own: ``peak_mem_bytes`` (None off CUDA)
    and ``memory_via``.  ``warm``: this process has just made the cell's calls (its timing), so no
    unmeasured call is needed first."""
    device = problem.device
    if device.type != "cuda":
        return _part(None, None)
    if not warm:
        _one_call(kernel, problem)  # what stays cached after it is not the call's own need
    with collector_quiet(), _Window(device) as window:
        _one_call(kernel, problem)
    return _part(window.peak, VIA_OWN_CALL)


class CallReading:
    """The memory part read off a graphed cell's timing (CUDA): ``setup()`` around building its
    inputs and ``prepare``, ``call()`` around one warm call of the cell; ``part()`` is the figure
    once both were read.  The collector stays off from the set-up to the end of the call, so that
    what was held when the call began is the cell's own."""

    def __init__(self, device: torch.device):
        self.device = device
        self._setup: _Window | None = None
        self._call: _Window | None = None
        self._collector_was_on: bool | None = None  # set while the reading keeps the collector off

    @contextmanager
    def setup(self) -> Iterator[None]:
        self._collector_was_on = gc.isenabled()
        gc.disable()
        with _Window(self.device) as window:
            yield
        self._setup = window

    @contextmanager
    def call(self) -> Iterator[None]:
        if self._setup is None or self._call is not None:  # read once, after the set-up
            yield
            return
        try:
            with _Window(self.device) as window:
                yield
            self._call = window
        finally:
            self.close()

    def close(self) -> None:
        """The collector back on (idempotent): the reading is over, or the timing ended first."""
        if self._collector_was_on:
            gc.enable()
        self._collector_was_on = None

    def part(self) -> dict[str, Any] | None:
        if self._setup is None or self._call is None:
            return None
        held = self._call.start - self._setup.start
        return _part(max(self._setup.peak, held + self._call.peak), VIA_TIMING)
