"""The results schemas and the Parquet tables built from cell rows.

``results/kernels.parquet`` holds one row per kernel cell, ``results/cp.parquet`` one row per
context-parallel cell.  Each schema is versioned on its own: a change that renames, removes or
retypes a column bumps its version (``SCHEMA_VERSION``, ``CP_SCHEMA_VERSION``); adding a nullable
column does not.  docs/results-schema.md describes every column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from ..timing_spec import CountedTiming, TimingSpec, own_fields
from ..execution.cache.atomic import write_json_atomic  # noqa: F401 — re-exported: rows are written through results

# 2: peak_mem_bytes is what one call needs (the memory part), gate_seqlen the length the gate checked.
SCHEMA_VERSION = 2
# 2: gate_seqlen is the length the gate checked, and gate_area is new.
CP_SCHEMA_VERSION = 3

_ARROW_TYPES = {int: pa.int32(), float: pa.float64(), bool: pa.bool_()}


def _timing_columns(kind: type) -> list[tuple[str, pa.DataType]]:
    """The columns of the timing settings ``kind`` adds (``longca.timing_spec``), typed by their defaults."""
    return [(f.name, _ARROW_TYPES[type(f.default)]) for f in own_fields(kind)]


# Column groups both tables share (same names, types and meaning).
_PROBLEM = [
    ("mask", pa.string()),
    ("pattern", pa.string()),
    ("seqlen", pa.int64()),
    ("direction", pa.string()),
    ("dtype", pa.string()),
    ("batch", pa.int32()),
    ("heads_q", pa.int32()),
    ("heads_kv", pa.int32()),
    ("head_dim", pa.int32()),
    ("head_dim_v", pa.int32()),  # null: head_dim (set only where v's head dim differs)
    ("mask_params", pa.string()),
    ("mask_params_resolved", pa.string()),
    ("seed", pa.int64()),
    ("device", pa.string()),
    *_timing_columns(CountedTiming),
    ("gate_seqlen", pa.int64()),
]
_OUTCOME = [
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
]
_GATE = [("gate_error", pa.float64()), ("gate_tolerance", pa.float64()), ("gate_detail", pa.string()),
         ("gate_area", pa.int64())]
_SOFTWARE = [("torch_version", pa.string()), ("cuda_version", pa.string()), ("driver_version", pa.string())]
_PROVENANCE = [("slurm_job_id", pa.string()), ("fingerprint", pa.string()), ("wall_s", pa.float64())]
_ID = [("schema_version", pa.int32()), ("kind", pa.string()), ("cell_id", pa.string())]

KERNEL_SCHEMA = pa.schema(
    _ID + [("kernel", pa.string())] + _PROBLEM + [("model", pa.string())] + _timing_columns(TimingSpec)
    + _OUTCOME + [
        ("tflops", pa.float64()),
        ("tflops_p20", pa.float64()),
        ("tflops_p80", pa.float64()),
        ("peak_mem_bytes", pa.int64()),
        ("warmup_calls", pa.int32()),
        ("warmup_spent_ms", pa.float64()),
        ("warmup_steady", pa.bool_()),
        ("timed_via", pa.string()),
        ("host_ms", pa.float64()),
    ] + _GATE + [
        ("notes", pa.string()),
        ("device_name", pa.string()),
        ("cpu_name", pa.string()),
        ("cpu_threads", pa.int32()),
        ("hostname", pa.string()),
    ] + _SOFTWARE + [("libraries", pa.string()), ("kernel_library", pa.string())] + _PROVENANCE + [
        ("timed_at", pa.string()),
        ("timed_on", pa.string()),
        ("timed_load_1m", pa.float64()),
        ("timed_library", pa.string()),
        ("gate_at", pa.string()),
        ("gate_on", pa.string()),
        ("gate_library", pa.string()),
        ("memory_at", pa.string()),
        ("memory_on", pa.string()),
        ("memory_library", pa.string()),
        ("memory_via", pa.string()),
        ("parts_reused", pa.string()),
        ("gate_wall_s", pa.float64()),
        ("time_wall_s", pa.float64()),
        ("memory_wall_s", pa.float64()),
        ("kernel_options", pa.string()),
        ("gpu_slot", pa.string()),
        ("isolation", pa.string()),
    ])

# One row per CP cell: one strategy at one CP size on one mask, seqlen, direction and dtype.  A CP
# step is as slow as its slowest rank, so the headline times are the slowest rank's (per iteration:
# the max over ranks); per-rank lists (index = rank) keep the imbalance visible.
CP_SCHEMA = pa.schema(
    _ID + [
        ("strategy", pa.string()),
        ("strategy_options", pa.string()),
        ("cp_size", pa.int32()),
        ("nodes", pa.int32()),
        ("local_kernel", pa.string()),
        ("layout", pa.string()),
        ("tokens_per_rank", pa.int64()),
    ] + _PROBLEM + _OUTCOME + [
        ("rank_median_ms", pa.list_(pa.float64())),
        ("rank_p20_ms", pa.list_(pa.float64())),
        ("rank_p80_ms", pa.list_(pa.float64())),
        ("tflops_per_gpu", pa.float64()),
        ("tflops_per_gpu_p20", pa.float64()),
        ("tflops_per_gpu_p80", pa.float64()),
        ("peak_mem_bytes", pa.int64()),
        ("rank_peak_mem_bytes", pa.list_(pa.int64())),
        ("inputs_held", pa.string()),
        ("comm_bytes", pa.int64()),
        ("rank_comm_bytes", pa.list_(pa.int64())),
        ("rank_area", pa.list_(pa.int64())),
    ] + _GATE + [
        ("notes", pa.string()),
        ("backend", pa.string()),
        ("device_name", pa.string()),
        ("cpu_name", pa.string()),
        ("hostnames", pa.list_(pa.string())),
    ] + _SOFTWARE + [("nccl_version", pa.string()), ("libraries", pa.string())] + _PROVENANCE + [
        ("timed_at", pa.string()),
        ("timed_on", pa.string()),
        ("timed_load_1m", pa.float64()),
        ("isolation", pa.string()),
        ("group_cell", pa.int32()),
        ("gate_wall_s", pa.float64()),
        ("timed_wall_s", pa.float64()),
        ("job_wall_s", pa.float64()),
        ("timed_via", pa.string()),
        ("host_ms", pa.float64()),
        ("cp_env", pa.string()),
        ("cp_env_vars", pa.string()),
        # Exposed communication, measured (config cp_exposed_comm): the step again with every
        # collective a local copy of its bytes; null unless asked for.
        ("step_ms_local_comm", pa.float64()),
        ("step_ms_local_comm_p20", pa.float64()),
        ("step_ms_local_comm_p80", pa.float64()),
        ("exposed_comm_ms", pa.float64()),
        ("exposed_comm_via", pa.string()),
        ("local_comm_wall_s", pa.float64()),
    ])

_VERSIONS = {id(KERNEL_SCHEMA): SCHEMA_VERSION, id(CP_SCHEMA): CP_SCHEMA_VERSION}


def read_rows(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        with open(p) as f:
            try:
                row = json.load(f)
            except ValueError as exc:  # rows are written atomically: only a foreign edit gets here
                row = exc
        if not isinstance(row, dict):
            # The cell's name is its file's path under results/cells/<kind>/ (longca.cells): the row
            # says which cell it is, so tables and figures place it like any failed cell.
            row = {"cell_id": "/".join(Path(p).with_suffix("").parts[-3:]), "status": "error",
                   "reason": f"aggregate: {p} holds no JSON object ({row}); delete it to measure the cell again",
                   **_identity(str(p))}
        rows.append(row)
    return rows


def _identity(path: str) -> dict[str, Any]:
    """What a row file's path says about its cell: kind, names, length, direction, dtype."""
    from ..cells import CPCell, cp_seqlen, from_name

    cell = from_name(path)
    if cell is None:
        return {}
    fields = {"mask": cell.mask, "direction": cell.direction, "dtype": cell.dtype}
    if isinstance(cell, CPCell):
        return {**fields, "kind": "cp", "strategy": cell.strategy, "cp_size": cell.cp_size,
                "tokens_per_rank": cell.tokens_per_rank, "seqlen": cp_seqlen(cell.tokens_per_rank, cell.cp_size)}
    return {**fields, "kind": "kernel", "kernel": cell.kernel, "seqlen": cell.seqlen}


