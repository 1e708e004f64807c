"""Run a function in a forked child so that a crash, a hang or an exhausted memory cap is a result.

A kernel can segfault, abort, spin forever or eat the machine's memory; none of that may take the
workflow down or lose the cell.  ``call`` forks, runs the function in the child (in its own process
group, under an optional address-space cap), sends the return value back through a pipe, and
reports what happened: the value, a signal, an exit status, or a timeout (then the child's whole
process group is killed).

Forking is cheap and keeps whatever the parent has imported (torch: ~1-2 s saved per cell).  The
parent must not have initialised CUDA or started OpenMP threads before forking; callers only import.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from .job_scope import die_with_parent

KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """What became of the child: exactly one of value / signal / exit_code / timed_out says it."""

    value: Any = None
    returned: bool = False
    signal: int | None = None      # killed by this signal (not by us)
    exit_code: int | None = None   # exited without returning a value
    timed_out: bool = False
    error: str | None = None       # the function raised: its traceback
    wall_s: float = 0.0

    def describe(self) -> str:
        if self.timed_out:
            return f"ran past its time limit after {self.wall_s:.1f} s and was killed"
        if self.signal is not None:
            return f"process killed by {signal_name(self.signal)} (signal {self.signal})"
        if self.exit_code is not None:
            return f"process exited with status {self.exit_code} without a result"
        if self.error:
            return self.error
        return "returned"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _vm_size_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def cap_address_space(extra_bytes: int) -> None:
    """Let this process map at most ``extra_bytes`` more than it has mapped now.

    Relative to the current size because an imported torch already maps a few hundred MB of
    address space; an absolute cap would measure the imports, not the cell.  (Not for CUDA:
    the driver reserves terabytes of virtual addresses.)"""
    limit = _vm_size_bytes() + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _child(fn: Callable[[], Any], write_fd: int, memory_bytes: int | None, stdio: tuple[int, int] | None,
           parent: int) -> None:
    """Runs in the forked child; never returns."""
    code = 0
    try:
        die_with_parent(parent)  # nobody would read its row: a killed client or worker takes it down
        os.setpgid(0, 0)  # its own group: a timeout kills helpers it started too
        if stdio is not None:
            os.dup2(stdio[0], 1)
            os.dup2(stdio[1], 2)
        # A segfault prints the Python stack to stderr (the cell's log), then still dies by the signal.
        faulthandler.enable(file=sys.stderr, all_threads=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if memory_bytes:
            cap_address_space(memory_bytes)
        try:
            payload = pickle.dumps((True, fn()))
        except BaseException:  # noqa: BLE001 — report it, the parent decides what it means
            payload = pickle.dumps((False, traceback.format_exc()))
        with os.fdopen(write_fd, "wb") as f:
            f.write(payload)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 70
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except ProcessLookupError:
            pass


def call(fn: Callable[[], Any], *, timeout_s: float | None = None, memory_bytes: int | None = None,
         stdio: tuple[int, int] | None = None, abort_fd: int | None = None) -> Outcome:
    """Run ``fn()`` in a forked child and say what happened.

    ``fn``'s return value must pickle.  ``memory_bytes`` caps the child's extra address space.
    ``stdio`` = (stdout fd, stderr fd) the child writes to.  When ``abort_fd`` becomes readable
    (e.g. the client that asked for this cell hung up), the child is killed and the outcome is a
    timeout at that moment."""
    started = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(fn, write_fd, memory_bytes, stdio, parent)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)  # also here: no race with the child's own setpgid
    except (PermissionError, ProcessLookupError):
        pass
    chunks, timed_out = [], False
    with os.fdopen(read_fd, "rb") as pipe:
        watch = [pipe] + ([abort_fd] if abort_fd is not None else [])
        while True:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0)
            ready, _, _ = select.select(watch, [], [], wait)
            if not ready:
                timed_out = True
                break
            if abort_fd is not None and abort_fd in ready:
                timed_out = True
                break
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    # Before reaping, while the child's pid (= its group id) cannot be reused: this kills a hung
    # child, and helpers a finished child left behind in its group.
    kill_group(pid)
    _, status = os.waitpid(pid, 0)
    wall = time.monotonic() - started
    if timed_out:
        return Outcome(timed_out=True, wall_s=wall)
    if chunks:
        ok, value = pickle.loads(b"".join(chunks))
        return Outcome(value=value, returned=True, wall_s=wall) if ok else Outcome(error=value, wall_s=wall)
    return died(status, wall)


def died(status: int, wall_s: float) -> Outcome:
    """The outcome of a process that ended without returning a value (``waitpid``'s status)."""
    if os.WIFSIGNALED(status):
        return Outcome(signal=os.WTERMSIG(status), wall_s=wall_s)
    return Outcome(exit_code=os.waitstatus_to_exitcode(status), wall_s=wall_s)
