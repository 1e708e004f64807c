"""One cell's settings → its result row, whatever the measuring process does.

The measurement (``longca.execution.measure.cell.run_cell``) runs in a forked child (``longca.execution.processes.isolate``); a child
that segfaults, aborts, hangs past the time limit or is killed for memory still yields a row, built
here from the settings with the status and a reason.  GPU cells first take a GPU slot
(``longca.execution.processes.gpu_slots``) and run with ``CUDA_VISIBLE_DEVICES`` set to it.

Used both by ``longca run-cell --isolation fork`` (in the cell's own process) and by the warm
worker (``longca.execution.processes.worker``), which forks one child per cell from a process that imported torch once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from . import gpu_slots, isolate
from ..measure import load_measuring_code, measure_cell
from ..cache import fingerprint, store


@dataclass(frozen=True)
class Limits:
    """Per-cell limits (config ``limits``); not part of the cache key: they do not change a number."""

    timeout_s: float | None = 600.0
    memory_mb: int | None = None  # extra address space the child may map (CPU cells only)
    gpus: int = 0                 # 0: every visible GPU


def preload() -> None:
    """Import what every cell needs, once, before forking (children inherit it: the worker saves
    ~1-2 s per cell this way).  Only imports: CUDA and OpenMP threads must not start here, or the
    forked children inherit a broken state."""
    import pkgutil

    import torch  # noqa: F401

    from ... import kernels

    load_measuring_code()
    for family in pkgutil.iter_modules(kernels.__path__):
        try:
            __import__(f"{kernels.__name__}.{family.name}")
        except Exception:  # noqa: BLE001 — the cell's own import reports it in its row
            pass


def warm_fingerprints() -> None:
    """Hash every kernel's code once in a long-lived server (a worker or lane), before it forks: the
    processes it forks per cell inherit the hashes instead of reading and parsing the same files
    again (0.18 s a cell on a 2-core machine)."""
    from ... import kernels

    for name in kernels.names():
        try:
            fingerprint.kernel_fingerprint(name)
        except Exception:  # noqa: BLE001 — a broken kernel's row says why; its cell hashes it then
            pass


def _measure(settings: dict[str, Any], threads: int, device: str | None, store_root: str | None) -> dict[str, Any]:
    """In the child: select the GPU before CUDA exists, then measure (run_cell never raises)."""
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    import torch

    if threads:
        torch.set_num_threads(threads)
    return measure_cell(settings, store.at(store_root))


def failure_row(settings: dict[str, Any], status: str, reason: str, wall_s: float) -> dict[str, Any]:
    """The row of a cell whose measuring process gave none: its identity, status and reason."""
    row = {"kind": "kernel", **settings, "status": status, "reason": reason, "wall_s": wall_s,
           "hostname": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
    for key in ("mask_params", "kernel_options"):  # JSON strings in the table, as run_cell writes them
        if key in row:
            row[key] = json.dumps(row[key], sort_keys=True)
    return row


def outcome_row(settings: dict[str, Any], outcome: isolate.Outcome, limits: Limits) -> dict[str, Any]:
    if outcome.returned:
        return outcome.value
    if outcome.timed_out:
        return failure_row(settings, "timeout", f"exceeded limits.cell_timeout_s = {limits.timeout_s:g} s; "
                                                f"killed after {outcome.wall_s:.1f} s", outcome.wall_s)
    if outcome.signal == signal.SIGKILL:
        # LongCA sends SIGKILL only on timeout (handled above); the usual other sender is the
        # kernel's (or the cgroup's) out-of-memory killer.
        return failure_row(settings, "oom", f"{outcome.describe()}, not sent by LongCA: most likely the "
                                            "out-of-memory killer", outcome.wall_s)
    return failure_row(settings, "error", outcome.describe(), outcome.wall_s)


def measure(settings: dict[str, Any], *, cell_id: str, threads: int = 0, limits: Limits = Limits(),
            stdio: tuple[int, int] | None = None, abort_fd: int | None = None,
            store_root: str | None = None) -> dict[str, Any]:
    """Measure one cell in a forked child and return its row (never raises for a cell's failure).

    Call it only from a process that has not yet run a torch operation: GNU OpenMP's thread pool
    does not survive a fork, and the child would hang (and be reported as a timeout).  ``longca
    run-cell`` and the worker only import before they fork."""
    started = time.monotonic()
    slot = None
    if settings.get("device", "cpu") == "cuda":
        # Blocks until a device is free: Snakemake may start more GPU cells than there are GPUs.
        slot = gpu_slots.acquire(gpu_slots.visible_devices(limits.gpus))
    try:
        memory = limits.memory_mb * 2**20 if limits.memory_mb and not slot else None
        outcome = isolate.call(lambda: _measure(settings, threads, slot.device if slot else None, store_root),
                               timeout_s=limits.timeout_s, memory_bytes=memory, stdio=stdio, abort_fd=abort_fd)
    finally:
        if slot:
            slot.release()
    row = stamp(outcome_row(settings, outcome, limits), cell_id, settings.get("kernel"), slot.device if slot else None)
    row.setdefault("wall_s", time.monotonic() - started)
    return row


def stamp(row: dict, cell_id: str, kernel: str | None, gpu_slot: str | None) -> dict:
    """What every kernel row says of where it came from, whichever process measured it: its cell,
    the fingerprint of its code and the GPU it ran on (``None``: no GPU slot)."""
    row["cell_id"] = cell_id
    row["fingerprint"] = _fingerprint(kernel)
    if gpu_slot is not None:
        row["gpu_slot"] = gpu_slot
    return row


def _fingerprint(kernel: str | None) -> str | None:
    try:
        return fingerprint.kernel_fingerprint(kernel)
    except Exception:  # noqa: BLE001 — an unknown or broken kernel has no fingerprint, its row says why
        return None
