# Config validation and grid expansion: everything the other rules ask about the grid.
import functools
import json
import os

from longca import cells, run_dir
from longca import config as longca_config
from longca.execution.cache import kept_rows
from longca.execution.cluster import placement, slurm_jobs
from longca.execution.cache import compile_cache, store
from longca.execution.cache.fingerprint import cp_fingerprint, kernel_fingerprint
from longca.results import figure_captions

# Validated before any job starts; a bad key stops here with a message naming it.
CFG = longca_config.or_stop(longca_config.validate, config)
KERNEL_CELLS = list(longca_config.kernel_cells(CFG))
ALL_CP_CELLS = list(longca_config.cp_cells(CFG))
# The kernel cells' masks: each config mask at each shape (its name, with the shape's mark where the
# shape is not the grid's own), then the model presets' (longca.config.grid_masks).
MASK_NAMES = [grid_mask.label for grid_mask in longca_config.grid_masks(CFG)]
# The interpreter that runs the cells: in the shell command, not in params, so running `snakemake`
# or `python -m snakemake` (two paths of one interpreter) does not rerun every cell.
PYTHON = sys.executable
# Where this run's cells are measured, decided while the Snakefile is read (before Snakemake names
# its executor): here, or in cluster jobs (longca.execution.cluster.placement says how it tells).
PLACEMENT = placement.of_run(workflow)
# `--cores` when none is given: every core for a local run (so `snakemake all` needs no flag), one
# cell's CPUs for a run that submits jobs (how Snakemake sizes a group job whose cells run in turn).
placement.default_cores(workflow, PLACEMENT, slurm_jobs.cell_cpus(CFG))
# A warm worker or resident lane must not outlive a cluster job: cells there fork their own child.
ISOLATION = placement.isolation(CFG, PLACEMENT)
# Isolation and limits reach run-cell as flags, not params: a limit is not part of any cache key.
LIMIT_FLAGS = longca_config.cell_limits({**CFG, "isolation": ISOLATION})
CP_TIMEOUT_S = CFG["limits"]["cell_timeout_s"]  # the CP cell's limit, likewise no part of its key
# GPUs: here (or inside a cluster job), the devices this process sees; for a run that submits jobs,
# each node's GPUs (the submit host needs none).
GPUS = longca_config.or_stop(placement.gpus, CFG, PLACEMENT)
if PLACEMENT == placement.LOCAL and GPUS and "gpu" not in workflow.global_resources:
    # One `gpu` per device unless `--resources gpu=N` says otherwise: cells that hold GPUs never
    # ask for more than this machine has.
    workflow.register_resource("gpu", GPUS)
if PLACEMENT == placement.LOCAL:
    for warning in longca_config.implausible(CFG, os.cpu_count() or 1, longca_config.machine_memory_bytes()):
        print(f"LongCA warning: {warning}", file=sys.stderr)
# CP cells this run can place (the others get an `unsupported` row saying why, rule cp_cell_unplaced).
UNPLACED_CP = {cell: reason for cell in ALL_CP_CELLS
               if (reason := placement.unplaced_reason(CFG, PLACEMENT, GPUS, cell.cp_size))}
CP_CELLS = [cell for cell in ALL_CP_CELLS if cell not in UNPLACED_CP]
# Every CP row of the grid: the placed cells' and the unplaced ones'.
CP_ROW_FILES = [cell.path for cell in CP_CELLS] + [cell.unplaced_path for cell in UNPLACED_CP]
# Every kernel row of the grid.
KERNEL_ROW_FILES = [cell.path for cell in KERNEL_CELLS]
# Partition and account for every job (config or environment); nothing when neither is set.
SLURM_RESOURCES = longca_config.slurm_resources(CFG) if PLACEMENT != placement.LOCAL else {}
# A job no node of the partition can hold would pend forever: stop now, naming the keys.
if PLACEMENT == placement.SUBMITS_JOBS:
    longca_config.or_stop(slurm_jobs.require_fit, CFG, sorted({c.cp_size for c in CP_CELLS}),
                          SLURM_RESOURCES.get("slurm_partition"))

