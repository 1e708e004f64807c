"""``longca cp-cell``: start one CP cell under ``torchrun`` and make sure a row comes out of it.

rank 0 writes the row when the cell runs to the end (ok, unsupported, wrong, oom, or a collective
that timed out).  When the job dies (a crash, a rank killed) or outlives the cell's time limit
(the whole process session is killed), this launcher writes the row itself: ``error`` with the
exit status and the end of the log, or ``timeout``.  Either way the row is written atomically.

A failed row names the first failure over all ranks, not rank 0's own: every rank records its
first failure in the cell's failure folder (beside the row, so on the shared filesystem across
nodes), ranks that died without a Python exception are taken from torchrun's report in the log,
and the row's status and reason become the earliest one's (``measure.first_failure``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ... import cp_env, run_dir
from ...cells import tokens_per_rank
from ..measure import first_failure
from . import cp_group
from ..processes import gpu_slots
from ..cache import kept_rows
from ..cache.atomic import write_json_atomic

# Ranks give up on a collective somewhat before the launcher kills them, so a hung collective is
# reported by rank 0 with what it was doing.
COLLECTIVE_SHARE = 0.8


def nodes_of(settings: dict) -> int:
    per_node = int(settings.get("ranks_per_node") or 0)
    return -(-int(settings["cp_size"]) // per_node) if per_node else 1


def _slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True, timeout=60).stdout


def slurm_head_address(job_id: str) -> str:
    """The address of the job's first node, from inside the job.

    The executor plugin's job step drops most SLURM_* variables (SLURM_JOB_NODELIST among them), so
    the node list comes from ``squeue``; the node's NodeAddr (not its name, which need not resolve)
    is where the other nodes reach the rendezvous."""
    nodelist = _slurm("squeue", "-h", "-j", job_id, "-o", "%N").strip()
    first = _slurm("scontrol", "show", "hostnames", nodelist).split()[0]
    for field in _slurm("scontrol", "show", "node", first).split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return first


def _free_port() -> int:
    """A port free on this host (the batch step runs on the job's first node: the rendezvous host).

    Asked of the kernel rather than derived from the job id, so concurrent jobs sharing a node
    cannot pick the same one."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torchrun_command(settings: dict, out: str, *, cell_id: str, fingerprint: str | None, timeout_s: float,
                     threads: int, failures: str | os.PathLike | None = None) -> list[str]:
    nproc = int(settings["cp_size"])
    nodes = nodes_of(settings)
    job_id = os.environ.get("SLURM_JOB_ID")
    if nodes > 1 and job_id:
        # One srun task per node, each a torchrun agent for that node's ranks; c10d rendezvous on the
        # first node.  srun passes the whole environment on (NCCL_*, CUDA_* included).
        per_node = -(-nproc // nodes)
        launcher = ["srun", f"--jobid={job_id}", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
                    "--kill-on-bad-exit=1", "--export=ALL",
                    sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                    f"--nproc-per-node={per_node}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={slurm_head_address(job_id)}:{_free_port()}", f"--rdzv-id=longca-{job_id}"]
        rank_threads = cp_group.threads_per_rank(threads, per_node)
    else:
        if nodes > 1:
            print(f"longca cp-cell: {nodes} nodes asked for but not inside a SLURM job; "
                  f"running all {nproc} ranks here", file=sys.stderr)
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        rank_threads = cp_group.threads_per_rank(threads, nproc)
    cmd = launcher + [
           "-m", "longca.execution.measure.cp_rank", "--settings", json.dumps(settings, sort_keys=True), "--out", out,
           "--cell-id", cell_id, "--timeout", f"{_collective_timeout(timeout_s):g}"]
    if fingerprint:
        cmd += ["--fingerprint", fingerprint]
    if rank_threads:
        cmd += ["--threads", str(rank_threads)]  # the cell's cores (per node), shared by its ranks
    if failures:
        cmd += ["--failures", str(failures)]
    return cmd


def _local_gpu_slots(settings: dict) -> list:
    """On one machine, the slots of the GPUs the ranks use (the first ``cp_size`` visible ones, as
    torchrun's local ranks pick them): kernel cells measured by resident lanes hold no Snakemake
    `gpu` resource, so the slots are what keeps them off a CP cell's GPUs."""
    if settings.get("device") != "cuda" or nodes_of(settings) > 1:
        return []

    return gpu_slots.acquire_all(gpu_slots.visible_devices()[: int(settings["cp_size"])])


def failure_row(settings: dict, status: str, reason: str, *, cell_id: str, fingerprint: str | None,
                wall_s: float) -> dict:
    measured, launch = cp_env.split(settings)  # the preset is a column of its own, as in a measured row
    row = {"kind": "cp", **measured, cp_env.KEY: launch, "status": status, "reason": reason, "cell_id": cell_id,
           "fingerprint": fingerprint, "wall_s": wall_s}
    row["mask_params"] = json.dumps(settings.get("mask_params", {}), sort_keys=True)
    row["strategy_options"] = json.dumps(settings.get("strategy_options", {}), sort_keys=True)
    row["tokens_per_rank"] = tokens_per_rank(settings["seqlen"], settings["cp_size"])
    # Where it failed, as an ok row says where it ran: the SLURM job to look up, the nodes it spanned.
    row["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    row["nodes"] = nodes_of(settings)
    return row


def run(settings: dict, out: str, *, cell_id: str, fingerprint: str | None = None, timeout_s: float = 600,
        threads: int = 0, isolation: str = "fork", job_started: float | None = None) -> dict:
    """Measure the cell (in its GPU set's resident group under a warm ``isolation`` on one machine,
    else in a ``torchrun`` of its own) and write its row; ``job_started``: when the cell's job
    began (its row's ``job_wall_s`` runs from there to the row)."""
    started = time.time()
    job_started = started if job_started is None else job_started
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if os.path.exists(out):
        os.remove(out)  # a stale row must not pass for this run's
    kept = kept_rows.recall(out, settings, fingerprint)
    if kept is not None:  # measured by an earlier job that was lost before Snakemake recorded it
        write_json_atomic(kept, out)
        return kept
    resident = isolation in cp_group.RESIDENT and nodes_of(settings) == 1
    if (why := cp_env.problem(cp_env.of(settings))):  # before any rank starts
        row = failure_row(settings, "error", why, cell_id=cell_id, fingerprint=fingerprint,
                          wall_s=time.time() - started)
    else:
        failures = first_failure.fresh(first_failure.folder_for(out))
        try:
            if resident:
                row, reported, context = _run_resident(settings, cell_id=cell_id, fingerprint=fingerprint,
                                                       timeout_s=timeout_s, threads=threads, started=started,
                                                       failures=failures)
            else:
                row, reported, context = _run(settings, out, cell_id=cell_id, fingerprint=fingerprint,
                                              timeout_s=timeout_s, threads=threads, started=started,
                                              failures=failures)
            row = _name_first_failure(row, failures, reported, context=context, log=cell_log(out, cell_id))
        finally:
            shutil.rmtree(failures, ignore_errors=True)
    row["isolation"] = "resident" if resident else "fork"
    row["job_wall_s"] = time.time() - job_started
    write_json_atomic(row, out)
    kept_rows.keep(out, settings, fingerprint, row)
    return row


def cell_log(out: str | os.PathLike, cell_id: str) -> str | None:
    """The cell's log (where the rule sends this command's stderr), when ``out`` is the cell's row in
    a run directory; None for a row elsewhere."""
    suffix = f"{run_dir.CP_CELLS}/{cell_id}.json"
    text = str(out)
    return text[: -len(suffix)] + run_dir.cell_log("cp", cell_id) if text.endswith(suffix) else None


def _name_first_failure(row: dict, folder: Path, reported: list, *, context: str | None, log: str | None) -> dict:
    """``row`` naming the first failure over all ranks (their records in ``folder``, and ``reported``:
    the ranks torchrun reported failed), each one also printed to the log in full; ``context``: what
    the launcher saw, kept in the reason."""
    failures = first_failure.combined(first_failure.recorded(folder), reported)
    if row.get("status") not in first_failure.REPLACEABLE or not failures:
        return row
    for f in failures:
        print(f"longca cp-cell: rank {f.rank} on {f.host} failed at {f.time:.3f} ({f.source}, {f.stage}): "
              f"{f.text()}", file=sys.stderr)
    return first_failure.name_first(row, failures, log=log, context=context)


def _collective_timeout(timeout_s: float) -> float:
    return max(timeout_s * COLLECTIVE_SHARE, 5)


def _run_resident(settings: dict, *, cell_id: str, fingerprint: str | None, timeout_s: float, threads: int,
                  started: float, failures: Path) -> tuple[dict, list, str | None]:
    """``(row, [], what the client saw)``: a group's ranks all run on this machine, under one agent."""
    kind, result = cp_group.measure(settings, cell_id=cell_id, fingerprint=fingerprint, timeout_s=timeout_s,
                                    collective_timeout_s=_collective_timeout(timeout_s), threads=threads,
                                    failures=str(failures))
    if kind == "row":
        return result, [], None
    if kind == "timeout":
        return (failure_row(settings, "timeout", f"CP cell killed after its {timeout_s:g} s limit (its resident "
                            "group was killed with it)", cell_id=cell_id, fingerprint=fingerprint,
                            wall_s=time.time() - started),
                [], f"the group was killed at the cell's {timeout_s:g} s limit")
    return (failure_row(settings, "error", result, cell_id=cell_id, fingerprint=fingerprint,
                        wall_s=time.time() - started), [], "the group ended without a row")


def _run(settings: dict, out: str, *, cell_id: str, fingerprint: str | None, timeout_s: float, threads: int,
         started: float, failures: Path) -> tuple[dict, list, str | None]:
    """``(row, the ranks torchrun reported failed, what the launcher saw)``."""
    cmd = torchrun_command(settings, out, cell_id=cell_id, fingerprint=fingerprint, timeout_s=timeout_s,
                           threads=threads, failures=failures)
    slots = _local_gpu_slots(settings)
    try:
        # Its own session, so a timeout kills torchrun and every rank it started.
        # The launch environment goes into torchrun's environment, so every rank (and, under srun's
        # --export=ALL, every node's) starts with it, before CUDA or NCCL is initialised.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env=cp_env.environ(cp_env.of(settings)))
        timed_out = False
        try:
            log, _ = proc.communicate(timeout=timeout_s or None)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
    finally:
        for slot in slots:
            slot.release()
    sys.stderr.write(log or "")
    # The ranks torchrun's agents reported dead (those without a record of their own may have died
    # without a Python exception), and what the launcher saw, for the row's first failure.
    reported = first_failure.torchrun_failures(log or "")
    if os.path.exists(out) and not timed_out:
        with open(out) as f:
            row = json.load(f)
        return row, reported, f"torchrun exited with status {proc.returncode}" if proc.returncode else None
    wall = time.time() - started
    if timed_out:
        row = failure_row(settings, "timeout", f"CP cell killed after its {timeout_s:g} s limit",
                          cell_id=cell_id, fingerprint=fingerprint, wall_s=wall)
        context = f"the job was killed at its {timeout_s:g} s limit"
    else:
        tail = " | ".join(line for line in (log or "").strip().splitlines()[-6:])
        row = failure_row(settings, "error", f"torchrun exited with status {proc.returncode} and no row: {tail}",
                          cell_id=cell_id, fingerprint=fingerprint, wall_s=wall)
        context = f"torchrun exited with status {proc.returncode} and rank 0 wrote no row"
    write_json_atomic(row, out)
    return row, reported, context
