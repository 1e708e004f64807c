"""The run directory: every path a run writes under ``results/``, named once.

The Snakefile and its rules, the cell jobs, the cache, progress and status readers and the report
take their paths from here; no other module spells ``results/``.  Paths are relative to the
directory Snakemake runs in (``--directory``), as Snakemake's own inputs and outputs are.
"""

from __future__ import annotations

ROOT = "results"

# What a run is for.
KERNEL_TABLE = f"{ROOT}/kernels.parquet"
CP_TABLE = f"{ROOT}/cp.parquet"
REPORT = f"{ROOT}/report.html"
CEILINGS = f"{ROOT}/ceilings.json"
FIGURES = f"{ROOT}/figures"

# One file per cell (the row) and its log; Snakemake owns these.
CELLS = f"{ROOT}/cells"
KERNEL_CELLS = f"{CELLS}/kernels"
CP_CELLS = f"{CELLS}/cp"
CP_UNPLACED_CELLS = f"{CELLS}/cp_unplaced"  # a CP cell this run cannot place
LOGS = f"{ROOT}/logs"
KERNEL_LOGS = f"{LOGS}/kernels"
CP_LOGS = f"{LOGS}/cp"
CEILINGS_LOG = f"{LOGS}/ceilings.log"

# Beside the files Snakemake owns (it deletes a job's outputs when the job fails).
KEPT = f"{ROOT}/kept"          # each cell's row with its settings (longca.execution.cache.kept_rows)
STORE = f"{ROOT}/store"        # each measured part by its key (longca.execution.cache.store)
PROGRESS = f"{ROOT}/progress"  # the progress line's counts (longca.execution.processes.progress)
COMPILE_CACHE = f"{ROOT}/compile_cache"  # the compilers' on-disk caches (longca.execution.cache.compile_cache)
LOST = f"{ROOT}/lost"          # stand-in rows of a failed run's lost cells (longca.results.lost_cells)
LOST_KERNEL_TABLE = f"{ROOT}/lost_kernels.parquet"
LOST_CP_TABLE = f"{ROOT}/lost_cp.parquet"
REPLACED = f"{ROOT}/replaced"  # rows and parts set aside to be measured again (longca.execution.cache.remeasure)


def figure(name: str) -> str:
    """A figure's file: ``figure("kernels_{mask}")`` → ``results/figures/kernels_{mask}.png``."""
    return f"{FIGURES}/{name}.png"


def cell_log(kind: str, cell_id: str) -> str:
    """The log of a ``kernel`` or ``cp`` cell."""
    return f"{KERNEL_LOGS if kind == 'kernel' else CP_LOGS}/{cell_id}.log"
