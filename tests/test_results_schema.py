"""Every column of both Parquet schemas is documented, and the tables round-trip their rows."""

import os
import re
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from longca.results import parquet as results

DOC = (Path(__file__).resolve().parent.parent / "docs" / "results-schema.md").read_text()


def documented(section: str) -> set[str]:
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= set(re.findall(r"`([a-z_0-9]+)`", first_cell))
    return names


KERNEL_DOC, CP_DOC = DOC.split("# CP results schema")


@pytest.mark.parametrize("schema, section", [(results.KERNEL_SCHEMA, KERNEL_DOC), (results.CP_SCHEMA, CP_DOC)],
                         ids=["kernels", "cp"])
def test_every_column_is_documented(schema, section):
    assert set(schema.names) - documented(section) == set()


def test_cp_rows_with_per_rank_lists_round_trip(tmp_path):
    row = {"kind": "cp", "strategy": "ring", "cp_size": 2, "status": "ok", "median_ms": 2.0,
           "rank_median_ms": [1.5, 2.0], "rank_comm_bytes": [1024, 2048], "hostnames": ["a", "b"]}
    path = tmp_path / "cell.json"
    results.write_json_atomic(row, path)
    table = results.aggregate([path], tmp_path / "cp.parquet", schema=results.CP_SCHEMA)
    back = pq.read_table(tmp_path / "cp.parquet").to_pylist()[0]
    assert table.num_rows == 1 and back["schema_version"] == results.CP_SCHEMA_VERSION
    assert back["rank_median_ms"] == [1.5, 2.0] and back["rank_comm_bytes"] == [1024, 2048]
    assert back["tflops_per_gpu"] is None


def test_an_empty_table_still_has_its_schema(tmp_path):
    results.aggregate([], tmp_path / "cp.parquet", schema=results.CP_SCHEMA)
    assert pq.read_schema(tmp_path / "cp.parquet").equals(results.CP_SCHEMA, check_metadata=False)