wildcard_constraints:
    seqlen=r"\d+",
    tokens=r"\d+",
    cp_size=r"\d+",
    direction="fwd|bwd",


def kernel_cell_settings(wildcards) -> str:
    """The cell's resolved settings as JSON: a Snakemake param, hence part of the cache key."""
    settings = longca_config.cell_settings(CFG, wildcards.kernel, wildcards.mask, int(wildcards.seqlen),
                                           wildcards.direction, wildcards.dtype)
    return json.dumps(settings, sort_keys=True)


@functools.lru_cache(maxsize=None)
def cached_kernel_fingerprint(kernel: str) -> str:
    # Hashing the same files once per kernel, not once per cell: a 10,000-cell dry run stays fast.
    return kernel_fingerprint(kernel)


# Cells keep a copy of each row they write with the fingerprint of its code
# (longca.execution.cache.kept_rows): a rerun after a lost job reuses the rows of the same code and
# settings, and the kernel cells' client learns the fingerprints here, without importing torch.
os.environ[kept_rows.FINGERPRINTS_ENV] = json.dumps(
    {kernel: cached_kernel_fingerprint(kernel) for kernel in CFG["kernels"]}, sort_keys=True)
# Every measured part of a kernel cell (gate, time, memory) is kept in the run's store by its own
# key (longca.execution.cache.store): a rerun measures only the parts whose settings or code changed.  A
# caller may name another store (lab/longca_lab/bench_pipeline.py gives each pass its own, to measure anew).
os.environ.setdefault(store.STORE_ENV, str(store.DEFAULT.resolve()))
# What Inductor, Triton and the CuTe DSL compile is kept in the run directory, not in each node's /tmp:
# a compilation is paid once per run, not once per measuring process (longca.execution.cache.compile_cache).
compile_cache.point_at(compile_cache.DEFAULT)


# Resident lanes (longca.execution.processes.resident) measure each device's cells one at a time in a long-lived process;
# the cell's job is then a thin client that waits on the device's slot, so locally it takes one core
# and no `gpu` resource: Snakemake keeps several clients in flight and the next cell is already
# queued when one finishes (CP cells take the GPU slots themselves, so they still never share a GPU
# with a kernel cell).
RESIDENT_CLIENTS = ISOLATION == "resident" and PLACEMENT == placement.LOCAL
if PLACEMENT == placement.LOCAL:
    # CPU cells take every core they are given one at a time, so concurrent cells never share cores
    # and skew each other's timings; GPU cells run up to one per GPU, the cores shared between them.
    MEASURE_THREADS = CFG["threads"] or max(1, workflow.cores // max(GPUS, 1))
    CELL_THREADS = 1 if RESIDENT_CLIENTS else MEASURE_THREADS
    GPU_JOB_RESOURCES = {"gpu": 1} if GPUS else {}  # one measurement on one device (a cell, the ceilings)
    CELL_RESOURCES = {} if RESIDENT_CLIENTS else GPU_JOB_RESOURCES
else:
    # A cluster job: CPUs, memory, GPUs and time limit from config (longca.execution.cluster.slurm_jobs).
    MEASURE_THREADS = CELL_THREADS = slurm_jobs.cell_cpus(CFG)
    ONE_CELL = {k: v for k, v in slurm_jobs.kernel_cell_resources(CFG, 1).items() if k != "threads"}
    GPU_JOB_RESOURCES = {**ONE_CELL, **SLURM_RESOURCES}
    # A cell's time is cut so that its group's stays within the partition's limit: the group size is
    # known once Snakemake builds the DAG.
    CELL_RESOURCES = {**GPU_JOB_RESOURCES, "runtime": lambda wc: slurm_jobs.kernel_cell_resources(
        CFG, placement.kernel_cells_per_job(workflow))["runtime"]}


def planned_cell_jobs() -> int:
    """Cell jobs this run executes (what Snakemake's job stats count): the progress line's total."""
    return sum(1 for job in workflow.dag.needrun_jobs() if job.rule.name in ("kernel_cell", "cp_cell"))
