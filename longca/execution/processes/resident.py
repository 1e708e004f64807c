"""Resident measurement: one long-lived measuring process per device, isolation kept.

A GPU's time should go to measuring.  Forking a fresh child per cell makes every cell pay for a
CUDA context, the kernel libraries' imports (``flash_attn.cute``: 6.4 s on an H200 box), their JIT
compilation, cuDNN plan selection and Inductor's compilation again: 1.4-19 s a cell where the
measurement itself takes a fraction of a second.  Here each device has one *lane*:

* the client (``longca run-cell --isolation resident``; never imports torch) takes the device's
  slot (``longca.execution.processes.gpu_slots``; the lane ``cpu`` for CPU cells), connects to the device's lane,
  starting it on first use (``longca.execution.processes.worker.start_server``), hands over the cell's settings and
  its own stdout/stderr (the cell's log), and writes the row it gets back;
* the lane (``longca lane``) is a supervisor: it imports torch once (never CUDA) and forks the
  *measuring process* on the first cell and again after one died.  It passes each cell on and
  watches: a reply is the row; a measuring process that dies (segfault, abort, the OOM killer)
  gives a row naming the signal or exit status; one that outlives ``limits.cell_timeout_s``, or
  whose client hung up, is killed.  The next cell gets a fresh measuring process;
* the measuring process selects the device, then runs cells in-process one after another,
  keeping its CUDA context, imported libraries, compiled kernels, cuDNN plans and JIT caches.  An
  out-of-memory error is caught by ``run_cell`` (memory released, an ``oom`` row); an error that
  leaves the CUDA context unusable ends the process after its row is sent.  An out-of-memory error
  (an ``oom`` row, or a graph capture that ran out and left the cell timed eagerly) in a process
  that has measured other cells is measured again in a fresh one, so such a row always says that
  the cell does not fit, not that earlier cells' leftovers filled the device.

Slots make lanes exclusive per host: one cell at a time per device, whichever workflow run asks.
Snakemake may therefore keep many clients in flight (they queue on the slot), so the next cell is
waiting when one finishes and the device does not idle through Snakemake's per-job overhead.
Lanes exit after ``LONGCA_WORKER_IDLE_S`` seconds (default 120) without a cell; their names carry
the worker key (interpreter, LongCA's sources, ``LONGCA_*`` environment), so editing LongCA starts
fresh lanes and no process runs stale code.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import Any

from . import gpu_slots, job_scope
from ..measure import measure_cell
from ..cache import store
from .runner import failure_row, stamp
from .wire import recv_msg, send_msg
from .worker import DEFAULT_IDLE_S, WorkerError, prestart, start_server, worker_key

CPU_LANE = "cpu"
# Errors after which a CUDA context is unusable: the process ends after its row and the next cell
# gets a fresh one (an ordinary exception, an OOM included, leaves the context usable).
POISONED_CONTEXT = ("CUDA error", "illegal memory access", "device-side assert", "unspecified launch failure",
                    "CUDA_ERROR")


def lane_devices(settings: dict[str, Any], gpus: int) -> list[str]:
    return gpu_slots.visible_devices(gpus) if settings.get("device", "cpu") == "cuda" else [CPU_LANE]


def lane_name(device: str, environ: dict | None = None) -> str:
    return f"{worker_key(environ)}-lane-{device.replace('/', '_')}"


# ---------------------------------------------------------------- client

def prestart_lane(device: str) -> None:
    """Start the lane of ``device`` ahead of its first cell (``longca.execution.processes.worker.prestart``)."""
    prestart(lane_name(device), ["lane", "--device", device])


def request(settings: dict[str, Any], *, cell_id: str, threads: int, timeout_s: float | None,
            memory_mb: int | None, gpus: int) -> dict[str, Any]:
    """Measure one cell in its device's resident process; returns its row.  Never imports torch."""
    with gpu_slots.acquire(lane_devices(settings, gpus)) as slot:
        sock = start_server(lane_name(slot.device), ["lane", "--device", slot.device])
        with sock:
            send_msg(sock, {"settings": settings, "cell_id": cell_id, "threads": threads,
                             "timeout_s": timeout_s, "memory_mb": memory_mb, "store": store.root_from_env()},
                      fds=[sys.stdout.fileno(), sys.stderr.fileno()])
            try:
                reply, _ = recv_msg(sock)
            except (ConnectionError, OSError) as exc:
                raise WorkerError(f"the LongCA lane for device {slot.device} died without a reply "
                                  f"for {cell_id}: {exc}") from exc
    return reply


