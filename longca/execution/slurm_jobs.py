"""What each SLURM job asks for: CPUs, memory, GPUs, a time limit and exclusive nodes, from config.

Snakemake's SLURM executor turns a job's resources into ``sbatch`` flags (``threads`` →
``--cpus-per-task``, ``mem_mb`` → ``--mem`` per node, ``gres`` → ``--gres`` per node, ``runtime`` →
``-t`` in minutes, ``slurm_extra`` verbatim).  Kernel cells travel in groups (the slurm profile's
``group-components``): a group's integer resources are the sum over its cells, its ``runtime`` the
longest cell's, and its string resources (``gres``, ``slurm_extra``) are taken once.  So a kernel
cell asks for its own share (CPUs and memory per GPU cell) and the node's GPUs as a string; a group
of ``gpus`` cells then asks for exactly one node's GPUs, CPUs and memory, and a larger group waits
for free GPUs inside its job (``longca.execution.gpu_slots``), which its time limit allows for.

Pure functions of the validated config: the rules call them, the tests assert the job shapes.
"""

from __future__ import annotations

import math

# A cell's time limit covers its measurement; the job also starts Snakemake, imports torch and
# initialises CUDA (and, for a CP cell, the NCCL rendezvous) before it, and writes rows after it.
START_UP_MIN = 5
# What `gpus: 0` means on a cluster: the common size of a GPU node.
DEFAULT_GPUS_PER_NODE = 8


def gpus_per_node(config: dict) -> int:
    """GPUs a kernel-cell job gets on its node (`gpus`, 0 → the common 8)."""
    return int(config["gpus"]) or DEFAULT_GPUS_PER_NODE


def ranks_per_node(config: dict) -> int:
    """CP ranks (GPUs) per node (`ranks_per_node`, 0 → every GPU of a node)."""
    return int(config["ranks_per_node"]) or gpus_per_node(config)


def cell_cpus(config: dict) -> int:
    """CPUs one cell computes with: `slurm_cpus_per_cell`."""
    return int(config["slurm_cpus_per_cell"])


def cell_minutes(config: dict) -> int:
    """A job's time for one cell: the cell's own limit plus start-up, in whole minutes."""
    return math.ceil(float(config["limits"]["cell_timeout_s"]) / 60) + START_UP_MIN


def kernel_cell_resources(config: dict) -> dict:
    """One kernel cell's share of its group job (its time limit: ``kernel_cell_runtime``)."""
    resources = {"mem_mb": int(config["slurm_mem_mb_per_cell"])}
    if config["device"] == "cuda":
        resources["gres"] = f"gpu:{gpus_per_node(config)}"
    if config["slurm_exclusive"]:
        # Timing needs the node to itself: no other job's kernels, copies or host threads beside ours.
        resources["slurm_extra"] = "--exclusive"
    return resources


def kernel_cell_runtime(config: dict, cells_per_job: int) -> int:
    """Minutes a kernel cell's group job may take (``cells_per_job``: the profile's group size):
    on GPUs, cells beyond the node's GPUs wait for a free one; CPU cells run side by side."""
    rounds = math.ceil(max(1, cells_per_job) / gpus_per_node(config)) if config["device"] == "cuda" else 1
    return _capped(config, rounds * cell_minutes(config))


def _capped(config: dict, minutes: int) -> int:
    return min(minutes, int(config["slurm_max_runtime_min"]))


def cp_cell_resources(config: dict, cp_size: int) -> dict:
    """One CP cell's job: ceil(cp_size / ranks_per_node) nodes, one task per node (a torchrun agent
    for that node's ranks), each task with its ranks' CPUs, GPUs and memory."""
    per_node = min(ranks_per_node(config), int(cp_size)) if config["device"] == "cuda" else int(cp_size)
    nodes = math.ceil(int(cp_size) / per_node)
    resources = {
        "nodes": nodes,
        "tasks": nodes,
        # The plugin would otherwise read `tasks` as tasks per GPU (--ntasks-per-gpu) for a GPU job.
        "tasks_per_gpu": 0,
        "mpi": "srun" if nodes > 1 else "",
        "mem_mb": per_node * int(config["slurm_mem_mb_per_cell"]),
        "runtime": _capped(config, cell_minutes(config)),
    }
    if config["device"] == "cuda":
        resources["gres"] = f"gpu:{per_node}"
    if config["slurm_exclusive"]:
        resources["slurm_extra"] = "--exclusive"
    return resources


def cp_cell_threads(config: dict, cp_size: int) -> int:
    """CPUs of one CP task (``--cpus-per-task``): its node's ranks, `slurm_cpus_per_cell` each."""
    per_node = min(ranks_per_node(config), int(cp_size)) if config["device"] == "cuda" else int(cp_size)
    return per_node * cell_cpus(config)
