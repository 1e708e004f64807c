"""One cell = one measurement = one result row.

A cell builds its problem, asks the kernel whether it supports it, checks the kernel against the
exact reference on a reduced problem of the same mask family (never timing a wrong kernel), then
times it.  Every failure becomes the row's ``status`` with a ``reason``; nothing here raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ... import kernels
from ...attention import reference
from ...attention.flops import attention_flops
from ...attention.problem import Problem, ProblemSpec
from ...kernels.base import Kernel, Unsupported
from . import env, graphed, timing

STATUSES = ("ok", "unsupported", "oom", "wrong", "error", "timeout")

# Correctness tolerances on ‖out − ref‖ / ‖ref‖, per dtype of the kernel's inputs.  The reference is
# float64.  fp32 allows for TF32-class matrix units (~3e-4); bf16 has 8 mantissa bits, so one
# rounding of each operand already costs ~4e-3; backward gradients accumulate over the whole
# sequence, hence the looser bound.
GATE_TOLERANCE = {
    "fwd": {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2},
    "bwd": {torch.float64: 1e-9, torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2},
}


@dataclass(frozen=True, kw_only=True)
class MeasuredSpec(ProblemSpec):
    """A problem and how a cell measures it: the settings kernel and CP cells share."""

    warmup: int = 2
    reps: int = 5
    warmup_ms: float = 0.0      # and warm up for at least this long (GPU clocks settle; longca.execution.measure.timing)
    gate_seqlen: int = 512


@dataclass(frozen=True, kw_only=True)
class CellSpec(MeasuredSpec):
    """Everything that determines a kernel cell's number (besides the code)."""

    SETTINGS_NAME = "cell"

    kernel: str
    warmup_max_ms: float = 0.0  # > 0: warm up until steady, at most this long (longca.execution.measure.timing)
    rep_ms: float = 0.0         # > 0: repeat until this much time is filled, at least ``reps`` times
    cuda_graph: bool = False    # CUDA: time replays of the call captured in a graph (longca.execution.measure.graphed)
    kernel_options: dict[str, Any] = field(default_factory=dict)  # config kernel_options[kernel]


