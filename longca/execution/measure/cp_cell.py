"""One CP cell, measured by every rank of a ``torchrun`` job; rank 0 writes the row.

Each rank: build the strategy on the default process group, check it against the exact reference on
the cell's mask at the gate's length, its structure kept (``longca.execution.measure.gate``) (all ranks agree before anything is timed), then time its
forward or backward on the full problem.  Iterations start together (a barrier, untimed), and a
CP step is as slow as its slowest rank, so the headline time is the median over iterations of the
per-iteration maximum over ranks; each rank's own quantiles are kept too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ...attention import chunked_reference, reference
from ...attention.flops import attention_flops
from ...attention.problem import Problem
from ...cells import tokens_per_rank
from ...cp import build
from ...cp.base import Unsupported
from ...cp.comm import LocalCopyViolation, local_copies
from . import env, graphed, timing
from .cell import MeasuredSpec, is_oom
from .gate import gate_problem, relative_error

# The gate's tolerances on ‖x − ref‖ / ‖ref‖ (float64 reference), per dtype.  Partial blocks are
# merged in float32, so fp32 keeps TF32-class error; bf16 pays one rounding of every operand and of
# each block's output before the merge, and gradients sum over the whole sequence.
CP_GATE_TOLERANCE = {
    "fwd": {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2},
    "bwd": {torch.float64: 1e-9, torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2},
}


@dataclass(frozen=True, kw_only=True)
class CPSpec(MeasuredSpec):
    """Everything that determines a CP cell's number (besides the code).  ``seqlen`` is the total
    tokens; each rank holds seqlen / cp_size.  ``warmup_ms``: the same call count on every rank."""

    SETTINGS_NAME = "CP cell"

    strategy: str
    cp_size: int
    strategy_options: dict[str, Any] = field(default_factory=dict)
    ranks_per_node: int = 0     # placement only (how many nodes the cell spans); recorded, not used here
    # Time the step a second time with every collective a local copy (config ``cp_exposed_comm``).
    cp_exposed_comm: bool = False


def local_device(spec: CPSpec) -> torch.device:
    if spec.device == "cuda":
        index = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _agree(reason: str | None) -> str | None:
    """Every rank's reason (None = fine) → the first one any rank has, on every rank."""
    reasons: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reasons, reason)
    return next((r for r in reasons if r), None)


def _planned(spec: CPSpec, problem: Problem):
    """The strategy planned for ``problem`` on every rank, or the reason (agreed by all ranks)."""
    strategy, reason = None, None
    if problem.dtype not in CP_GATE_TOLERANCE[problem.direction]:
        # fp8: LongCA's strategies merge float32 partials of 16-bit blocks; fp8 is measured on
        # single-GPU kernel cells.
        name = str(problem.dtype).removeprefix("torch.")
        return None, f"CP strategies here take {', '.join(_dtype_names(CP_GATE_TOLERANCE[problem.direction]))}, not {name}"
    try:
        strategy = build(spec.strategy, None, spec.strategy_options)
        strategy.plan(problem.mask, problem.heads_q, problem.heads_kv, problem.head_dim, problem.device,
                      problem.dtype)
    except Unsupported as exc:
        reason = str(exc) or "unsupported"
    return strategy, _agree(reason)


def _dtype_names(dtypes) -> list[str]:
    return [str(d).removeprefix("torch.") for d in dtypes]


def _local_inputs(strategy, problem: Problem, seed: int):
    q, k, v, grad_out = problem.make_inputs(requires_grad=False, seed=seed)
    local = [strategy.dispatch(t).requires_grad_(True) for t in (q, k, v)]
    return (q, k, v, grad_out), local, strategy.dispatch(grad_out)


def _timed_inputs(strategy, problem: Problem, seed: int):
    """The rank's own shards of q, k, v (requiring grad) and of the upstream gradient, copied out of
    the global tensors they are drawn from, which are freed on return: a timed step's peak then holds
    what a training step's rank holds, not the whole sequence besides (rows record it:
    ``inputs_held``; rows measured before held the global tensors, ``cp_size`` shards of each)."""
    _, local, dout = _local_inputs(strategy, problem, seed)
    # Copies: a shard may be a view, which keeps its global tensor alive.
    return [t.detach().clone().requires_grad_(True) for t in local], dout.clone()


# What a timed step's rank holds of the inputs (a row's ``inputs_held``).
INPUTS_HELD = "shards"


# The gate's reference: float64, dense.  The full-size check's: float32, block by block, for lengths
# whose dense float64 scores do not fit (``scripts/cp_full_check.py``).
EXACT = (torch.float64, reference.attention)
CHUNKED_FLOAT32 = (torch.float32, chunked_reference.attention)


