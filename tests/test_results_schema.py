"""Every column of both Parquet schemas is documented, and the tables round-trip their rows."""

import re
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