def is_oom(exc: BaseException) -> bool:
    """A real allocation failure, on the GPU or on the host."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "out of memory" in str(exc))


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
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
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(backward) for t in (q, k, v))
    ref = reference.attention(q64, k64, v64, problem.mask)
    errors = {"out": _relative_error(out, ref)}
    if backward:
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out.to(torch.float64))
        for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
            errors[name] = _relative_error(g, rg)
    tol = GATE_TOLERANCE[problem.direction][problem.dtype]
    worst_name = max(errors, key=errors.get)
    worst = errors[worst_name]
    detail = ", ".join(f"{n} {e:.2e}" for n, e in errors.items())
    return worst <= tol, worst, tol, f"relative L2 error vs float64 reference: {detail} (tolerance {tol:.0e})"


def timed_call(kernel: Kernel, problem: Problem) -> tuple[Callable[[], object], dict[str, Any]]:
    """The call a cell times on the full problem, and the kernel's prepared mask metadata (built
    here, untimed): the forward, or the backward through autograd of a forward made here (the
    forward is not part of a backward timing).  benchmarks/bench_pipeline.py times this same call
    with triton.testing.do_bench."""
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    prepared = kernel.prepare(problem)
    if problem.direction == "bwd":
        out = kernel.forward(q, k, v, prepared)

        def run():
            return torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    else:
        # Inputs require grad, as in training: kernels that save softmax statistics do so here too.
        def run():
            return kernel.forward(q, k, v, prepared)
    return run, prepared


@contextlib.contextmanager
def cell_call(kernel: Kernel, problem: Problem, warmup: int, cuda_graph: bool = False):
    """The call a cell times, as it times it: yields ``(call, prepared, facts)``; time ``call``
    inside the block.

    ``cuda_graph`` (CUDA only): the block runs on a side stream; ``warmup`` eager calls (compilation,
    plans, allocator growth) come first, then the call is captured in a CUDA graph and ``call``
    replays it (``longca.execution.measure.graphed``).  ``facts``: ``timed_via`` (which way) and ``host_ms``
    (what one eager call costs the CPU).  benchmarks/bench_pipeline.py times this same ``call``
    with triton.testing.do_bench."""
    stream = graphed.stream_for(problem.device, cuda_graph)
    with graphed.on(stream):
        run, prepared = timed_call(kernel, problem)
        facts: dict[str, Any] = {}
        call = run
        if stream is not None:
            for _ in range(max(warmup, 1)):
                run()
            facts["host_ms"] = graphed.host_ms(run, problem.device)
            replay, facts["timed_via"] = graphed.capture(run, stream)
            call = replay or run
        yield call, prepared, facts


def time_kernel(kernel: Kernel, problem: Problem, warmup: int, reps: int, warmup_ms: float = 0.0,
                warmup_max_ms: float = 0.0, rep_ms: float = 0.0, cuda_graph: bool = False):
    """Time forward or backward of the full problem; mask metadata is prepared untimed."""
    warmup = max(warmup, kernel.min_warmup)
    with cell_call(kernel, problem, warmup, cuda_graph) as (call, prepared, facts):
        result = timing.measure(call, device=problem.device, warmup=warmup, reps=reps, warmup_ms=warmup_ms,
                                warmup_max_ms=warmup_max_ms, rep_ms=rep_ms)
    return dataclasses.replace(result, **facts), prepared


def _release(device: torch.device, collect: bool) -> None:
    # A full gc pass costs ~0.1-0.3 s in a process holding torch.compile's and the kernel libraries'
    # objects (0.3 s an unsupported cell on an H200 box): paid per cell that is most of a small
    # cell's time in a resident process.  Tensors die with their references; only an exception's
    # traceback frames make cycles that hold them, so only then.
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_cell(spec: CellSpec) -> dict[str, Any]:
    """Measure one cell; always returns a row (``status`` says what happened)."""
    started = time.time()
    row: dict[str, Any] = {"kind": "kernel", **dataclasses.asdict(spec), "status": "error", "reason": None}
    row["mask_params"] = json.dumps(spec.mask_params, sort_keys=True)
    row["kernel_options"] = json.dumps(spec.kernel_options, sort_keys=True)
    device = torch.device(spec.device)
    failure: tuple[str, str] | None = None
    raised = False
    try:
        kernel = kernels.get(spec.kernel).with_options(spec.kernel_options)
        problem = spec.problem()
        mask = problem.mask
        row.update(area=mask.area(), density=mask.density(),
                   flops=attention_flops(mask, spec.heads_q, spec.head_dim, spec.direction, spec.batch),
                   mask_params_resolved=json.dumps(dict(mask.params), sort_keys=True, default=str))
        reason = kernel.supports(problem)
        if reason:
            failure = ("unsupported", reason)
        else:
            ok, err, tol, detail = correctness_gate(kernel, problem.reduced(spec.gate_seqlen))
            row.update(gate_error=err, gate_tolerance=tol, gate_detail=detail)
            if not ok:
                failure = ("wrong", detail)
            else:
                result, prepared = time_kernel(kernel, problem, spec.warmup, spec.reps, spec.warmup_ms,
                                               spec.warmup_max_ms, spec.rep_ms, spec.cuda_graph)
                row.update(dataclasses.asdict(result))
                row["notes"] = json.dumps(kernel.notes(prepared), sort_keys=True)
                row["tflops"] = row["flops"] / (result.median_ms * 1e-3) / 1e12
                # Higher time quantile = lower throughput quantile.
                row["tflops_p20"] = row["flops"] / (result.p80_ms * 1e-3) / 1e12
                row["tflops_p80"] = row["flops"] / (result.p20_ms * 1e-3) / 1e12
                row["status"] = "ok"
    except Unsupported as exc:  # the library refused the problem when asked (e.g. building its graph)
        failure = ("unsupported", str(exc))
    except Exception as exc:  # noqa: BLE001 — every failure becomes a result row
        raised = True
        if is_oom(exc):
            failure = ("oom", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        else:
            failure = ("error", "".join(traceback.format_exception_only(type(exc), exc)).strip())
    # Outside the except block, so the traceback's frames (and their tensors) are gone before release.
    _release(device, collect=raised)
    if failure:
        row["status"], row["reason"] = failure
    row.update(env.collect(device))
    row["libraries"] = json.dumps(row["libraries"], sort_keys=True)
    row["wall_s"] = time.time() - started
    return row
