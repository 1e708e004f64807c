# Config validation and grid expansion: everything the other rules ask about the grid.
import functools
import json

from longca import config as longca_config
from longca.execution import gpu_slots
from longca.execution.fingerprint import cp_fingerprint, kernel_fingerprint

# Validated before any job starts; a bad key stops here with a message naming it.
CFG = longca_config.validate(config)
KERNEL_CELLS = list(longca_config.kernel_cells(CFG))
CP_CELLS = list(longca_config.cp_cells(CFG))
MASK_NAMES = [entry.name for entry in longca_config.mask_entries(CFG)]
# The interpreter that runs the cells: in the shell command, not in params, so running `snakemake`
# or `python -m snakemake` (two paths of one interpreter) does not rerun every cell.
PYTHON = sys.executable
# Isolation and limits reach run-cell as flags, not params: a limit is not part of any cache key.
LIMIT_FLAGS = longca_config.cell_limits(CFG)
CP_TIMEOUT_S = CFG["limits"]["cell_timeout_s"]  # the CP cell's limit, likewise no part of its key
# GPU cells: one slot per device (longca.execution.gpu_slots picks the device; this only sizes the concurrency).
# Under a cluster executor (SLURM) the jobs run on other machines: the submit host needs no GPU, and
# `gpus` (default 1) is what each node offers a kernel cell job.
if workflow.local_exec:
    GPUS = len(gpu_slots.visible_devices(CFG["gpus"])) if CFG["device"] == "cuda" else 0
    if CFG["device"] == "cuda" and not GPUS:
        raise longca_config.ConfigError("config.device: cuda, but no GPU is visible "
                                        "(CUDA_VISIBLE_DEVICES is empty and nvidia-smi lists none)")
else:
    GPUS = (CFG["gpus"] or 1) if CFG["device"] == "cuda" else 0
# Partition and account for every job (config or environment); nothing when neither is set.
SLURM_RESOURCES = longca_config.slurm_resources(CFG)


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


# Resident lanes (longca.execution.resident) measure each device's cells one at a time in a long-lived process;
# the cell's job is then a thin client that waits on the device's slot, so locally it takes one core
# and no `gpu` resource: Snakemake keeps several clients in flight and the next cell is already
# queued when one finishes (CP cells take the GPU slots themselves, so they still never share a GPU
# with a kernel cell).  On a cluster each job is its own allocation and asks SLURM for its GPU.
RESIDENT_CLIENTS = CFG["isolation"] == "resident" and workflow.local_exec
# GPU cells ask for one GPU (the SLURM executor turns this into a GPU request); CPU cells ask for no
# extra resource, which keeps Snakemake's per-job resource evaluation short.
GPU_JOB_RESOURCES = {**({"gpu": 1} if GPUS else {}), **SLURM_RESOURCES}
CELL_RESOURCES = SLURM_RESOURCES if RESIDENT_CLIENTS else GPU_JOB_RESOURCES

# A constant, not a function of the wildcards: Snakemake inspects and calls every function-valued
# directive once per job, which is most of a 10,000-cell dry run's time.
if GPUS:
    # GPU cells: up to one per GPU at once, the cores shared between them.
    MEASURE_THREADS = CFG["threads"] or max(1, workflow.cores // GPUS)
else:
    # CPU cells take every core they are given one at a time, so concurrent cells never share cores
    # and skew each other's timings.
    MEASURE_THREADS = CFG["threads"] or workflow.cores
# Threads a cell's job takes (the measurement's own threads are MEASURE_THREADS).
CELL_THREADS = 1 if RESIDENT_CLIENTS else MEASURE_THREADS


def planned_cell_jobs() -> int:
    """Cell jobs this run executes (what Snakemake's job stats count): the progress line's total."""
    return sum(1 for job in workflow.dag.needrun_jobs() if job.rule.name in ("kernel_cell", "cp_cell"))