# What building a table from Python values raises when a value does not fit its column's type.
_UNFIT = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError, ValueError)


def _fits(values: list, type_: pa.DataType) -> bool:
    try:
        pa.array(values, type=type_)
    except _UNFIT:
        return False
    return True


def _fitted(rows: list[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    """``rows`` with every value that does not fit its column (a count past int32, text where a
    number goes) taken out and its row made an ``error`` row whose reason names the field, so one bad
    row never costs the whole table; the other rows are kept as they are."""
    unfit: dict[int, dict[str, str]] = {}  # row index -> {field: why}
    for field in schema:
        values = [row.get(field.name) for row in rows]
        if field.name == "schema_version" or _fits(values, field.type):
            continue
        for i, value in enumerate(values):
            if not _fits([value], field.type):
                unfit.setdefault(i, {})[field.name] = f"{field.name} = {value!r} does not fit its column ({field.type})"
    rows = list(rows)
    for i, fields in unfit.items():
        row = {**rows[i], **dict.fromkeys(fields)}
        was = f"; the cell's own status: {row.get('status')}" + (f" ({row['reason']})" if row.get("reason") else "")
        row.update(status="error", reason=f"aggregate: {'; '.join(fields.values())}{was}")
        rows[i] = row
    return rows


def to_table(rows: list[dict[str, Any]], schema: pa.Schema = KERNEL_SCHEMA) -> pa.Table:
    try:
        return _table(rows, schema)
    except _UNFIT:  # looked for value by value only then: a large table is built once
        return _table(_fitted(rows, schema), schema)


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    if schema is KERNEL_SCHEMA:
        rows = [_without_harness_peak(row) for row in rows]
    columns = {name: [row.get(name) for row in rows] for name in schema.names}
    columns["schema_version"] = [_VERSIONS.get(id(schema), SCHEMA_VERSION)] * len(rows)
    return pa.Table.from_pydict(columns, schema=schema)


def _without_harness_peak(row: dict[str, Any]) -> dict[str, Any]:
    """A kernel row written before a cell had parts (no ``parts_reused`` key) holds the timing
    harness's peak in ``peak_mem_bytes``, which is not what the column means since schema 2 (what
    one call needs): the table leaves it out rather than mix the two.  The row's file keeps it."""
    if "parts_reused" in row or row.get("peak_mem_bytes") is None:
        return row
    return {**row, "peak_mem_bytes": None}


# Several presets of one shape and mask share its cells: their names in one ``model`` value.
MODEL_SEPARATOR = ", "


def with_models(rows: list[dict[str, Any]], models: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Each row with its ``model`` column: the presets its mask serves (``longca.config.label_models``
    of the run's config; rows measure a shape, not a model, so the config says which models use it)."""
    return [{**row, "model": MODEL_SEPARATOR.join(models[row["mask"]])} if row.get("mask") in models else row
            for row in rows]


def aggregate(cell_paths: Iterable[str | os.PathLike], out: str | os.PathLike,
              schema: pa.Schema = KERNEL_SCHEMA, models: dict[str, list[str]] | None = None) -> pa.Table:
    table = to_table(with_models(read_rows(cell_paths), models or {}), schema)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)
    return table


def load(path: str | os.PathLike):
    """The table as a pandas DataFrame."""
    return pq.read_table(path).to_pandas()
