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
from .. import run_dir
from . import parquet as results
from ..execution.cache import kept_rows
from ..execution.cache.atomic import write_json_atomic

LOST_DIR = Path(run_dir.LOST)
DEFAULT_SLURM_LOGDIR = Path(".snakemake/slurm_logs")

_ENTRY_START = re.compile(r"^\[|^Error in (rule|group) ")
_LOG_LINE = re.compile(r"^\s*log: (.*?)(?: \(check log file\(s\) for error details\))?$")
_CELL_OUTPUT = re.compile(rf"({re.escape(run_dir.CELLS)}/[^\s,]+\.json)")


def slurm_logdir(workflow) -> Path:
    """Where the SLURM executor writes each job's log: ``--slurm-logdir`` (relative to the working
    directory) or its default."""
    logdir = getattr(getattr(workflow, "executor_settings", None), "logdir", None)
    return Path(logdir) if logdir else DEFAULT_SLURM_LOGDIR


def _is_under(path: str, root: Path) -> bool:
    p, r = Path(path), Path(root)
    p = p if p.is_absolute() else Path.cwd() / p
    r = r if r.is_absolute() else Path.cwd() / r
    return r == p or r in p.parents


def slurm_logs_by_cell(main_logs, logdir: Path = DEFAULT_SLURM_LOGDIR) -> dict[str, str]:
    """Cell file → the SLURM log of the failed job it was in, from Snakemake's own log(s) of the run.

    Each error entry ("Error in rule …" / "Error in group …") names the outputs of the jobs in it
    and, on a ``log:`` line beside the rule's own logs, the job's SLURM log: the path under
    ``logdir``."""
    mapping: dict[str, str] = {}
    if isinstance(main_logs, (str, os.PathLike)):
        main_logs = [main_logs]
    lines = []
    for log in main_logs or ():
        if os.path.exists(log):
            lines += Path(log).read_text(errors="replace").splitlines()
    entries: list[list[str]] = [[]]
    for line in lines:
        if _ENTRY_START.search(line):
            entries.append([])
        entries[-1].append(line)
    for entry in entries:
        cells, job_logs = [], []
        for line in entry:
            if m := _LOG_LINE.match(line):
                job_logs += [p.strip() for p in m.group(1).split(",") if _is_under(p.strip(), logdir)]
            elif "output:" in line:
                cells += _CELL_OUTPUT.findall(line)
        if job_logs:
            for cell in cells:
                mapping.setdefault(cell, job_logs[-1])
    return mapping


def _job_log(cell_path: str, logdir: Path) -> str | None:
    """The newest SLURM log that mentions the cell's output file."""
    found = []
    for log in logdir.rglob("*.log") if logdir.exists() else ():
        try:
            if cell_path in log.read_text(errors="replace"):
                found.append(log)
        except OSError:
            continue
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def loss(cell_path: str, known: dict[str, str], logdir: Path) -> tuple[str, str | None]:
    """Why the cell has no row, and its job's SLURM id: the executor names each job's log
    ``<job id>.log``."""
    log = known.get(cell_path) or _job_log(cell_path, logdir)
    where = f"SLURM log: {log}" if log else f"no SLURM log under {logdir} mentions it"
    job = Path(log).stem if log and Path(log).stem.isdigit() else None
    return f"the cell's job failed or was cancelled before the cell wrote its row ({where})", job


def record(cfg: dict, kernel_cells: Iterable, cp_cells: Iterable, main_log=None,
           slurm_logdir: Path = DEFAULT_SLURM_LOGDIR) -> list[dict]:
    """Failure rows for the expected cells with no row; ``main_log``: Snakemake's log(s) of the run.

    A cell whose job failed after the cell had finished has its kept row (Snakemake deleted its
    file with the job's other outputs): that row stands for it, and the next run writes it back."""
    from ..execution.cluster.cp_launch import failure_row as cp_failure_row
    from ..execution.processes.runner import failure_row as kernel_failure_row

    lost = []
    known = slurm_logs_by_cell(main_log, slurm_logdir)
    kernel_rows, cp_rows = [], []
    for cell in kernel_cells:
        if os.path.exists(cell.path):
            kernel_rows.append(cell.path)
            continue
        settings = longca_config.cell_settings(cfg, cell.kernel, cell.mask, cell.seqlen, cell.direction, cell.dtype)
        if kept := _kept(cell.path, settings):
            kernel_rows.append(kept)
            continue
        reason, job = loss(cell.path, known, slurm_logdir)
        row = kernel_failure_row(settings, "error", reason, 0.0)
        row.update(cell_id=cell.name, slurm_job_id=job)
        lost.append((cell.path, row))
    for cell in cp_cells:
        if os.path.exists(cell.path):
            cp_rows.append(cell.path)
            continue
        settings = longca_config.cp_cell_settings(cfg, cell.strategy, cell.mask, cell.tokens_per_rank,
                                                  cell.cp_size, cell.direction, cell.dtype)
        if kept := _kept(cell.path, settings):
            cp_rows.append(kept)
            continue
        reason, job = loss(cell.path, known, slurm_logdir)
        row = cp_failure_row(settings, "error", reason, cell_id=cell.name, fingerprint=None, wall_s=0.0)
        row["slurm_job_id"] = job
        lost.append((cell.path, row))
    out = []
    for path, row in lost:
        target = LOST_DIR / Path(path).relative_to(run_dir.CELLS)
        write_json_atomic(row, target)
        out.append(row)
        (cp_rows if row.get("kind") == "cp" else kernel_rows).append(str(target))
    kept_any = any("/lost/kept/" in str(path) for path in kernel_rows + cp_rows)
    if lost or kept_any:  # the run failed: the tables of what it has, while the main ones are not built
        results.aggregate(kernel_rows, run_dir.LOST_KERNEL_TABLE, schema=results.KERNEL_SCHEMA)
        results.aggregate(cp_rows, run_dir.LOST_CP_TABLE, schema=results.CP_SCHEMA)
    return out


def _kept(cell_path: str, settings: dict) -> str | None:
    """A file holding the cell's kept row when it was measured with these settings, else None."""
    row = kept_rows.row_for_settings(cell_path, settings)
    if row is None:
        return None
    target = LOST_DIR / "kept" / Path(cell_path).relative_to(run_dir.CELLS)
    write_json_atomic(row, target)
    return str(target)


def clear() -> None:
    """Remove the stand-in rows and tables of an earlier failed run."""
    import shutil

    shutil.rmtree(LOST_DIR, ignore_errors=True)
    for table in (run_dir.LOST_KERNEL_TABLE, run_dir.LOST_CP_TABLE):
        if os.path.exists(table):
            os.remove(table)
