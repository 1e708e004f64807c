"""End to end: the real Snakemake on a tiny grid in a temporary directory."""

import re

import pytest
import yaml
from snakemake_run import snakemake as run_snakemake

from longca import masks
from longca.flops import attention_flops
from longca.results import load

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
}


def snakemake(repo, workdir, *args):
    return run_snakemake(workdir, *args, snakefile=repo / "Snakefile")


@pytest.fixture(scope="module")
def finished_run(repo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run")
    (workdir / "config.yaml").write_text(yaml.safe_dump(TINY))
    proc = snakemake(repo, workdir, "all")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_rows_are_measured_and_flops_follow_the_formula(finished_run):
    df = load(finished_run / "results" / "kernels.parquet")
    assert len(df) == 2 * 2 * 2 * 2
    assert set(df["status"]) == {"ok"}
    assert (df["tflops"] > 0).all()
    for row in df.itertuples():
        m = masks.build(row.mask, row.seqlen)
        assert row.flops == attention_flops(m, 4, 16, row.direction)
        assert row.area == m.area()
        assert row.fingerprint and row.schema_version == 1


def test_report_names_every_cell_and_embeds_figures(finished_run):
    html = (finished_run / "results" / "report.html").read_text()
    df = load(finished_run / "results" / "kernels.parquet")
    for cell_id in df["cell_id"]:
        assert f"<td>{cell_id}</td>" in html
    assert len(re.findall(r'<img src="data:image/png;base64,', html)) == 2
    assert "http://" not in html and "https://" not in html  # readable offline


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