def test_a_value_that_does_not_fit_its_column_costs_only_its_row(tmp_path):
    """A count past int32 (or text where a number goes) makes that row an `error` row naming the
    field; the table is written with every other row as it was."""
    good = {"kind": "kernel", "cell_id": "sdpa/full/float32_fwd_64", "status": "ok", "reps": 7, "tflops": 1.5}
    huge = {"kind": "kernel", "cell_id": "sdpa/full/float32_fwd_128", "status": "ok", "reps": 10**12, "tflops": 2.0}
    text = {"kind": "kernel", "cell_id": "sdpa/full/float32_bwd_64", "status": "unsupported", "reason": "no bwd",
            "seqlen": "many"}
    paths = []
    for i, row in enumerate([good, huge, text]):
        paths.append(tmp_path / f"{i}.json")
        results.write_json_atomic(row, paths[-1])
    (tmp_path / "torn.json").write_text('{"cell_id": ')
    paths.append(tmp_path / "torn.json")
    results.aggregate(paths, tmp_path / "kernels.parquet")
    rows = {r["cell_id"]: r for r in pq.read_table(tmp_path / "kernels.parquet").to_pylist()}
    assert len(rows) == 4
    assert (rows["sdpa/full/float32_fwd_64"]["status"], rows["sdpa/full/float32_fwd_64"]["reps"]) == ("ok", 7)
    bad = rows["sdpa/full/float32_fwd_128"]
    assert bad["status"] == "error" and bad["reps"] is None and bad["tflops"] == 2.0
    assert bad["reason"].startswith("aggregate: reps = 1000000000000 does not fit its column (int32)")
    assert "the cell's own status: ok" in bad["reason"]
    assert rows["sdpa/full/float32_bwd_64"]["status"] == "error"
    assert "seqlen = 'many' does not fit" in rows["sdpa/full/float32_bwd_64"]["reason"]
    assert "the cell's own status: unsupported (no bwd)" in rows["sdpa/full/float32_bwd_64"]["reason"]
    torn = [r for r in rows.values() if "holds no JSON object" in (r["reason"] or "")]
    assert len(torn) == 1 and torn[0]["status"] == "error"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_rows_are_written_with_the_umasks_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        results.write_json_atomic({"status": "ok"}, tmp_path / "cell.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "cell.json").stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["cell.json"]  # no temporary file left


def test_a_kernel_row_without_a_memory_part_has_no_peak_in_the_table(tmp_path):
    """Rows written before cells had parts held the timing harness's peak: the table leaves it out
    (the column means one call's need since schema 2); the row's file keeps it."""
    old = {"kind": "kernel", "cell_id": "a/full/float32_fwd_64", "status": "ok", "peak_mem_bytes": 123}
    new = {"kind": "kernel", "cell_id": "b/full/float32_fwd_64", "status": "ok", "peak_mem_bytes": 456,
           "parts_reused": None}
    paths = []
    for i, row in enumerate((old, new)):
        paths.append(tmp_path / f"{i}.json")
        results.write_json_atomic(row, paths[-1])
    back = pq.read_table(results.aggregate(paths, tmp_path / "k.parquet") and tmp_path / "k.parquet").to_pylist()
    assert [r["peak_mem_bytes"] for r in back] == [None, 456]
    assert '"peak_mem_bytes": 123' in paths[0].read_text()


def test_the_aggregate_command_picks_the_schema_by_the_rows_kind(tmp_path):
    """`longca aggregate` on CP cells writes a CP table (it wrote them into the kernel schema, losing
    every CP column), and refuses a mix of kinds."""
    import subprocess
    import sys

    cp_row = {"kind": "cp", "strategy": "ring", "cp_size": 2, "status": "ok", "rank_area": [3, 4]}
    kernel_row = {"kind": "kernel", "kernel": "sdpa", "status": "ok"}
    for name, row in (("cp.json", cp_row), ("kernel.json", kernel_row)):
        results.write_json_atomic(row, tmp_path / name)
    cmd = [sys.executable, "-m", "longca", "aggregate", "--out"]
    subprocess.run(cmd + [str(tmp_path / "cp.parquet"), str(tmp_path / "cp.json")], check=True)
    back = pq.read_table(tmp_path / "cp.parquet").to_pylist()[0]
    assert back["schema_version"] == results.CP_SCHEMA_VERSION and back["rank_area"] == [3, 4]
    mixed = subprocess.run(cmd + [str(tmp_path / "x.parquet"), str(tmp_path / "cp.json"), str(tmp_path / "kernel.json")],
                           capture_output=True, text=True)
    assert mixed.returncode != 0 and "kinds cp, kernel" in mixed.stderr


def test_a_torn_row_file_names_its_cell_so_tables_and_figures_place_it(tmp_path):
    """A row file that holds no JSON (a foreign edit, a full disk) becomes an error row of the cell its
    path names, kernel, mask and length included: the figures draw it as a failed cell instead of
    failing on a row without a kernel or mask."""
    from longca.results import plots

    cells = tmp_path / "results" / "cells" / "kernels" / "sdpa" / "full"
    cells.mkdir(parents=True)
    good = {"kind": "kernel", "cell_id": "sdpa/full/float32_fwd_64", "kernel": "sdpa", "mask": "full",
            "seqlen": 64, "direction": "fwd", "dtype": "float32", "status": "ok", "tflops": 1.0, "median_ms": 1.0}
    results.write_json_atomic(good, cells / "float32_fwd_64.json")
    (cells / "float32_fwd_128.json").write_text('{"cell_id": ')
    results.aggregate(sorted(cells.glob("*.json")), tmp_path / "kernels.parquet")
    table = results.load(tmp_path / "kernels.parquet")
    torn = table[table["cell_id"] == "sdpa/full/float32_fwd_128"].iloc[0]
    assert (torn["status"], torn["kernel"], torn["mask"], torn["seqlen"], torn["direction"], torn["dtype"]) == \
        ("error", "sdpa", "full", 128, "fwd", "float32")
    assert "delete it to measure the cell again" in torn["reason"]
    plots.kernel_throughput_figure(table, "full")
    plots.kernel_mask_matrix_figure(table)
