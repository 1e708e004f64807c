"""What each SLURM job asks for: CPUs, memory, GPUs, a time limit and exclusive nodes, from config.

Snakemake's SLURM executor turns a job's resources into ``sbatch`` flags (``threads`` or
``cpus_per_task`` → ``--cpus-per-task``, ``mem_mb`` → ``--mem`` per node, ``gres`` → ``--gres`` per
node, ``runtime`` → ``-t`` in minutes, ``slurm_extra`` verbatim).  Kernel cells travel in groups
(the slurm profile's ``group-components``) to spread the queueing and start-up over several cells.
Inside a group job the job's own Snakemake runs the cells one after another, each on the job's GPU
(``placement.cells_in_job_process``: no job step per cell).  Snakemake packs a group's cells into layers that fit
``--cores``, adds up the layers' ``runtime`` and takes the largest layer's other resources; with
``--cores`` set to one cell's CPUs (``placement.default_cores``) every layer is one cell, so a
group job asks for one cell's CPUs, memory and GPU, and for the time of all its cells.

Pure functions of the validated config: the rules call them, the tests assert the job shapes.
"""

from __future__ import annotations

import math

# A cell's time limit covers its measurement; the job also starts Snakemake, imports torch and
# initialises CUDA (and, for a CP cell, the NCCL rendezvous) before it, and writes rows after it.
START_UP_MIN = 5
# What `gpus: 0` means on a cluster: the common size of a GPU node (CP ranks per node).
DEFAULT_GPUS_PER_NODE = 8


def gpus_per_node(config: dict) -> int:
    """GPUs of a node (`gpus`, 0 → the common 8)."""
    return int(config["gpus"]) or DEFAULT_GPUS_PER_NODE


def ranks_on_a_node(config: dict, cp_size: int) -> int:
    """CP ranks each node of a CP cell's job holds: `ranks_per_node` (0 → a GPU node's GPUs on
    cuda, every rank on one node on CPU), at most the cell's ranks."""
    per_node = int(config["ranks_per_node"]) or (gpus_per_node(config) if config["device"] == "cuda" else int(cp_size))
    return min(per_node, int(cp_size))


def cell_cpus(config: dict) -> int:
    """CPUs one cell computes with: `slurm_cpus_per_cell`."""
    return int(config["slurm_cpus_per_cell"])


def cell_minutes(config: dict) -> int:
    """A job's time for one cell: the cell's own limit plus start-up, in whole minutes."""
    return math.ceil(float(config["limits"]["cell_timeout_s"]) / 60) + START_UP_MIN


def kernel_cell_resources(config: dict, cells_per_job: int) -> dict:
    """One kernel cell in a group job of ``cells_per_job`` cells (the profile's group size): its
    CPUs (``threads``), memory, GPU and time, each cell's time cut so that the whole group's stays
    within `slurm_max_runtime_min`."""
    k = max(1, int(cells_per_job))
    resources = {"threads": cell_cpus(config), "mem_mb": int(config["slurm_mem_mb_per_cell"]),
                 "runtime": max(1, min(cell_minutes(config), int(config["slurm_max_runtime_min"]) // k))}
    if config["device"] == "cuda":
        resources["gres"] = "gpu:1"
    if config["slurm_exclusive"]:
        # Timing needs the node to itself: no other job's kernels, copies or host threads beside ours.
        resources["slurm_extra"] = "--exclusive"
    return resources


def _capped(config: dict, minutes: int) -> int:
    return min(minutes, int(config["slurm_max_runtime_min"]))


def cp_cell_resources(config: dict, cp_size: int) -> dict:
    """One CP cell's job: ceil(cp_size / ranks_per_node) nodes, one task per node (a torchrun agent
    for that node's ranks), each task with its ranks' CPUs, GPUs and memory."""
    per_node = ranks_on_a_node(config, cp_size)
    nodes = math.ceil(int(cp_size) / per_node)
    resources = {
        "nodes": nodes,
        "tasks": nodes,
        # The plugin would otherwise read `tasks` as tasks per GPU (--ntasks-per-gpu) for a GPU job.
        "tasks_per_gpu": 0,
        "mpi": "srun" if nodes > 1 else "",
        # --cpus-per-task, not `threads`: Snakemake caps a job's threads at --cores (one cell's CPUs).
        "cpus_per_task": per_node * cell_cpus(config),
        "mem_mb": per_node * int(config["slurm_mem_mb_per_cell"]),
        "runtime": _capped(config, cell_minutes(config)),
    }
    if config["device"] == "cuda":
        resources["gres"] = f"gpu:{per_node}"
    if config["slurm_exclusive"]:
        resources["slurm_extra"] = "--exclusive"
    return resources


def node_demand(config: dict, cp_sizes) -> tuple[int, int]:
    """The most CPUs and memory (MiB) any of the run's jobs asks of one node: a kernel cell's, or a
    CP cell's ranks on one node."""
    shapes = [kernel_cell_resources(config, 1)] + [cp_cell_resources(config, n) for n in cp_sizes]
    return (max(r.get("cpus_per_task", r.get("threads", 0)) for r in shapes), max(r["mem_mb"] for r in shapes))


def partition_misfit(config: dict, cp_sizes, nodes: list[tuple[int, int]], partition: str | None) -> str | None:
    """Why no node of the partition can take the run's largest job, or None.  ``nodes``: each node's
    (CPUs, memory MiB) as ``sinfo`` reports them.  Such a job would wait forever (``PartitionConfig``
    or ``Resources``) while Snakemake says nothing, so the run stops before submitting."""
    if not nodes:
        return None
    cpus, mem = node_demand(config, cp_sizes)
    if any(c >= cpus and m >= mem for c, m in nodes):
        return None
    top_cpus, top_mem = max(c for c, _ in nodes), max(m for _, m in nodes)
    where = f"partition {partition}" if partition else "the default partition"
    return (f"config.slurm_cpus_per_cell / slurm_mem_mb_per_cell: a job asks one node for {cpus} CPUs and "
            f"{mem} MiB (cells' or a CP cell's ranks on one node), but the nodes of {where} have at most "
            f"{top_cpus} CPUs and {top_mem} MiB (sinfo); every job would stay pending. Set e.g. "
            f"--config slurm_cpus_per_cell={max(1, top_cpus // max(1, cpus // cell_cpus(config)))} "
            f"slurm_mem_mb_per_cell={max(100, top_mem // max(1, mem // int(config['slurm_mem_mb_per_cell'])))}, "
            f"or ranks_per_node for CP cells")


def partition_nodes(partition: str | None) -> list[tuple[int, int]]:
    """Each node's (CPUs, memory MiB) in ``partition`` (None: the default one) from ``sinfo``; empty
    when sinfo is missing or fails (then nothing is checked: the cluster decides)."""
    import shutil
    import subprocess

    if not shutil.which("sinfo"):
        return []
    cmd = ["sinfo", "-h", "-N", "-o", "%c %m"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    nodes = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].rstrip("+").isdigit():
            nodes.append((int(parts[0]), int(parts[1].rstrip("+"))))
    return nodes


def require_fit(config: dict, cp_sizes, partition: str | None) -> None:
    """Raise ConfigError (``partition_misfit``'s words) when no node of ``partition`` can hold the run's
    largest job, as ``sinfo`` reports the nodes."""
    from ...config import ConfigError

    why = partition_misfit(config, cp_sizes, partition_nodes(partition), partition)
    if why:
        raise ConfigError(why)
