"""The line a finished run ends with: where the report is and what the tables hold."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

TABLES = (("kernel", "kernels.parquet"), ("CP", "cp.parquet"))


def _counts(path: Path) -> str | None:
    if not path.exists():
        return None
    statuses = Counter(pq.read_table(path, columns=["status"]).column("status").to_pylist())
    order = ["ok", "unsupported", "wrong", "oom", "error", "timeout"]
    parts = [f"{statuses[s]} {s}" for s in order if statuses.get(s)]
    parts += [f"{n} {s}" for s, n in sorted(statuses.items()) if s not in order]
    return f"{sum(statuses.values())} ({', '.join(parts)})" if parts else "0"


def line(results: str | os.PathLike = "results") -> str | None:
    """``LongCA: results/report.html · kernel cells 48 (40 ok, 8 unsupported) · CP cells …``, or None
    when the report is not up to date with the tables (a run that made only some of them)."""
    results = Path(results)
    report = results / "report.html"
    tables = [results / name for _, name in TABLES if (results / name).exists()]
    if not report.exists() or any(t.stat().st_mtime > report.stat().st_mtime for t in tables):
        return None
    counts = [f"{label} cells {c}" for label, name in TABLES if (c := _counts(results / name))]
    return " · ".join([f"LongCA: {report}"] + counts)
