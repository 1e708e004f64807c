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

from . import slurm_jobs
from ..processes import gpu_slots

LOCAL = "local"            # this machine measures the cells
SUBMITS_JOBS = "submits"   # this process hands cells to a cluster (a login node: no GPU needed)
IN_CLUSTER_JOB = "in_job"  # this process runs inside a cluster job, on its allocation


def of_run(workflow) -> str:
    from snakemake_interface_executor_plugins.settings import ExecMode

    if workflow.exec_mode != ExecMode.DEFAULT:
        return IN_CLUSTER_JOB
    return SUBMITS_JOBS if workflow.resource_settings.nodes is not None else LOCAL


def isolation(config: dict, where: str) -> str:
    """The configured isolation, except that a cluster job's cells fork their own measuring child:
    a warm worker or resident lane would outlive the job (and measure the next job's cells)."""
    if where == IN_CLUSTER_JOB and config["isolation"] in ("worker", "resident"):
        return "fork"
    return config["isolation"]


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
