"""A warm worker or resident lane scoped to one cluster job: it dies with the job.

Inside a SLURM job the kernel cells of a group are measured by one long-lived process, as on a
machine of one's own (``longca.execution.cluster.placement``).  Such a server is started by the
first cell in a session of its own, so the job's process tree does not hold it (with
``proctrack/linuxproc`` SLURM would lose track of it; with cgroups it would be killed with the job,
but only then).  So the job names an *anchor*: the job's own Snakemake process, which runs every
cell of the group and ends when the job ends, normally or by ``scancel`` or a time limit.  Its
identity goes into the environment (``LONGCA_JOB_SCOPE``: job id, pid and the pid's start time, so a
reused pid is not taken for it), and from there into the server's name (``worker_key``): every job
gets servers of its own, never another job's.  A scoped server checks its anchor twice a second and
exits when the anchor is gone; everything it forked dies with it (``die_with_parent``).
"""

from __future__ import annotations

import ctypes
import os
import signal

ENV = "LONGCA_JOB_SCOPE"
PR_SET_PDEATHSIG = 1


def _start_ticks(pid: int) -> str | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name start at field 3


def here(job_id: str | None = None) -> str:
    """The scope of this process as the anchor: ``<job id>:<pid>:<start ticks>``."""
    job_id = os.environ.get("SLURM_JOB_ID", "") if job_id is None else job_id
    return f"{job_id}:{os.getpid()}:{_start_ticks(os.getpid())}"


def current() -> str | None:
    return os.environ.get(ENV) or None


def alive(scope: str) -> bool:
    """Whether the scope's anchor process still runs (the same process, not a reuse of its pid)."""
    try:
        _, pid, ticks = scope.rsplit(":", 2)
        return _start_ticks(int(pid)) == ticks
    except ValueError:
        return False


def die_with_parent(parent: int) -> None:
    """In a child freshly forked by ``parent`` (its pid, taken before the fork): be killed (SIGKILL)
    when that process ends, so a server's helpers and measuring processes never outlive it.  Linux
    only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the prctl took effect
        os._exit(1)
