"""Failures are results: cells that segfault, abort, hang or exhaust memory in a real Snakemake run."""

import pyarrow.parquet as pq
import pytest
from snakemake_run import snakemake, write_config

from longca.results.parquet import CP_SCHEMA, load
import tiny

pytestmark = pytest.mark.slow

CONFIG = tiny.grid(
    kernels=["sdpa", "test_segfault", "test_abort", "test_hang", "test_hog"], masks=["causal"],
    limits={"cell_timeout_s": 2, "cell_memory_mb": 256},
    cp_strategies=[],  # the default grid's CP cells would merge in; the CP table must exist without them
)
EXPECTED = {"sdpa": ("ok", None), "test_segfault": ("error", "SIGSEGV"), "test_abort": ("error", "SIGABRT"),
            "test_hang": ("timeout", "cell_timeout_s"), "test_hog": ("oom", "can't allocate memory")}


# Both ways of measuring: a forked child per cell (the CPU default), and the device's resident
# measuring process (the GPU default), which must come back after each crash and hang.
@pytest.fixture(scope="module", params=["worker", "resident"])
def run(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(f"failures-{request.param}")
    write_config(workdir, {**CONFIG, "isolation": request.param})
    proc = snakemake(workdir, "all")
    return workdir, proc


def test_the_run_finishes_despite_the_failures(run):
    workdir, proc = run
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_each_failure_is_a_row_with_its_status(run):
    workdir, _ = run
    df = load(workdir / "results" / "kernels.parquet").set_index("kernel")
    assert set(df["isolation"]) == {(workdir.name.split("-")[1]).rstrip("0123456789")}
    for kernel, (status, reason) in EXPECTED.items():
        assert df.loc[kernel, "status"] == status, df.loc[kernel, "reason"]
        if reason:
            assert reason in df.loc[kernel, "reason"]


def test_the_report_shows_every_failed_cell(run):
    workdir, _ = run
    html = (workdir / "results" / "report.html").read_text()
    for kernel, (status, _) in EXPECTED.items():
        assert f"<td>{kernel}/causal/float32_fwd_64</td>" in html
        if status != "ok":
            assert f'<td class="status-{status}">{status}</td>' in html


def test_the_crash_is_in_the_cells_log(run):
    workdir, _ = run
    log = (workdir / "results/logs/kernels/test_segfault/causal/float32_fwd_64.log").read_text()
    assert "Segmentation fault" in log and "testing.py" in log


def test_cp_table_exists_with_its_schema_before_any_cp_cell(run):
    workdir, _ = run
    table = pq.read_table(workdir / "results" / "cp.parquet")
    assert table.num_rows == 0 and table.schema.equals(CP_SCHEMA)


def test_a_torn_row_file_is_an_error_row_and_the_report_is_rebuilt(run):
    """A row file cut short (rows are written atomically: only a foreign edit does this) stops
    neither the figures nor the report: the next `snakemake all` rebuilds them, with that cell an
    `error` row that names its file."""
    workdir, _ = run
    row = workdir / "results/cells/kernels/sdpa/causal/float32_fwd_64.json"
    row.write_text(row.read_text()[:40])
    report = workdir / "results" / "report.html"
    before = report.stat().st_mtime_ns
    proc = snakemake(workdir, "all")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert report.stat().st_mtime_ns > before
    df = load(workdir / "results" / "kernels.parquet").set_index("kernel")
    assert df.loc["sdpa", "status"] == "error" and "holds no JSON object" in df.loc["sdpa", "reason"]
    html = report.read_text()
    assert "<td>sdpa/causal/float32_fwd_64</td>" in html and '<td class="status-error">error</td>' in html
