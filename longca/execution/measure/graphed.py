"""A cell's timed call captured in a CUDA graph, so its time is the GPU's work, not Python's launch.

At short lengths a kernel's GPU work (0.05-0.5 ms at 1K for 64 : 8 heads on an H200) is as short as
the Python that issues it (0.05-1.1 ms there): FlashAttention-4's CuTe DSL front end and a compiled
FlexAttention call check and convert their arguments, SDPA's cuDNN path looks up its plan, a
backward goes through the autograd engine. Timed eagerly with CUDA events, such a call measures how
far the CPU ran ahead of the GPU (an H200 grid saw two eager harnesses disagree by up to 2-3× at 1K,
lab/data/workflow_cost_2026-11-22.md). Replaying a captured graph issues the same kernels with one launch, so the events
bracket the GPU's work only, and the figure means the same at 1K as at 32K. What the CPU costs per
call is kept beside it: ``host_ms`` (eager, not synchronised), so a launch-bound kernel is still
visible as one.

A call that cannot be captured (a host synchronisation inside it, an operation capture forbids)
is timed eagerly, and the row says why (``timed_via``).  Capture and timing run on one side stream:
a backward's autograd ops run on the stream of the forward they differentiate, so that forward is
made on the capture stream too.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch


def stream_for(device: torch.device, enabled: bool) -> torch.cuda.Stream | None:
    """The stream a graphed cell builds, captures and times on (None: eager on the current one)."""
    return torch.cuda.Stream(device=device) if enabled and device.type == "cuda" else None


def on(stream: torch.cuda.Stream | None):
    """Make ``stream`` current (a no-op context when there is none)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def host_ms(run: Callable[[], object], device: torch.device, calls: int = 10) -> float:
    """CPU milliseconds to issue one call, eagerly and without waiting for the GPU (the device is
    drained first, and ``calls`` stays far below CUDA's launch-queue depth, so the GPU never holds the
    CPU back unless the call itself synchronises)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        run()
    elapsed = (time.perf_counter() - start) * 1e3 / calls
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return elapsed


def capture(run: Callable[[], object], stream: torch.cuda.Stream) -> tuple[Callable[[], object] | None, str]:
    """``(replay, "graph")``, or ``(None, "eager: <why capture failed>")``.

    ``run`` must have been called (eagerly, on ``stream``) before: compilation, plan selection and
    allocator growth happen outside the capture."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            run()
    except Exception as exc:  # noqa: BLE001 — an uncapturable call is timed eagerly, and says so
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        del graph
        with contextlib.suppress(Exception):  # an invalidated capture leaves nothing to wait for
            torch.cuda.synchronize(stream.device)
        torch.cuda.empty_cache()
        return None, f"eager: capture failed: {type(exc).__name__}: {reason[:200]}"
    return graph.replay, "graph"
