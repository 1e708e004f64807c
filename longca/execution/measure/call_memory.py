"""Reading the allocator's peak around calls a cell makes: the memory part's figure, both ways.

``Window``: the peak over a block above what was allocated when it began.  ``CallReading``: the
figure read off a graphed cell's timing (``memory_via`` ``timing``; longca/execution/measure/memory.py
says what the figure is and the other way).  The collector is off while a figure is read: a
collection inside the window freed tensors an earlier cell left in reference cycles, so the call
read too little (once below zero).
"""

from __future__ import annotations

import gc
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import torch

VIA_TIMING = "timing"
VIA_OWN_CALL = "own call"


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


class Window:
    """The allocator's peak over a block above what was allocated when it began (``peak``), and
    what was allocated then (``start``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start: int | None = None
        self.peak: int | None = None

    def __enter__(self) -> "Window":
        torch.cuda.synchronize(self.device)
        self.start = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device) - self.start


def part(peak: int | None, via: str | None) -> dict[str, Any]:
    return {"peak_mem_bytes": None if peak is None else int(peak), "memory_via": via}


class CallReading:
    """The memory part read off a graphed cell's timing (CUDA): ``setup()`` around building its
    inputs and ``prepare``, ``call()`` around one warm call of the cell; ``part()`` is the figure
    once both were read.  The collector stays off from the set-up to the end of the call, so that
    what was held when the call began is the cell's own."""

    def __init__(self, device: torch.device):
        self.device = device
        self._setup: Window | None = None
        self._call: Window | None = None
        self._quiet = ExitStack()  # holds collector_quiet() from the set-up until close()

    @contextmanager
    def setup(self) -> Iterator[None]:
        self._quiet.enter_context(collector_quiet())
        with Window(self.device) as window:
            yield
        self._setup = window

    @contextmanager
    def call(self) -> Iterator[None]:
        if self._setup is None or self._call is not None:  # read once, after the set-up
            yield
            return
        try:
            with Window(self.device) as window:
                yield
            self._call = window
        finally:
            self.close()

    def close(self) -> None:
        """The collector back on (idempotent): the reading is over, or the timing ended first."""
        self._quiet.close()

    def part(self) -> dict[str, Any] | None:
        if self._setup is None or self._call is None:
            return None
        held = self._call.start - self._setup.start
        return part(max(self._setup.peak, held + self._call.peak), VIA_TIMING)
