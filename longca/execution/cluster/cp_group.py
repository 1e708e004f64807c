"""CP cells measured by a resident ``torchrun`` group: one start-up per GPU set, not per cell.

A fresh ``torchrun`` per cell pays for Python, torch, CUDA and NCCL on every rank each time: on
2 × H100 that was 13-27 s of wall per cell for about 1.5 s of GPU work.  Here a cell's client
(``longca cp-cell`` with a warm isolation) takes the slots of ``cp_size`` GPUs that are free
together (two cp_size-2 cells share a 4-GPU host), connects to the group that serves exactly that
GPU set, starting it on first use (``longca cp-group``, a ``torchrun`` job whose ranks run
``longca.execution.processes.cp_resident``), hands over the cell's settings and writes the row it gets
back.  The group's name carries the worker key (interpreter, LongCA's sources, ``LONGCA_*``
environment), so no group runs stale code, and the cell's launch environment (config ``cp_env``),
set in the group's environment when it starts, so a group serves only cells of its own preset.

Failures stay rows: a group that does not reply within the cell's limit is killed whole (its
process group) and the row is ``timeout``; one that dies gives an ``error`` row with the end of
its log.  A group exits after ``LONGCA_WORKER_IDLE_S`` seconds without a cell (default 120) and
after a ``timeout`` or ``error`` row.  Never imports torch.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import sys
import time

from ... import cp_env
from ..processes import gpu_slots
from ..processes.wire import recv_msg, send_msg
from ..processes.worker import DEFAULT_IDLE_S, WorkerError, runtime_dir, start_server, worker_key

# The isolations under which CP cells use a resident group (a cluster job's cells fork instead:
# nothing may outlive the job, longca.execution.cluster.placement.isolation).
RESIDENT = frozenset({"worker", "resident"})


def threads_per_rank(threads: int, ranks: int) -> int:
    """A cell's CPU threads shared by the ``ranks`` on one node (0: torch's default)."""
    return max(1, threads // ranks) if threads else 0


def group_name(device: str, devices: list[str], threads: int, environ: dict | None = None,
               launch: str = cp_env.DEFAULT) -> str:
    where = "_".join(d.replace("/", "_") for d in devices) if device == "cuda" else f"cpu{len(devices)}"
    preset = "" if launch == cp_env.DEFAULT else f"-e{launch}"
    return f"{worker_key(environ)}-cp-{where}-t{threads}{preset}"


def launch_command(nproc: int, device: str, socket_path: str, *, idle_s: float, collective_timeout_s: float,
                   rank_threads: int) -> list[str]:
    """The ``torchrun`` command a group runs (``longca cp-group`` execs it)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "longca.execution.processes.cp_resident", "--socket", socket_path, "--device", device,
           "--idle", f"{idle_s:g}", "--timeout", f"{collective_timeout_s:g}"]
    if rank_threads:
        cmd += ["--threads", str(rank_threads)]
    return cmd


def exec_group(args) -> int:
    """``longca cp-group``: become the group's ``torchrun`` (same pid, so the client's kill reaches it)."""
    env = cp_env.environ(args.cp_env)  # before any rank starts: CUDA and NCCL read them at start-up
    if args.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = args.devices
    idle = float(os.environ.get("LONGCA_WORKER_IDLE_S", DEFAULT_IDLE_S))
    cmd = launch_command(args.nproc, args.device, args.socket, idle_s=idle,
                         collective_timeout_s=args.collective_timeout, rank_threads=args.threads)
    os.execve(sys.executable, cmd, env)
    return 1  # not reached


def _slots(settings: dict, nproc: int) -> list:
    if settings.get("device") != "cuda":
        return []
    return gpu_slots.acquire_set(gpu_slots.visible_devices(), nproc)


def _log_tail(name: str) -> str:
    path = runtime_dir() / f"{name}.log"
    try:
        lines = path.read_text(errors="replace").strip().splitlines()[-6:]
    except OSError:
        return f"(no log at {path})"
    return " | ".join(lines)


def measure(settings: dict, *, cell_id: str, fingerprint: str | None, timeout_s: float,
            collective_timeout_s: float, threads: int, failures: str | None = None) -> tuple[str, object]:
    """The cell measured by its GPU set's group: ``("row", row)``, or ``("timeout", None)`` /
    ``("error", reason)`` when the group gave no row.  ``failures``: the folder where each rank
    records its first failure (``measure.first_failure``)."""
    nproc = int(settings["cp_size"])
    device = settings.get("device", "cpu")
    slots = _slots(settings, nproc)
    devices = [s.device for s in slots] or ["cpu"] * nproc
    launch = cp_env.of(settings)
    name = group_name(device, devices, threads, launch=launch)
    # One cell at a time per group (GPU cells already hold their slots; CPU cells queue here), and
    # the cell's limit runs from when it has the group.
    with open(runtime_dir() / f"{name}.busy", "w") as busy:
        fcntl.flock(busy, fcntl.LOCK_EX)
        try:
            command = ["cp-group", "--nproc", str(nproc), "--device", device, "--devices", ",".join(devices),
                       "--threads", str(threads_per_rank(threads, nproc)),
                       "--collective-timeout", f"{collective_timeout_s:g}", "--cp-env", launch]
            try:
                sock = start_server(name, command)
            except WorkerError as exc:
                return "error", f"the CP group did not start: {exc}"
            cell = {"settings": settings, "cell_id": cell_id, "fingerprint": fingerprint, "failures": failures}
            return _exchange(sock, cell, name, timeout_s)
        finally:
            for slot in slots:
                slot.release()


def _exchange(sock: socket.socket, cell: dict, name: str, timeout_s: float) -> tuple[str, object]:
    deadline = time.monotonic() + timeout_s if timeout_s else None
    pgid = None
    with sock:
        try:
            send_msg(sock, cell)
            for _ in range(2):  # first the group's process group id, then the row
                sock.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
                msg, _ = recv_msg(sock)
                if "pgid" in msg:
                    pgid = msg["pgid"]
                    continue
                return "row", msg
        except (TimeoutError, socket.timeout):
            if pgid is not None:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return "timeout", None
        except (ConnectionError, OSError) as exc:
            return "error", f"the CP group ended without a row ({exc}): {_log_tail(name)}"
    return "error", f"the CP group sent no row: {_log_tail(name)}"
