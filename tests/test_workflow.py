"""End to end: the real Snakemake on a tiny grid in a temporary directory."""

import io
import json
import re
import zipfile

import pytest
import yaml
from browser import Chromium, chromium  # noqa: F401 — chromium is a fixture
from PIL import Image
from snakemake_run import snakemake as run_snakemake

from longca.results import parquet as results
from longca.attention import masks
from longca.attention.flops import attention_flops
from longca.results.parquet import load

pytestmark = pytest.mark.slow

TINY = {
    "device": "cpu", "threads": 1,
    "kernels": ["sdpa_math", "sdpa"],
    "masks": ["full", "causal"],
    "seqlens": [64, 128],
    "directions": ["fwd", "bwd"],
    "dtypes": ["float32"],
    "heads_q": 4, "heads_kv": 2, "head_dim": 16,
    "gate_seqlen": 64,
    "timing": {"warmup": 1, "reps": 3},
    "cp_strategies": [],  # the default grid's CP cells would merge in; CP has its own tests
}


def snakemake(repo, workdir, *args):
    return run_snakemake(workdir, *args, snakefile=repo / "Snakefile")


@pytest.fixture(scope="module")
def finished_run(repo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run")
    (workdir / "config.yaml").write_text(yaml.safe_dump(TINY))
    proc = snakemake(repo, workdir, "all")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (workdir / "snakemake.out").write_text(proc.stdout + proc.stderr)
    return workdir


def test_the_run_ends_with_one_line_naming_the_report_and_the_counts(finished_run):
    out = (finished_run / "snakemake.out").read_text().rstrip().splitlines()
    closing = [line for line in out if line.startswith("LongCA: results/report.html")]
    assert closing == ["LongCA: results/report.html · kernel cells 16 (16 ok) · CP cells 0"], out[-10:]
    assert out[-1] == closing[0]  # the last line, after Snakemake's own


def test_the_screen_shows_longcas_lines_and_the_log_keeps_snakemakes(finished_run):
    """16 cells and 12 other jobs: no job block on the screen, every one in Snakemake's log."""
    out = (finished_run / "snakemake.out").read_text().rstrip().splitlines()
    assert len(out) <= 40, "\n".join(out)
    assert not [line for line in out if "rule " in line or line.startswith(("Select jobs", "Execute "))], out
    (log,) = (finished_run / ".snakemake" / "log").glob("*.snakemake.log")
    text = log.read_text()
    assert text.count("localrule kernel_cell:") + text.count("\nrule kernel_cell:") == 16
    assert "Complete log(s): " + str(log) in out


def test_rows_are_measured_and_flops_follow_the_formula(finished_run):
    df = load(finished_run / "results" / "kernels.parquet")
    assert len(df) == 2 * 2 * 2 * 2
    assert set(df["status"]) == {"ok"}
    assert (df["tflops"] > 0).all()
    for row in df.itertuples():
        m = masks.build(row.mask, row.seqlen)
        assert row.flops == attention_flops(m, 4, 16, row.direction)
        assert row.area == m.area()
        assert row.fingerprint and row.schema_version == results.SCHEMA_VERSION


def test_report_names_every_cell_and_embeds_figures(finished_run):
    html = (finished_run / "results" / "report.html").read_text()
    df = load(finished_run / "results" / "kernels.parquet")
    for cell_id in df["cell_id"]:
        assert f"<td>{cell_id}</td>" in html
    # The kernel × mask matrix and one throughput figure per mask; no memory figure on CPU (the report
    # says why), no CP figure without CP cells (it says so too).
    assert len(re.findall(r'<img src="data:image/png;base64,', html)) == 1 + 2
    assert "Peak memory is recorded on GPU only; these cells ran on cpu" in html
    assert "No CP cells in this run" in html
    assert "http://" not in html and "https://" not in html  # readable offline


def test_ceilings_are_measured_and_drawn(finished_run):
    ceilings = json.loads((finished_run / "results" / "ceilings.json").read_text())
    assert ceilings["device"] == "cpu" and ceilings["cpu_threads"] == 1  # the cells' threads (config)
    (entry,) = ceilings["matmul"]
    assert entry["dtype"] == "float32" and entry["tflops"] > 0
    html = (finished_run / "results" / "report.html").read_text()
    assert "The dashed line is the machine&#39;s measured dense matmul rate" in html
    for name in ("kernels_full", "kernels_causal", "memory_full", "memory_causal", "kernel_mask_matrix"):
        assert (finished_run / "results" / "figures" / f"{name}.png").stat().st_size > 1000


def test_snakemake_report_zip_holds_the_figures_and_the_report(repo, finished_run):
    proc = snakemake(repo, finished_run, "--report", "report.zip")
    assert proc.returncode == 0, proc.stderr[-4000:]
    names = zipfile.ZipFile(finished_run / "report.zip").namelist()
    for name in ("kernels_full.png", "kernels_causal.png", "memory_full.png", "kernel_mask_matrix.png",
                 "report.html"):
        assert any(n.endswith("/" + name) for n in names), (name, names)
    assert "report/report.html" in names


def test_the_real_report_opens_in_chromium(finished_run, chromium, tmp_path):  # noqa: F811
    with Chromium(chromium, width=1280, height=900) as page:
        page.navigate((finished_run / "results" / "report.html").resolve().as_uri())
        assert page.console_errors() == []
        sizes = page.evaluate("Promise.all(Array.prototype.map.call(document.images, function (i) {"
                              " return i.decode().then(function () { return i.naturalWidth * i.naturalHeight; });"
                              " }))", await_promise=True)
        assert len(sizes) == 3 and all(sizes)
        assert all(u.startswith(("file://", "data:")) for u in page.requested_urls())
        first = page.evaluate("document.querySelector('#best-kernel-table tbody tr td:nth-child(2) a').textContent")
        assert first in ("sdpa", "sdpa_math")
        page.click("#kernel-table th[data-key='median_ms']")
        values = page.evaluate("(function () { var i = Array.prototype.findIndex.call("
                               "document.querySelectorAll('#kernel-table thead th'), function (th) {"
                               " return th.dataset.key === 'median_ms'; });"
                               " return Array.prototype.map.call(document.querySelectorAll('#kernel-table tbody tr'),"
                               " function (r) { return parseFloat(r.cells[i].dataset.sort); }); }())")
        assert values == sorted(values) and len(values) == 16
        png = page.screenshot()
    (tmp_path / "first_screen.png").write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (1280, 900) and len(image.getcolors(maxcolors=1 << 20)) > 50


def test_second_run_has_nothing_to_do(repo, finished_run):
    proc = snakemake(repo, finished_run, "-n", "all")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_bad_config_stops_before_any_job(repo, tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**TINY, "kernels": ["flash9"]}))
    proc = snakemake(repo, tmp_path, "all")
    assert proc.returncode != 0
    assert "config.kernels[0]" in proc.stderr and "flash9" in proc.stderr
    assert not (tmp_path / "results").exists()