def correctness_gate(spec: CPSpec, problem: Problem, exact=EXACT):
    """(ok, worst error, tolerance, detail) on every rank, or raises Unsupported.  ``exact``: the
    reference as (dtype, attention(q, k, v, mask)), computed on rank 0."""
    strategy, reason = _planned(spec, problem)
    if reason:
        raise Unsupported(reason)
    backward = problem.direction == "bwd"
    (q, k, v, grad_out), (ql, kl, vl), gl = _local_inputs(strategy, problem, problem.seed + 1)
    out_l = strategy.attention(ql, kl, vl)
    tensors = {"out": strategy.undispatch(out_l.detach())}
    if backward:
        grads = torch.autograd.grad(out_l, (ql, kl, vl), gl)
        tensors.update(dq=strategy.undispatch(grads[0]), dk=strategy.undispatch(grads[1]),
                       dv=strategy.undispatch(grads[2]))
    verdict = None
    if dist.get_rank() == 0:
        # On rank 0's device, like the kernel gate: a float64 backward on the CPU took most of a
        # cp_size-1 cell's wall on a GPU.
        ref_dtype, attention = exact
        leaves = [t.detach().to(ref_dtype).requires_grad_(backward) for t in (q, k, v)]
        ref = attention(*leaves, problem.mask)
        refs = {"out": ref}
        if backward:
            refs.update(zip(("dq", "dk", "dv"), torch.autograd.grad(ref, leaves, grad_out.to(ref.dtype))))
        errors = {n: relative_error(tensors[n].to(refs[n].device), refs[n]) for n in refs}
        del leaves, ref, refs
        tol = CP_GATE_TOLERANCE[problem.direction][problem.dtype]
        worst = max(errors.values())
        detail = ", ".join(f"{n} {e:.2e}" for n, e in errors.items())
        verdict = (worst <= tol, worst, tol,
                   f"relative L2 error vs {str(ref_dtype).removeprefix('torch.')} reference at seqlen {problem.seqlen}: {detail} "
                   f"(tolerance {tol:.0e})")
    strategy.close()
    box = [verdict]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _max_over_ranks(n: int) -> int:
    """Every rank makes the same number of warm-up calls (each is a collective): the largest asked."""
    return max(_gather(int(n)))


