"""The call a kernel cell times, and timing it: the time part of a cell.

Mask metadata is prepared untimed; on CUDA the call is captured in a CUDA graph after eager warm-up
calls and its replays are timed (``longca.execution.measure.graphed``), by the budget-driven harness
of ``longca.execution.measure.timing``.  lab/longca_lab/bench_pipeline.py times this same call with
triton.testing.do_bench.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable

import torch

from ...attention.problem import Problem
from ...kernels.base import Kernel
from . import graphed, timing
from .call_memory import CallReading


def timed_call(kernel: Kernel, problem: Problem,
               memory: CallReading | None = None) -> tuple[Callable[[], object], dict[str, Any]]:
    """The call a cell times on the full problem, and the kernel's prepared mask metadata (built
    here, untimed): the forward, or the backward through autograd of a forward made here (the
    forward is not part of a backward timing).  ``memory`` reads the inputs' and ``prepare``'s
    memory.  lab/longca_lab/bench_pipeline.py times this same call with triton.testing.do_bench."""
    with memory.setup() if memory else contextlib.nullcontext():
        q, k, v, grad_out = problem.make_inputs(requires_grad=True)
        prepared = kernel.prepare(problem)
    if problem.direction == "bwd":
        out = kernel.forward(q, k, v, prepared)

        def run():
            return torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    else:
        # Inputs require grad, as in training: kernels that save softmax statistics do so here too.
        # The upstream gradient lives as long as the call, as in the memory part's own call, whose
        # figure counts it: read off the timing, a forward's figure would lack it.
        inputs = (q, k, v, grad_out)

        def run():
            q, k, v, _ = inputs
            return kernel.forward(q, k, v, prepared)
    return run, prepared


# Every call of the host probe runs on the GPU too, and the probe waits for them: it may cost about
# this much GPU time.  Ten calls of a 100 ms kernel (a 32K dense mask) were most of such a cell's wall.
HOST_PROBE_MS = 10.0
HOST_PROBE_CALLS = 10


def _host_probe(run: Callable[[], object], device: torch.device,
                memory: CallReading | None = None) -> tuple[float, float | None]:
    """CPU milliseconds to issue one eager call (``graphed.host_ms``), over as many calls (at most
    ``HOST_PROBE_CALLS``) as fit ``HOST_PROBE_MS`` of GPU time; a call longer than that is its own
    probe: issued alone on an idle device, it is timed to its return and then waited for, and its
    pace (ms, second of the pair) is a window of one call the warm-up can compare its first with.
    That first call is a warm call of the cell: ``memory`` reads what it needs."""
    with memory.call() if memory else contextlib.nullcontext():
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        issued = time.perf_counter()
        torch.cuda.synchronize(device)
        pace_ms = (time.perf_counter() - start) * 1e3
    if pace_ms >= HOST_PROBE_MS:
        return (issued - start) * 1e3, pace_ms
    return graphed.host_ms(run, device, calls=max(1, min(HOST_PROBE_CALLS, int(HOST_PROBE_MS // pace_ms)))), None


@contextlib.contextmanager
def cell_call(kernel: Kernel, problem: Problem, warmup: int, cuda_graph: bool = False,
              memory: CallReading | None = None):
    """The call a cell times, as it times it: yields ``(call, prepared, facts)``; time ``call``
    inside the block.

    ``cuda_graph`` (CUDA only): the block runs on a side stream; ``warmup`` eager calls (compilation,
    plans, allocator growth) come first, then the host probe, then the call is captured in a CUDA
    graph and ``call`` replays it (``longca.execution.measure.graphed``).  ``facts``: ``timed_via``
    (which way), ``host_ms`` (what one eager call costs the CPU) and ``probe_pace_ms`` (the probe's
    one call, when it was long enough to be its own probe; else None).  ``memory`` (graphed cells):
    reads the memory part off the set-up and the probe's first call (``call_memory.CallReading``).
    lab/longca_lab/bench_pipeline.py times this same ``call`` with triton.testing.do_bench."""
    stream = graphed.stream_for(problem.device, cuda_graph)
    memory = memory if stream is not None else None
    try:
        with graphed.on(stream):
            run, prepared = timed_call(kernel, problem, memory)
            facts: dict[str, Any] = {}
            call = run
            if stream is not None:
                for _ in range(max(warmup, 1)):
                    run()
                facts["host_ms"], facts["probe_pace_ms"] = _host_probe(run, problem.device, memory)
                if long := timing.long_call(facts["probe_pace_ms"]):
                    facts["timed_via"] = long  # nothing to gain from a graph, a second pool to lose
                else:
                    replay, facts["timed_via"] = graphed.capture(run, stream)
                    call = replay or run
            yield call, prepared, facts
    finally:
        if memory is not None:
            memory.close()


def time_kernel(kernel: Kernel, problem: Problem, warmup: int, reps: int, warmup_ms: float = 0.0,
                warmup_max_ms: float = 0.0, rep_ms: float = 0.0, cuda_graph: bool = False,
                memory: CallReading | None = None):
    """Time forward or backward of the full problem; mask metadata is prepared untimed.  ``memory``:
    see ``cell_call``."""
    warmup = max(warmup, kernel.min_warmup)
    with cell_call(kernel, problem, warmup, cuda_graph, memory) as (call, prepared, facts):
        # Graph mode made the ``warmup`` calls (one-time costs) before capture: a replay compiles
        # nothing, so the steadiness windows start at once, the first compared with the probe's
        # call where that was one call of the same work on an idle device.  A first replay slower
        # than the probe or the next (graph upload, host-bound eager issue) makes its window
        # disagree, and the warm-up goes on.
        counted = 0 if "timed_via" in facts else warmup
        probe_ms = facts.pop("probe_pace_ms", None)
        if timing.long_call(probe_ms):
            # The long-call rule (timing.LONG_CALL_MS): counted, no budgets; the warm-up calls made
            # are the eager ones and the probe.
            result = timing.measure(call, device=problem.device, warmup=0, reps=timing.LONG_CALL_REPS)
            result = dataclasses.replace(result, warmup_calls=max(warmup, 1) + 1)
        else:
            result = timing.measure(call, device=problem.device, warmup=counted, reps=reps, warmup_ms=warmup_ms,
                                    warmup_max_ms=warmup_max_ms, rep_ms=rep_ms, previous_ms=probe_ms)
    return dataclasses.replace(result, **facts), prepared
