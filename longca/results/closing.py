"""The line a finished run ends with: where the report is and what the tables hold."""

from __future__ import annotations

import os
from pathlib import Path

from .. import run_dir
from . import parquet, tables

TABLES = (("kernel", "kernels.parquet"), ("CP", "cp.parquet"))


def _counts(path: Path) -> str | None:
    if not path.exists():
        return None
    counts = tables.status_counts(parquet.load(path))  # the report header's counts, in its order
    return f"{sum(n for _, n in counts)} ({', '.join(f'{n} {s}' for s, n in counts)})" if counts else "0"


def line(results: str | os.PathLike = run_dir.ROOT) -> str | None:
    """``LongCA: results/report.html · kernel cells 48 (40 ok, 8 unsupported) · CP cells …``, or None
    when the report is not up to date with the tables (a run that made only some of them)."""
    results = Path(results)
    report = results / "report.html"
    made = [results / name for _, name in TABLES if (results / name).exists()]
    if not report.exists() or any(t.stat().st_mtime > report.stat().st_mtime for t in made):
        return None
    counts = [f"{label} cells {c}" for label, name in TABLES if (c := _counts(results / name))]
    return " · ".join([f"LongCA: {report}"] + counts)
