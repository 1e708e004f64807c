"""One cell = one measurement = one result row.

A cell builds its problem and asks the kernel whether it supports it; then it measures its three
parts (``longca.execution.cache.parts``): the gate (``gate``: the kernel against the exact
reference on the cell's mask at a short length, structure kept; a wrong kernel is never timed), the
timing (``timed``) and the memory one call needs (``memory``).  Each part found in the run's store
(``longca.execution.cache.store``) under its key is taken from there instead of measured again.  Every
failure becomes the row's ``status`` with a ``reason``; nothing here raises.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ... import kernels, timing_spec
from ...attention.flops import attention_flops
from ...attention.masks import kernel_takes
from ...attention.problem import Problem
from ...spec import ProblemSpec
from ...kernels.base import Kernel, Unsupported
from ...timing_spec import CountedTiming, TimingSpec
from ..cache import fingerprint, parts
from ..cache.store import Store
from . import env, fits
from .gate import gate_problem, measure_gate
from .call_memory import CallReading
from .memory import measure_memory
from .timed import time_kernel

STATUSES = ("ok", "unsupported", "oom", "wrong", "error", "timeout")


@dataclass(frozen=True, kw_only=True)
class MeasuredSpec(ProblemSpec, CountedTiming):
    """A problem and how a cell measures it: the settings kernel and CP cells share."""

    gate_seqlen: int = 512

    def problem(self, device: torch.device | None = None) -> Problem:
        """The problem on ``device`` (default: the spec's own; a CP rank passes its local GPU)."""
        return Problem.from_spec(self, device)


@dataclass(frozen=True, kw_only=True)
class CellSpec(MeasuredSpec, TimingSpec):
    """Everything that determines a kernel cell's number (besides the code): the problem, the gate's
    length, the kernel and its options, and how it is timed (``timing``)."""

    SETTINGS_NAME = "cell"

    kernel: str
    kernel_options: dict[str, Any] = field(default_factory=dict)  # config kernel_options[kernel]

    @property
    def timing(self) -> TimingSpec:
        return timing_spec.of(dataclasses.asdict(self))


def is_oom(exc: BaseException) -> bool:
    """A real allocation failure, on the GPU or on the host."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "out of memory" in str(exc))


def _release(device: torch.device, collect: bool) -> None:
    # A full gc pass costs ~0.1-0.3 s in a process holding torch.compile's and the kernel libraries'
    # objects (0.3 s an unsupported cell on an H200 box): paid per cell that is most of a small
    # cell's time in a resident process.  Tensors die with their references; only an exception's
    # traceback frames make cycles that hold them, so only then.
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _time(kernel: Kernel, problem, spec: "CellSpec", memory: CallReading | None) -> dict[str, Any]:
    result, prepared = time_kernel(kernel, problem, **spec.timing.harness_args(), memory=memory)
    timed = dataclasses.asdict(result)
    # A graph replay allocates nothing: the harness's peak says what earlier calls left behind, not
    # what the call needs.  The memory part measures that.
    timed.pop("peak_mem_bytes", None)
    return {**timed, "notes": json.dumps(kernel.notes(prepared), sort_keys=True)}


# Each part's provenance columns: ``<prefix>_at`` (UTC, when it was measured), ``<prefix>_on`` (the
# host), ``<prefix>_library`` (the kernel's libraries with their versions then), and for the timing
# ``timed_load_1m``.  Kept with the part's value in the store, so a row that reuses a part says when,
# where and with what that part was measured.
PROVENANCE_PREFIX = {"gate": "gate", "time": "timed", "memory": "memory"}


def _provenance(part: str, kernel: str) -> dict[str, Any]:
    prefix, here = PROVENANCE_PREFIX[part], env.now_here()
    out = {f"{prefix}_at": here["at"], f"{prefix}_on": here["on"], f"{prefix}_library": env.kernel_library(kernel)}
    if part == "time":  # a timing under load reads slow; a gate or a peak does not
        out["timed_load_1m"] = here["load_1m"]
    return out


def _gate_reason(kernel: Kernel, problem, target: int) -> str | None:
    """Why the kernel cannot run the gate's problem, if it cannot.  The gate checks the pattern's
    structure; a mask that degenerates at the cell's length (one document: plain causal) can be
    within a kernel that cannot run the structure, and a kernel the gate cannot check is not timed."""
    checked = gate_problem(problem, target)
    reason = kernel.supports(checked)
    if reason:
        return (f"the correctness gate checks this pattern's structure ({checked.mask_name} at {checked.seqlen} "
                f"tokens: {json.dumps(dict(checked.mask_params), default=str)}), which this kernel cannot run: {reason}")
    return None


class _Parts:
    """Each part of one cell from the store, or measured now (and then kept in the store), with the
    wall time of each part measured now (``walls``: part -> seconds)."""

    def __init__(self, spec: "CellSpec", store: Store | None):
        self.settings = dataclasses.asdict(spec)
        self.kernel = spec.kernel
        self.store = store
        self.reused: list[str] = []
        self.walls: dict[str, float] = {}

    def get(self, part: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if self.store is None:
            return self._measured(part, measure)
        code = fingerprint.part_fingerprint(part, self.kernel)
        key = parts.part_key(part, self.settings, code)
        value = self.store.get(part, key)
        if value is not None:
            self.reused.append(part)
            return value
        value = self._measured(part, measure)
        self.store.put(part, key, value, parts.part_settings(part, self.settings), code)
        return value

    def measured_now(self, part: str) -> bool:
        return part in self.walls

    def _measured(self, part: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return {**measure(), **_provenance(part, self.kernel)}
        finally:
            self.walls[part] = time.perf_counter() - started

    def wall_columns(self) -> dict[str, float | None]:
        """``<part>_wall_s`` for every part: its wall if measured by this cell, else None (reused from
        the store, or never reached)."""
        return {part_wall_column(part): self.walls.get(part) for part in parts.PARTS}


def part_wall_column(part: str) -> str:
    return f"{part}_wall_s"


def run_cell(spec: CellSpec, store: Store | None = None) -> dict[str, Any]:
    """Measure one cell (the parts ``store`` lacks); always returns a row (``status`` says what
    happened)."""
    started = time.time()
    row: dict[str, Any] = {"kind": "kernel", **dataclasses.asdict(spec), "status": "error", "reason": None}
    row["mask_params"] = json.dumps(spec.mask_params, sort_keys=True)
    row["kernel_options"] = json.dumps(spec.kernel_options, sort_keys=True)
    if row["head_dim_v"] == spec.head_dim:  # one head dim, however spelt: None, as the cell's key has it
        row["head_dim_v"] = None
    device = torch.device(spec.device)
    failure: tuple[str, str] | None = None
    raised = False
    cell_parts = _Parts(spec, store)
    kernel: Kernel | None = None
    try:
        kernel = kernels.get(spec.kernel).with_options(spec.kernel_options)
        problem = spec.problem()
        mask = problem.mask
        row.update(area=mask.area(), density=mask.density(),
                   flops=attention_flops(mask, spec.heads_q, spec.head_dim, spec.direction, spec.batch,
                                         problem.head_dim_v),
                   mask_params_resolved=json.dumps(dict(mask.params), sort_keys=True, default=str))
        reason = (kernel_takes(kernel, mask) or kernel.supports(problem)
                  or _gate_reason(kernel, problem, spec.gate_seqlen))
        if reason:
            failure = ("unsupported", reason)
        elif too_big := fits.refusal(kernel, problem):  # before the gate: an oom in seconds, nothing allocated
            failure = ("oom", too_big)
        else:
            gate = cell_parts.get("gate", lambda: measure_gate(kernel, problem, spec.gate_seqlen))
            row.update({k: v for k, v in gate.items() if k != "gate_ok"})
            if not gate["gate_ok"]:
                failure = ("wrong", gate["gate_detail"])
            else:
                # A graphed timing reads the memory part off its own set-up and probe call; else the
                # memory part makes a call of its own, warm already if the timing just ran here.
                reading = CallReading(device) if device.type == "cuda" else None
                row.update(cell_parts.get("time", lambda: _time(kernel, problem, spec, reading)))
                warm = cell_parts.measured_now("time")
                read = reading.part() if reading is not None and warm else None
                row.update(cell_parts.get("memory", lambda: read or measure_memory(kernel, problem, warm=warm)))
                row["tflops"] = row["flops"] / (row["median_ms"] * 1e-3) / 1e12
                # Higher time quantile = lower throughput quantile.
                row["tflops_p20"] = row["flops"] / (row["p80_ms"] * 1e-3) / 1e12
                row["tflops_p80"] = row["flops"] / (row["p20_ms"] * 1e-3) / 1e12
                row["status"] = "ok"
    except Unsupported as exc:  # the library refused the problem when asked (e.g. building its graph)
        failure = ("unsupported", str(exc))
    except Exception as exc:  # noqa: BLE001 — every failure becomes a result row
        raised = True
        if kernel is not None and kernel.refused(exc):  # its build lacks this (a head dim compiled out)
            failure = ("unsupported", f"{kernel.name}: this build of its library refused the problem: "
                                      f"{str(exc).strip().splitlines()[0]}")
        elif is_oom(exc):
            failure = ("oom", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        else:
            failure = ("error", "".join(traceback.format_exception_only(type(exc), exc)).strip())
    # Outside the except block, so the traceback's frames (and their tensors) are gone before release.
    _release(device, collect=raised)
    if failure:
        row["status"], row["reason"] = failure
    row["parts_reused"] = ",".join(cell_parts.reused) or None
    row.update(cell_parts.wall_columns())
    row.update(env.collect(device))
    row["kernel_library"] = env.kernel_library(spec.kernel)
    row["libraries"] = json.dumps(row["libraries"], sort_keys=True)
    row["wall_s"] = time.time() - started
    return row
