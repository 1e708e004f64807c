"""The results schema and the Parquet tables built from cell rows.

``results/kernels.parquet`` holds one row per kernel cell.  The schema is versioned: a change
that renames, removes or retypes a column bumps ``SCHEMA_VERSION``; adding a nullable column
does not.  docs/results-schema.md describes every column.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1

KERNEL_SCHEMA = pa.schema([
    ("schema_version", pa.int32()),
    ("kind", pa.string()),
    ("cell_id", pa.string()),
    ("kernel", pa.string()),
    ("mask", pa.string()),
    ("pattern", pa.string()),
    ("seqlen", pa.int64()),
    ("direction", pa.string()),
    ("dtype", pa.string()),
    ("batch", pa.int32()),
    ("heads_q", pa.int32()),
    ("heads_kv", pa.int32()),
    ("head_dim", pa.int32()),
    ("mask_params", pa.string()),
    ("mask_params_resolved", pa.string()),
    ("seed", pa.int64()),
    ("device", pa.string()),
    ("warmup", pa.int32()),
    ("reps", pa.int32()),
    ("gate_seqlen", pa.int64()),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("area", pa.int64()),
    ("density", pa.float64()),
    ("flops", pa.float64()),
    ("median_ms", pa.float64()),
    ("p20_ms", pa.float64()),
    ("p80_ms", pa.float64()),
    ("min_ms", pa.float64()),
    ("max_ms", pa.float64()),
    ("tflops", pa.float64()),
    ("tflops_p20", pa.float64()),
    ("tflops_p80", pa.float64()),
    ("peak_mem_bytes", pa.int64()),
    ("gate_error", pa.float64()),
    ("gate_tolerance", pa.float64()),
    ("gate_detail", pa.string()),
    ("notes", pa.string()),
    ("device_name", pa.string()),
    ("cpu_name", pa.string()),
    ("cpu_threads", pa.int32()),
    ("hostname", pa.string()),
    ("torch_version", pa.string()),
    ("cuda_version", pa.string()),
    ("driver_version", pa.string()),
    ("libraries", pa.string()),
    ("slurm_job_id", pa.string()),
    ("fingerprint", pa.string()),
    ("wall_s", pa.float64()),
])


def write_json_atomic(row: dict[str, Any], path: str | os.PathLike) -> None:
    """Write a row so that a reader sees the whole file or none of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(row, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_rows(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        with open(p) as f:
            rows.append(json.load(f))
    return rows


def to_table(rows: list[dict[str, Any]], schema: pa.Schema = KERNEL_SCHEMA) -> pa.Table:
    columns = {name: [row.get(name) for row in rows] for name in schema.names}
    columns["schema_version"] = [SCHEMA_VERSION] * len(rows)
    return pa.Table.from_pydict(columns, schema=schema)


def aggregate(cell_paths: Iterable[str | os.PathLike], out: str | os.PathLike,
              schema: pa.Schema = KERNEL_SCHEMA) -> pa.Table:
    table = to_table(read_rows(cell_paths), schema)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)
    return table


def load(path: str | os.PathLike):
    """The table as a pandas DataFrame."""
    return pq.read_table(path).to_pandas()
