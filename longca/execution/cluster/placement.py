"""Where a run's cells are measured: on this machine, or in cluster jobs.

The Snakefile must know while it is read, since resources, threads and isolation are declared
then; Snakemake names its executor only afterwards (``workflow.local_exec`` is still true under
``--executor slurm`` at that point).  Two facts are already settled when the Snakefile is read:

* a process running *inside* a cluster job was started in Snakemake's remote (or subprocess)
  mode, not its default mode;
* a run that submits jobs to a cluster was given ``--jobs`` (the slurm profile's ``jobs:``):
  Snakemake refuses any remote executor without it, and a local run has no such number unless
  both ``--cores`` and ``--jobs`` are typed (then it is taken for a cluster run: its cells still
  run, asking for cluster resources that a local run ignores).
"""

from __future__ import annotations

import os
import sys

from . import slurm_jobs
from ..processes import gpu_slots, job_scope, resident, worker

LOCAL = "local"            # this machine measures the cells
SUBMITS_JOBS = "submits"   # this process hands cells to a cluster (a login node: no GPU needed)
IN_CLUSTER_JOB = "in_job"  # this process runs inside a cluster job, on its allocation


def of_run(workflow) -> str:
    from snakemake_interface_executor_plugins.settings import ExecMode

    if workflow.exec_mode != ExecMode.DEFAULT:
        return IN_CLUSTER_JOB
    return SUBMITS_JOBS if workflow.resource_settings.nodes is not None else LOCAL


def isolation(config: dict, where: str) -> str:
    """The configured isolation, except that a CP cell in a cluster job forks its own ranks: a
    resident CP group would outlive the job (and measure the next job's cells).  Kernel cells:
    ``kernel_cell_isolation``."""
    if where == IN_CLUSTER_JOB and config["isolation"] in ("worker", "resident"):
        return "fork"
    return config["isolation"]


def kernel_cell_isolation(config: dict, where: str) -> str:
    """The configured isolation, in a cluster job too: there the cells of a group job run one after
    another in the job's own Snakemake (``cells_in_job_process``) and share one warm worker or
    resident lane scoped to the job (``scope_servers_to_job``), which ends with it."""
    return config["isolation"]


def cells_in_job_process(where: str) -> bool:
    """Whether kernel cells run inside this Snakemake process rather than each in a job step of its
    own: inside a cluster job.  There the SLURM jobstep executor would start every cell as an
    ``srun`` step that starts Snakemake again (reads the Snakefile, builds the DAG) before the
    cell's own process: 8.5 s a cell on an idle 2-core machine, for 1-4 s of measuring.  A local rule
    without a group is run by Snakemake's local executor in this process, one cell at a time (each
    takes the job's ``--cores``, one cell's CPUs)."""
    return where == IN_CLUSTER_JOB


def prestart_job_server(workflow, config: dict, where: str) -> None:
    """In a job of kernel cells: start the job's worker or lane now, while this Snakemake still
    builds its DAG, rather than when its first cell asks (a torch import, ~1.3 s on a 2-core node).
    Only where the cells' server is known here: the worker; the CPU lane; the lane of a job's one GPU."""
    if where != IN_CLUSTER_JOB or "kernel_cell" not in target_rules(workflow):
        return
    chosen = kernel_cell_isolation(config, where)
    if chosen == "worker":
        worker.prestart(worker.worker_key(), ["worker"])
    elif chosen == "resident":
        devices = [resident.CPU_LANE] if config["device"] != "cuda" else gpu_slots.visible_devices(config["gpus"])
        if len(devices) == 1:
            resident.prestart_lane(devices[0])


def target_rules(workflow, argv: list[str] | None = None) -> set[str]:
    """The rules of the jobs this Snakemake was started for (``--target-jobs RULE:WILDCARDS ...``,
    how a cluster job's Snakemake is started).  Read from the command line: Snakemake hands its
    DAG settings to the workflow only after the Snakefile is read."""
    settings = getattr(workflow, "dag_settings", None)
    if settings is not None and settings.target_jobs:
        return {t.rulename for t in settings.target_jobs}
    argv = sys.argv if argv is None else argv
    rules, inside = set(), False
    for arg in argv:
        if arg.startswith("-"):
            inside = arg == "--target-jobs"
        elif inside and ":" in arg:
            rules.add(arg.split(":", 1)[0])
    return rules


def scope_servers_to_job(where: str) -> None:
    """Inside a cluster job: name this process (the job's Snakemake, which runs the group's cells
    and ends with the job) as the anchor of any worker or lane its cells start
    (``longca.execution.processes.job_scope``), so that each job has servers of its own and none
    outlives it."""
    if where == IN_CLUSTER_JOB:
        os.environ[job_scope.ENV] = job_scope.here()


def gpus(config: dict, where: str) -> int:
    """GPUs the run's cells use at once on one machine: the visible devices here and inside a
    job (none visible on a cuda run is an error before any work), a node's for a submitting run."""
    from ...config import ConfigError

    if config["device"] != "cuda":
        return 0
    if where == SUBMITS_JOBS:
        return slurm_jobs.gpus_per_node(config)
    count = len(gpu_slots.visible_devices(config["gpus"]))
    if not count:
        raise ConfigError("config.device: cuda, but no GPU is visible (CUDA_VISIBLE_DEVICES is empty and "
                          "nvidia-smi lists none); on a SLURM login node run with --profile slurm")
    return count


def kernel_cells_per_job(workflow) -> int:
    """Kernel cells grouped into one cluster job (the profile's ``group-components``).  Known once
    Snakemake builds the DAG, not while the Snakefile is read: call it from a resource function."""
    return int(workflow.group_settings.group_components.get("kernel_cells", 1))


def unplaced_reason(config: dict, where: str, gpus_here: int, cp_size: int) -> str | None:
    """Why a CP cell cannot run in this run, or None: locally on GPUs its ranks need a GPU each
    (two ranks on one GPU hang in NCCL); a cluster run gives every cell the nodes it needs."""
    if where != LOCAL or config["device"] != "cuda" or cp_size <= gpus_here:
        return None
    return (f"needs {cp_size} GPUs, one per rank; this run has {gpus_here} "
            f"(CUDA_VISIBLE_DEVICES / nvidia-smi, config.gpus); measured by a run that has them")


def default_cores(workflow, where: str, cpus_per_cell: int) -> None:
    """``--cores`` when none was given (Snakemake itself fills it in the same way for dry runs).

    * A local run uses every core, so ``snakemake all`` needs no flag.  This used to be ``cores:
      all`` in ``profiles/default``, but Snakemake also loads that workflow profile under
      ``--profile slurm``, where ``--cores`` capped every cluster job at the login node's cores.
    * A run that submits jobs gets one cell's CPUs.  Under a cluster executor ``--cores`` caps each
      job's threads, and Snakemake packs a group's cells into layers that fit it.  The SLURM
      executor runs a group's cells one after another, so one cell per layer is what the group job
      needs: one cell's CPUs and memory, every cell's time (``longca.execution.cluster.slurm_jobs``).  Jobs
      inside the group get the same ``--cores``."""
    settings = workflow.resource_settings
    if settings.cores is not None or where == IN_CLUSTER_JOB:
        return
    if where == LOCAL:
        from snakemake.utils import available_cpu_count

        settings.cores = available_cpu_count()
    else:
        settings.cores = int(cpus_per_cell)
    workflow.register_resource("_cores", settings.cores)
