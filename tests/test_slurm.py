"""`snakemake --profile slurm all` against a real SLURM cluster (munged, slurmctld, two slurmd) on
this machine, through the real executor plugin: kernel cells as grouped jobs, a CP cell spanning
both nodes (srun starts one torchrun agent per node, gloo), a cancelled job reported as failed cells
with its SLURM log, and a second run that resubmits only what is missing."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from slurm_cluster import Cluster

REPO = Path(__file__).resolve().parent.parent
COMMAND = ["snakemake", "--profile", "slurm", "all"]  # exactly what the README documents

pytestmark = pytest.mark.slow

CONFIG = {
    "kernels": ["sdpa_math", "test_sleep"],
    "masks": ["causal"],
    "seqlens": [128],
    "directions": ["fwd"],
    "dtypes": ["float32"],
    "heads_q": 4, "heads_kv": 2, "head_dim": 16, "gate_seqlen": 64,
    "timing": {"warmup": 1, "reps": 2},
    "kernel_options": {"test_sleep": {"seconds": 4.0}},
    "cp_strategies": ["ring"],
    "cp_sizes": [2],
    "ranks_per_node": 1,   # the CP cell spans both nodes, one rank each
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _checkout(dest: Path) -> Path:
    """The repository's tracked files (and the `slurm` profile link) in a fresh folder."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        src, dst = REPO / f, dest / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.exists():
            shutil.copy2(src, dst)
    (dest / "config" / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    return dest


def _env(cluster):
    env = {**cluster.env, "LONGCA_TEST_KERNELS": "1"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # this venv's snakemake
    return env


def _squeue(cluster):
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %k"], env=cluster.env, capture_output=True, text=True)
    return [line.split(None, 2) for line in out.stdout.splitlines() if line.strip()]


def test_profile_runs_grid_on_slurm_and_resubmits_only_lost_cells(cluster, tmp_path):
    work = _checkout(tmp_path / "longca")
    env = _env(cluster)
    run1 = subprocess.Popen(COMMAND, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Cancel the kernel-cell job while it sleeps: a job killed from outside, not a cell failing.
    cancelled = None
    deadline = time.time() + 240
    while cancelled is None and time.time() < deadline and run1.poll() is None:
        for job_id, state, comment in _squeue(cluster):
            # Only the grouped kernel-cell job: the ceilings and CP jobs run beside it.
            if state == "RUNNING" and "kernel_cell" in comment:
                time.sleep(2)
                subprocess.run(["scancel", job_id], env=cluster.env, check=True)
                cancelled = job_id
                break
        time.sleep(0.5)
    out1, _ = run1.communicate(timeout=600)
    assert cancelled, f"no kernel-cell job seen running:\n{out1[-3000:]}"
    assert run1.returncode != 0, out1[-3000:]

    # The CP cell ran across both nodes: srun started one torchrun agent on each.
    cp_rows = pd.read_parquet(work / "results" / "lost_cp.parquet")
    ring = cp_rows[cp_rows["strategy"] == "ring"].iloc[0]
    assert ring["status"] == "ok", ring["reason"]
    assert ring["nodes"] == 2 and ring["cp_size"] == 2 and ring["slurm_job_id"]
    # The cancelled job's cells are failed rows naming its SLURM log; their cell files stay missing.
    kernels = pd.read_parquet(work / "results" / "lost_kernels.parquet")
    lost = kernels[kernels["reason"].fillna("").str.contains("failed or was cancelled")]
    assert len(lost) >= 1 and (lost["status"] == "error").all()
    assert lost["reason"].str.contains(r"SLURM log: .*\.snakemake/slurm_logs/.*\.log").all(), lost["reason"].tolist()
    missing = {f"results/cells/kernels/{cid}.json" for cid in lost["cell_id"]}
    assert all(not (work / m).exists() for m in missing)

    # A dry run plans exactly the lost cells (plus aggregation); the real run completes them.
    dry = subprocess.run(COMMAND + ["-n"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    planned = {line.split("output: ")[1].split(",")[0].strip() for line in (dry.stdout + dry.stderr).splitlines()
               if "output: results/cells/" in line}
    assert planned == missing, (planned, missing)
    run2 = subprocess.run(COMMAND, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert run2.returncode == 0, (run2.stdout + run2.stderr)[-4000:]
    kernels = pd.read_parquet(work / "results" / "kernels.parquet")
    assert (kernels["status"] == "ok").all() and len(kernels) == 2
    assert (work / "results" / "report.html").exists()
    assert not (work / "results" / "lost").exists() and not (work / "results" / "lost_kernels.parquet").exists()
    # Kernel cells ran as grouped SLURM jobs, each row with its job id.
    assert kernels["slurm_job_id"].notna().all()
