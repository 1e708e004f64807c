"""Cells whose job died before writing a row: rows that say so, with the job's log.

A cell's own failures (crash, hang, OOM, wrong answer) are rows written by the cell.  What no cell
can report is its *job* dying: a SLURM job cancelled, killed at its time limit or lost with its node.
When a run ends with failed jobs, the Snakefile's ``onerror`` handler calls ``record``: every
expected cell with no row gets a failure row in ``results/lost/`` naming the job's SLURM log, and
``results/lost_kernels.parquet`` / ``results/lost_cp.parquet`` hold the finished cells plus those
rows (same schemas as the main tables).  The main tables are not written: an existing
``results/kernels.parquet`` would make Snakemake treat the missing cells as disposable
intermediates, while with the cell files missing and the tables not yet built the next run
resubmits exactly the lost cells.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from .. import config as longca_config
from . import parquet as results
from ..execution.atomic import write_json_atomic

LOST_DIR = Path("results/lost")
SLURM_LOG_DIRS = (Path(".snakemake/slurm_logs"),)


_SLURM_LOG = re.compile(r"log: (\S*slurm_logs\S*\.log)")
_CELL_OUTPUT = re.compile(r"output: (results/cells/\S+\.json)")


def slurm_logs_by_cell(main_logs) -> dict[str, str]:
    """Cell file → the SLURM log of the job that failed with it, from Snakemake's own log(s) of the
    run (an error entry names the job's SLURM log, then the outputs of the jobs in it)."""
    mapping: dict[str, str] = {}
    if isinstance(main_logs, (str, os.PathLike)):
        main_logs = [main_logs]
    lines = []
    for log in main_logs or ():
        if os.path.exists(log):
            lines += Path(log).read_text(errors="replace").splitlines()
    current = None
    for line in lines:
        if line.startswith("["):  # a new timestamped entry
            current = None
        if m := _SLURM_LOG.search(line):
            current = m.group(1)
        elif (m := _CELL_OUTPUT.search(line)) and current:
            mapping.setdefault(m.group(1), current)
    return mapping


def _job_log(cell_path: str) -> str | None:
    """The newest SLURM log that mentions the cell's output file."""
    found = []
    for root in SLURM_LOG_DIRS:
        for log in root.rglob("*.log") if root.exists() else ():
            try:
                if cell_path in log.read_text(errors="replace"):
                    found.append(log)
            except OSError:
                continue
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def _reason(cell_path: str, known: dict[str, str]) -> str:
    log = known.get(cell_path) or _job_log(cell_path)
    where = f"SLURM log: {log}" if log else f"no SLURM log under {', '.join(map(str, SLURM_LOG_DIRS))} mentions it"
    return f"the cell's job failed or was cancelled before the cell wrote its row ({where})"


def record(cfg: dict, kernel_cells: Iterable, cp_cells: Iterable, main_log=None) -> list[dict]:
    """Failure rows for the expected cells with no row; ``main_log``: Snakemake's log(s) of the run."""
    from ..execution.cp_launch import failure_row as cp_failure_row
    from ..execution.runner import failure_row as kernel_failure_row

    lost = []
    known = slurm_logs_by_cell(main_log)
    kernel_rows, cp_rows = [], []
    for cell in kernel_cells:
        if os.path.exists(cell.path):
            kernel_rows.append(cell.path)
            continue
        settings = longca_config.cell_settings(cfg, cell.kernel, cell.mask, cell.seqlen, cell.direction, cell.dtype)
        row = kernel_failure_row(settings, "error", _reason(cell.path, known), 0.0)
        row["cell_id"] = cell.name
        lost.append((cell.path, row))
    for cell in cp_cells:
        if os.path.exists(cell.path):
            cp_rows.append(cell.path)
            continue
        settings = longca_config.cp_cell_settings(cfg, cell.strategy, cell.mask, cell.tokens_per_rank,
                                                  cell.cp_size, cell.direction, cell.dtype)
        cell_id = cell.path.removeprefix("results/cells/cp/").removesuffix(".json")
        lost.append((cell.path, cp_failure_row(settings, "error", _reason(cell.path, known), cell_id=cell_id,
                                               fingerprint=None, wall_s=0.0)))
    out = []
    for path, row in lost:
        target = LOST_DIR / Path(path).relative_to("results/cells")
        write_json_atomic(row, target)
        out.append(row)
        (cp_rows if row.get("kind") == "cp" else kernel_rows).append(str(target))
    if lost:
        results.aggregate(kernel_rows, "results/lost_kernels.parquet", schema=results.KERNEL_SCHEMA)
        results.aggregate(cp_rows, "results/lost_cp.parquet", schema=results.CP_SCHEMA)
    return out


def clear() -> None:
    """Remove the stand-in rows and tables of an earlier failed run."""
    import shutil

    shutil.rmtree(LOST_DIR, ignore_errors=True)
    for table in ("results/lost_kernels.parquet", "results/lost_cp.parquet"):
        if os.path.exists(table):
            os.remove(table)
