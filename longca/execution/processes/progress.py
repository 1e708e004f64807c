"""One progress line for a long run: how the measurements go, not just how many jobs finished.

Snakemake's "N of M steps done" counts jobs; a person watching a 2,000-cell run also wants to know
how many cells measured, how many were unsupported or failed, which cell was slowest and how long
is left.  So:

* at the start of a run (the Snakefile's ``onstart``) ``start`` records how many cell jobs Snakemake
  planned and points the cell jobs at ``results/progress/`` (``$LONGCA_PROGRESS_DIR``);
* every kernel or CP cell job, after writing its row, ``record``s one line (time, cell id, status,
  wall_s) in ``results/progress/cells.tsv`` under a file lock (jobs run concurrently);
* at most every ``$LONGCA_PROGRESS_EVERY_S`` seconds (default 30), and for the run's last cell, the
  job that records prints the summary to its stdout, which reaches Snakemake's terminal (a cell
  job's stderr goes to its log file):

  ``longca progress: 412/2016 cells · ok 380 · unsupported 28 · failed 4 (oom 4) · slowest
  flex/causal/bfloat16_bwd_32768 41 s · ~9 min left``

A cell run by hand (no ``$LONGCA_PROGRESS_DIR``) records nothing, and a failure to record is a
warning on stderr, never a failed cell.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ... import run_dir
from ..cache.atomic import write_json_atomic

DIR_ENV = "LONGCA_PROGRESS_DIR"
EVERY_ENV = "LONGCA_PROGRESS_EVERY_S"
DEFAULT_DIR = run_dir.PROGRESS
DEFAULT_EVERY_S = 30.0
# The time left extrapolates the pace of the last RECENT cells: the pace changes along a grid
# (longer sequences come later), and the run's start (imports, the warm worker) should fade out.
RECENT = 50


@dataclass(frozen=True)
class Record:
    time: float     # when the row was written (epoch seconds)
    cell_id: str
    status: str
    wall_s: float   # the cell's own wall time (its row's wall_s)

    def line(self) -> str:
        return f"{self.time:.3f}\t{self.cell_id}\t{self.status}\t{self.wall_s:.3f}\n"

    @classmethod
    def parse(cls, line: str) -> "Record":
        t, cell_id, status, wall = line.rstrip("\n").split("\t")
        return cls(float(t), cell_id, status, float(wall))


def start(planned: int, directory: str | os.PathLike = DEFAULT_DIR) -> None:
    """A new run: ``planned`` cell jobs to come; earlier runs' records are dropped."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cells.tsv").write_text("")
    now = time.time()
    write_json_atomic({"planned": int(planned), "started": now, "printed": now}, directory / "run.json")
    os.environ[DIR_ENV] = str(directory)  # the cell jobs Snakemake starts from now on inherit it


def record(cell_id: str, row: dict) -> None:
    """Record a finished cell of the current run; print the summary line when one is due."""
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return
    try:
        line = _record(Path(directory), Record(time.time(), cell_id, str(row.get("status")),
                                               float(row.get("wall_s") or 0.0)))
    except (OSError, ValueError, KeyError) as exc:
        print(f"longca progress: cell not recorded ({type(exc).__name__}: {exc})", file=sys.stderr)
        return
    if line:
        print(line, flush=True)


def _record(directory: Path, new: Record) -> str | None:
    every_s = float(os.environ.get(EVERY_ENV, DEFAULT_EVERY_S))
    with open(directory / "cells.tsv", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        f.write(new.line())
        f.flush()
        f.seek(0)
        records = [Record.parse(line) for line in f if line.strip()]
        run = json.loads((directory / "run.json").read_text())
        if len(records) < run["planned"] and new.time - run["printed"] < every_s:
            return None
        run["printed"] = new.time
        write_json_atomic(run, directory / "run.json")
    return summary(records, run["planned"], run["started"], new.time)


def summary(records: list[Record], planned: int, started: float, now: float) -> str:
    """``longca progress: done/planned cells · ok · unsupported · failed · slowest · time left``."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    ok, unsupported = counts.pop("ok", 0), counts.pop("unsupported", 0)
    failed = sum(counts.values())
    parts = [f"{len(records)}/{planned} cells", f"ok {ok}", f"unsupported {unsupported}", f"failed {failed}"]
    if failed:  # which failures: oom, timeout, wrong, error
        parts[-1] += " (" + ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) + ")"
    if records:
        slowest = max(records, key=lambda r: r.wall_s)
        parts.append(f"slowest {slowest.cell_id} {_duration(slowest.wall_s)}")
    remaining = planned - len(records)
    if remaining > 0 and records:
        # Time between finished cells, not a cell's own wall_s: it includes each job's start-up and
        # divides by however many cells run at once (one per GPU).
        recent = records[-RECENT:]
        since = records[-RECENT - 1].time if len(records) > RECENT else started
        pace = max(now - since, 0.0) / len(recent)
        parts.append(f"~{_duration(remaining * pace)} left")
    elif remaining <= 0:
        parts.append(f"done in {_duration(now - started)}")
    return "longca progress: " + " · ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