def _capture(run, stream: torch.cuda.Stream) -> tuple[Any, Any, str]:
    """``run`` captured on ``stream``: ``(graph, its outputs, "graph")``, or ``(None, None, "eager: <why>")``.

    Thread-local capture: NCCL's watchdog thread queries the events of earlier collectives while a
    rank captures, which a global capture forbids.  Every rank captures; the caller replays only if
    all of them could (a graph holds collectives, so all ranks replay or none)."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            outputs = run()
    except Exception as exc:  # noqa: BLE001 — an uncapturable step is timed eagerly, and says so
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        del graph
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(stream.device)
        return None, None, f"eager: capture failed: {type(exc).__name__}: {reason[:200]}"
    return graph, outputs, "graph"


def _replay_error(graph, outputs, run) -> float:
    """The largest relative error of a replay's outputs against an eager step's (both on this rank):
    a graph that baked in a host-side value would time a different computation."""
    graph.replay()
    eager = run()
    pairs = zip(outputs, eager) if isinstance(eager, (tuple, list)) else [(outputs, eager)]
    return max(relative_error(a.float(), b.float()) for a, b in pairs)


def time_strategy(spec: CPSpec, problem: Problem, local_comm: bool = False):
    """The strategy's step timed on every rank: ``(strategy, samples, peak, comm_bytes, timed_wall_s,
    facts)``; ``local_comm``: each step with every collective a local copy of its bytes
    (``longca.cp.comm.local_copies``), the same way timed.  With ``cuda_graph`` (as kernel cells on
    a GPU), the step — its collectives with it — is captured after eager warm-up calls and its replays are timed, so the figure is the GPU's work and
    not how fast Python issues a step of many small calls; ``facts`` say which way it was timed
    (``timed_via``) and what one eager step costs the CPU (``host_ms``, the slowest rank's)."""
    strategy, reason = _planned(spec, problem)
    if reason:
        raise Unsupported(reason)
    device = problem.device
    stream = graphed.stream_for(device, spec.cuda_graph)
    facts: dict[str, Any] = {}

    def setup():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    with graphed.on(stream):
        (q, k, v), dout = _timed_inputs(strategy, problem, problem.seed)
        if problem.direction == "bwd":
            out = strategy.attention(q, k, v)

            def step():
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        else:
            def step():
                return strategy.attention(q, k, v)

        def run():
            if not local_comm:
                return step()
            with local_copies():
                return step()

        # What one timed call sends, counted on an untimed call of its own.
        strategy.comm_bytes = 0
        run()
        comm_bytes = strategy.comm_bytes
        call, graph, eager_peak = run, None, 0
        if stream is not None:
            # Replays allocate nothing (the graph keeps its memory in a pool of its own), so a
            # step's peak memory is read over these eager steps.
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            for _ in range(max(spec.warmup, 1)):
                run()
            torch.cuda.synchronize(device)
            eager_peak = torch.cuda.max_memory_allocated(device)
            facts["host_ms"] = max(_gather(graphed.host_ms(run, device)))
            setup()
            graph, outputs, how = _capture(run, stream)
            failures = [r for r in _gather(None if graph is not None else how) if r]
            if not failures:
                error = max(_gather(_replay_error(graph, outputs, run)))
                tolerance = CP_GATE_TOLERANCE[problem.direction][problem.dtype]
                if not error <= tolerance:
                    failures = [f"eager: the replayed step disagrees with an eager one (relative error "
                                f"{error:.2e} > {tolerance:.0e})"]
            facts["timed_via"] = failures[0] if failures else "graph"
            if failures:
                graph = outputs = None
            else:
                call = graph.replay
        began = time.perf_counter()
        samples, peak = timing.sample(call, device=device, warmup=spec.warmup, reps=spec.reps, setup=setup,
                                      warmup_ms=spec.warmup_ms, agree=_max_over_ranks)
        timed_wall_s = time.perf_counter() - began  # the warm-up and timed calls: what a cell is for
    if peak is not None:
        peak = max(peak, eager_peak)
    del graph
    strategy.close()
    return strategy, samples, peak, comm_bytes, timed_wall_s, facts


def _gather(value):
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def run_cell(spec: CPSpec, on_failure=None) -> dict[str, Any] | None:
    """Measure one CP cell on every rank; rank 0 returns the row, the others None.  ``on_failure(status,
    exc)``: called on each rank the moment its measurement fails (``first_failure.Recorder.note``:
    rank 0's row may otherwise name its own later failure, a consequence of another rank's)."""
    started = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    row: dict[str, Any] = {"kind": "cp", **dataclasses.asdict(spec), "status": "error", "reason": None}
    row["mask_params"] = json.dumps(spec.mask_params, sort_keys=True)
    row["strategy_options"] = json.dumps(spec.strategy_options, sort_keys=True)
    row["tokens_per_rank"] = tokens_per_rank(spec.seqlen, spec.cp_size)
    if row["head_dim_v"] == spec.head_dim:
        row["head_dim_v"] = None
    row["backend"] = dist.get_backend()
    failure = None
    device = torch.device("cpu")
    try:
        if world != spec.cp_size:
            raise ValueError(f"cell wants cp_size {spec.cp_size}, torchrun started {world} ranks")
        device = local_device(spec)
        problem = spec.problem(device)
        mask = problem.mask
        row.update(area=mask.area(), density=mask.density(),
                   flops=attention_flops(mask, spec.heads_q, spec.head_dim, spec.direction, spec.batch,
                                         problem.head_dim_v),
                   mask_params_resolved=json.dumps(dict(mask.params), sort_keys=True, default=str))
        if problem.split_head_dim:  # the grid's own shape, which CP runs, has one head dim
            raise Unsupported("CP strategies take one head dim for q, k and v")
        checked = gate_problem(problem, spec.gate_seqlen)
        gate_began = time.time()
        ok, err, tol, detail = correctness_gate(spec, checked)
        row["gate_wall_s"] = time.time() - gate_began
        row.update(gate_error=err, gate_tolerance=tol, gate_detail=detail, gate_seqlen=checked.seqlen,
                   gate_area=checked.mask.area())
        if not ok:
            failure = ("wrong", detail)
        else:
            strategy, samples, peak, comm_bytes, timed_wall_s, facts = time_strategy(spec, problem)
            row.update(facts)
            every = _gather({"samples": samples, "peak": peak, "comm": comm_bytes, "area": strategy.rank_area,
                             "timed_wall_s": timed_wall_s})
            row["timed_wall_s"] = max(r["timed_wall_s"] for r in every)
            slowest = [max(r["samples"][i] for r in every) for i in range(len(samples))]
            result = timing.summarize(slowest)
            row.update({k: getattr(result, k) for k in ("median_ms", "p20_ms", "p80_ms", "min_ms", "max_ms")})
            per_rank = [timing.summarize(r["samples"]) for r in every]
            row["rank_median_ms"] = [t.median_ms for t in per_rank]
            row["rank_p20_ms"] = [t.p20_ms for t in per_rank]
            row["rank_p80_ms"] = [t.p80_ms for t in per_rank]
            peaks = [r["peak"] for r in every]
            row["rank_peak_mem_bytes"] = peaks if all(p is not None for p in peaks) else None
            row["peak_mem_bytes"] = max(peaks) if row["rank_peak_mem_bytes"] else None
            row["inputs_held"] = INPUTS_HELD
            row["rank_comm_bytes"] = [r["comm"] for r in every]
            row["comm_bytes"] = max(row["rank_comm_bytes"])
            row["rank_area"] = [r["area"] for r in every]
            row["layout"] = strategy.layout.name if strategy.layout else None
            row["notes"] = json.dumps(strategy.notes, sort_keys=True, default=str)
            row["local_kernel"] = strategy.notes.get("local_kernel")  # what `auto` resolved to
            per_gpu = row["flops"] / world
            row["tflops_per_gpu"] = per_gpu / (result.median_ms * 1e-3) / 1e12
            row["tflops_per_gpu_p20"] = per_gpu / (result.p80_ms * 1e-3) / 1e12
            row["tflops_per_gpu_p80"] = per_gpu / (result.p20_ms * 1e-3) / 1e12
            row["status"] = "ok"
            if spec.cp_exposed_comm:
                row.update(exposed_comm(spec, problem, row))
    except Unsupported as exc:
        failure = ("unsupported", str(exc))
        if on_failure:
            on_failure("unsupported", exc)
    except Exception as exc:  # noqa: BLE001 — every failure becomes a row
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if is_oom(exc):
            failure = ("oom", text.splitlines()[0])
        elif "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
            failure = ("timeout", text)
        else:
            failure = ("error", text)
        if on_failure:
            on_failure(failure[0], exc)
    if failure:
        row["status"], row["reason"] = failure
    environment = env.collect(device)
    row["local_kernel"] = (row.get("local_kernel") or (spec.strategy_options or {}).get("local_kernel")
                           or _default_local_kernel(spec))
    try:
        hosts = _gather(environment["hostname"]) if failure is None or failure[0] != "timeout" else None
    except Exception:  # noqa: BLE001 — a broken group still gets its row written
        hosts = None
    row.update({k: environment[k] for k in ("device_name", "cpu_name", "torch_version", "cuda_version",
                                             "driver_version", "slurm_job_id")})
    row["libraries"] = json.dumps(environment["libraries"], sort_keys=True)
    row["hostnames"] = hosts or [environment["hostname"]]
    # Nodes = torchrun agents (one per node under srun), not distinct host names.
    row["nodes"] = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    row["nccl_version"] = (".".join(map(str, torch.cuda.nccl.version()))
                           if device.type == "cuda" else None)
    row["wall_s"] = time.time() - started
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row if rank == 0 else None


def exposed_comm(spec: CPSpec, problem: Problem, row: dict[str, Any]) -> dict[str, Any]:
    """The step timed again (same warm-up and repetitions, same slowest-rank reduction) with every
    collective a local copy of the same bytes, on every rank: ``step_ms_local_comm`` and its spread,
    ``exposed_comm_ms`` = the row's median less it (as measured, not clamped: within the spread a tie),
    ``exposed_comm_via`` how, or why not (a library's own collectives cannot be switched)."""
    from ...cp import get

    out: dict[str, Any] = dict.fromkeys(("step_ms_local_comm", "step_ms_local_comm_p20", "step_ms_local_comm_p80",
                                         "exposed_comm_ms", "local_comm_wall_s"))
    why = get(spec.strategy).own_collectives
    if why:
        return {**out, "exposed_comm_via": f"not measured: {spec.strategy}: {why}"}
    try:
        _, samples, _, _, wall_s, facts = time_strategy(spec, problem, local_comm=True)
        violation = None
    except LocalCopyViolation as exc:
        samples, wall_s, facts, violation = None, None, {}, str(exc)
    if (violation := _agree(violation)):
        return {**out, "exposed_comm_via": f"not measured: {violation}"}
    every = _gather({"samples": samples, "wall_s": wall_s})
    slowest = [max(r["samples"][i] for r in every) for i in range(len(samples))]
    local = timing.summarize(slowest)
    out.update(step_ms_local_comm=local.median_ms, step_ms_local_comm_p20=local.p20_ms,
               step_ms_local_comm_p80=local.p80_ms, local_comm_wall_s=max(r["wall_s"] for r in every))
    via, local_via = row.get("timed_via"), facts.get("timed_via")
    if via != local_via:  # a graph replay against an eager step measures two different things
        return {**out, "exposed_comm_via": f"not comparable: step timed {via}, local-copy step {local_via}"}
    out["exposed_comm_ms"] = row["median_ms"] - local.median_ms
    out["exposed_comm_via"] = "local_copy" + (f" ({via})" if via else "")
    return out


def _default_local_kernel(spec: CPSpec) -> str | None:
    from ...cp import get

    try:
        return get(spec.strategy).options.get("local_kernel")
    except KeyError:
        return None