# ---------------------------------------------------------------- the lane (supervisor)

class Lane:
    """The supervisor of one device's measuring process."""

    def __init__(self, device: str):
        self.device = device
        self.pid: int | None = None
        self.channel: socket.socket | None = None
        self.started = 0  # measuring processes started: 1 + the ones that died or were killed

    def measure(self, msg: dict[str, Any], fds: list[int], client: socket.socket) -> dict[str, Any] | None:
        """The cell's row, or None when the client hung up (then there is nobody to answer)."""
        row, fresh_retry = self._measure_once(msg, fds, client)
        if fresh_retry:
            # Out of memory in a process that had measured other cells: what they left behind
            # (cached cuDNN graphs and their workspaces, compiled kernels, a fragmented allocator)
            # may be what did not fit, so the cell is measured again in a fresh process, whose row
            # stands (with a time limit of its own).  On an H100, 64K cells that fit alone ran out
            # after others this way.
            print(f"lane {self.device}: {msg.get('cell_id')} ran out of memory after other cells; "
                  "measuring it again in a fresh measuring process", flush=True)
            row, _ = self._measure_once(msg, fds, client)
            if row is not None and row.get("status") == "oom":
                row["reason"] = f"{row.get('reason')} (also in a fresh measuring process)"
        return row

    def _measure_once(self, msg: dict[str, Any], fds: list[int],
                      client: socket.socket) -> tuple[dict[str, Any] | None, bool]:
        """(the row or None, whether the measuring process asks for the cell to be measured again
        in a fresh one)."""
        from . import isolate
        from .runner import Limits, outcome_row

        started = time.monotonic()
        cell = {k: msg.get(k) for k in ("settings", "threads", "memory_mb", "store")}
        if self.pid is None:
            self._spawn()
        try:
            send_msg(self.channel, cell, fds=fds)
        except OSError:  # it died between cells (nothing of this cell's): a fresh one takes it
            self._kill()
            self._spawn()
            send_msg(self.channel, cell, fds=fds)
        timeout = msg.get("timeout_s")
        deadline = None if not timeout else started + timeout
        while True:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0)
            ready, _, _ = select.select([self.channel, client], [], [], wait)
            if self.channel in ready:
                try:
                    reply, _ = recv_msg(self.channel)
                    if reply.get("retire"):  # its CUDA context is gone, or it asks for a fresh try: it exits
                        self._reap()
                    return reply["row"], bool(reply.get("fresh_retry"))
                except (ConnectionError, OSError):
                    status = self._reap()
                    return outcome_row(msg["settings"], isolate.died(status, time.monotonic() - started),
                                       Limits(timeout_s=timeout)), False
            if client in ready:  # the client can only hang up (it sends nothing more)
                self._kill()
                return None, False
            if not ready:  # past the time limit
                self._kill()
                return outcome_row(msg["settings"], isolate.Outcome(timed_out=True, wall_s=time.monotonic() - started),
                                   Limits(timeout_s=timeout)), False

    def _spawn(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        lane = os.getpid()
        pid = os.fork()
        if pid == 0:
            parent.close()
            code = 0
            try:
                job_scope.die_with_parent(lane)
                _measuring_process(child, self.device)
            except BaseException:  # noqa: BLE001 — the lane sees the exit status
                import traceback

                traceback.print_exc()
                code = 70
            finally:
                os._exit(code)
        child.close()
        self.pid, self.channel = pid, parent
        self.started += 1
        print(f"lane {self.device}: measuring process {pid} started (#{self.started})", flush=True)

    def _kill(self) -> None:
        if self.pid is not None:
            from .isolate import kill_group

            kill_group(self.pid)
            self._reap()

    def _reap(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        self.channel.close()
        print(f"lane {self.device}: measuring process {self.pid} ended ({status})", flush=True)
        self.pid, self.channel = None, None
        return status

    def close(self) -> None:
        self._kill()


@functools.lru_cache(maxsize=None)
def serve(sock_path: str, device: str, idle_s: float | None = None) -> int:
    """The lane's loop: one client (one cell) at a time; exits after ``idle_s`` without one."""
    idle_s = float(os.environ.get("LONGCA_WORKER_IDLE_S", DEFAULT_IDLE_S)) if idle_s is None else idle_s
    from .runner import preload, warm_fingerprints

    preload()  # imports only: the measuring process is forked from here, before any CUDA
    warm_fingerprints()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(128)
    server.settimeout(0.5)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    lane = Lane(device)
    last_active = time.monotonic()
    scope = job_scope.current()  # inside a cluster job: the lane ends with the job
    print(f"longca lane {os.getpid()} for device {device} serving {sock_path} (idle exit after {idle_s:g} s"
          f"{f'; ends with job scope {scope}' if scope else ''})", flush=True)
    try:
        while time.monotonic() - last_active <= idle_s:
            if scope and not job_scope.alive(scope):
                print(f"longca lane {os.getpid()}: job scope {scope} ended; exiting", flush=True)
                break
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.setblocking(True)
                try:
                    msg, fds = recv_msg(conn, max_fds=2)
                except (ConnectionError, OSError):
                    continue
                try:
                    row = lane.measure(msg, fds, conn)
                finally:
                    for fd in fds:
                        os.close(fd)
                if row is not None:
                    stamp(row, msg["cell_id"], msg["settings"].get("kernel"), None if device == CPU_LANE else device)
                    try:
                        send_msg(conn, row)
                    except OSError:
                        pass  # the client is gone; its job failed without a row and reruns
            last_active = time.monotonic()
        return 0
    finally:
        lane.close()
        # Only our own socket: after the idle exit a successor may already have bound this path.
        try:
            if os.stat(sock_path).st_ino == os.fstat(server.fileno()).st_ino:
                os.unlink(sock_path)
        except OSError:
            pass
        server.close()


# ---------------------------------------------------------------- the measuring process

def _measuring_process(channel: socket.socket, device: str) -> None:
    """Runs cells from ``channel`` until it closes; keeps everything it built between cells."""
    os.setpgid(0, 0)  # its own group: a kill takes helpers it started too
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if device != CPU_LANE:
        os.environ["CUDA_VISIBLE_DEVICES"] = device  # before CUDA exists in this process
    import torch

    # A segfault prints the Python stack to fd 2, which is the current cell's log, then still dies.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    own_stdio = os.dup(1), os.dup(2)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    measured = 0  # cells this process has run: an oom after them may be theirs (Lane.measure)
    while True:
        fresh_retry = False
        try:
            msg, fds = recv_msg(channel, max_fds=2)
        except (ConnectionError, OSError):
            return  # the lane closed the channel
        _redirect(fds)
        try:
            if msg["threads"]:
                torch.set_num_threads(msg["threads"])
            if msg.get("memory_mb") and device == CPU_LANE:
                from .isolate import cap_address_space

                cap_address_space(msg["memory_mb"] * 2**20)
            started = time.monotonic()
            try:
                row = measure_cell(msg["settings"], store.at(msg.get("store")))
            except BaseException as exc:  # noqa: BLE001 — even a library's SystemExit ends as a row
                # The traceback goes to the cell's log (still this process's stderr); the process
                # retires, since whatever raised may have left it half-initialised.
                import traceback

                traceback.print_exc()
                row = failure_row(msg["settings"], "error", "the measuring process raised outside the cell's "
                                  f"own handling: {traceback.format_exception_only(type(exc), exc)[-1].strip()}",
                                  time.monotonic() - started)
                retire = True
            else:
                fresh_retry = measured > 0 and ran_out_of_memory(row)
                retire = fresh_retry or _context_lost(row, device)
            measured += 1
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
            _redirect(own_stdio)
            for fd in fds:
                os.close(fd)
        try:
            send_msg(channel, {"row": row, "retire": retire, "fresh_retry": fresh_retry})
        except (TypeError, ValueError) as exc:  # a row JSON cannot hold (a key that is no string)
            retire = True
            send_msg(channel, {"row": failure_row(msg["settings"], "error", f"the cell's row could not be sent: "
                                                  f"{type(exc).__name__}: {exc}", row.get("wall_s") or 0.0),
                               "retire": True, "fresh_retry": False})
        if retire:
            return


def ran_out_of_memory(row: dict[str, Any]) -> bool:
    """Whether the cell met an out-of-memory error: an ``oom`` row, or an ok row timed eagerly
    because capturing its CUDA graph ran out of memory.  In a process that has run other cells,
    either may be their leftovers' doing, so the lane measures the cell again in a fresh one."""
    return row.get("status") == "oom" or "capture failed: OutOfMemoryError" in str(row.get("timed_via") or "")


def _redirect(fds) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if len(fds) == 2:
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)


def _context_lost(row: dict[str, Any], device: str) -> bool:
    """Whether this process must not measure another cell: its CUDA context is broken."""
    if device == CPU_LANE:
        return False
    if any(marker in (row.get("reason") or "") for marker in POISONED_CONTEXT):
        return True
    import torch

    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 — a sticky CUDA error surfaces here
        return True
    return False
