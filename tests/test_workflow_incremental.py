"""Incremental runs with the real Snakemake: exactly the changed cells rerun, a killed run resumes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from snakemake_run import REPO, cell_files, command, planned_cells, snakemake, write_config

from longca.results.parquet import load
import tiny

pytestmark = pytest.mark.slow

BASE = tiny.grid(
    kernels=["sdpa", "test_sleep"], masks=["full"],
    cp_strategies=[],  # the default grid's CP cells would merge in; CP has its own tests
)
SDPA = "results/cells/kernels/sdpa/full/float32_fwd_64.json"
SLEEP = "results/cells/kernels/test_sleep/full/float32_fwd_64.json"


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("base")
    write_config(workdir, BASE)
    proc = snakemake(workdir, "all")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert set(cell_files(workdir)) == {SDPA, SLEEP}
    return workdir


@pytest.fixture
def clone(base_run, tmp_path):
    """A copy of the finished run (outputs, logs, Snakemake's metadata; mtimes kept)."""
    workdir = tmp_path / "run"
    shutil.copytree(base_run, workdir, symlinks=True)
    return workdir


def test_second_run_plans_nothing(clone):
    proc = snakemake(clone, "-n", "all")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr


def test_changing_one_kernels_option_reruns_only_its_cells(clone):
    write_config(clone, {**BASE, "kernel_options": {"test_sleep": {"seconds": 0.001}}})
    before = cell_files(clone)
    proc = snakemake(clone, "-n", "all")
    out = proc.stdout + proc.stderr
    assert set(_cells(out)) == {SLEEP}
    for rule in ("aggregate_kernels", "plot_throughput", "html_report"):  # and what depends on it
        assert f"rule {rule}:" in out
    assert snakemake(clone, "all").returncode == 0
    after = cell_files(clone)
    assert after[SDPA] == before[SDPA] and after[SLEEP] != before[SLEEP]
    row = json.loads((clone / SLEEP).read_text())
    assert json.loads(row["kernel_options"]) == {"seconds": 0.001}


def test_new_seqlen_and_mask_run_only_new_cells(clone):
    write_config(clone, {**BASE, "seqlens": [64, 128], "masks": ["full", "causal"]})
    before = cell_files(clone)
    new = {f"results/cells/kernels/{k}/{m}/float32_fwd_{n}.json"
           for k in ("sdpa", "test_sleep") for m, n in (("full", 128), ("causal", 64), ("causal", 128))}
    assert planned_cells(clone) == new
    assert snakemake(clone, "all").returncode == 0
    after = cell_files(clone)
    assert set(after) == set(before) | new
    assert all(after[p] == before[p] for p in before)
    assert len(load(clone / "results" / "kernels.parquet")) == 8
    assert planned_cells(clone) == set()


def _checkout(tmp_path: Path) -> Path:
    """A copy of this checkout's workflow and package, to edit."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for part in ("Snakefile", "workflow", "longca", "config", "profiles"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy2
        copy(REPO / part, checkout / part, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                              if (REPO / part).is_dir() else {}))
    return checkout


def test_editing_one_adapter_reruns_only_its_cells(clone, tmp_path):
    checkout = _checkout(tmp_path)
    snakefile = checkout / "Snakefile"
    # The cache key is the code's content, not where the checkout lives.
    assert planned_cells(clone, snakefile=snakefile) == set()
    adapter = checkout / "longca" / "kernels" / "testing.py"
    with open(adapter, "a") as f:  # a comment is no change: the key follows the code lines
        f.write("\n# an edit to the test kernels' adapter module's comments\n")
    assert planned_cells(clone, snakefile=snakefile) == set()
    with open(adapter, "a") as f:
        f.write("_EDITED = 1\n")
    assert planned_cells(clone, snakefile=snakefile) == {SLEEP}


def test_fixing_the_gate_re_gates_every_cell_and_re_times_none(clone, tmp_path):
    """Correctness, time and memory are cached on their own keys: a change to the gate's code
    reruns every cell's job, and each job measures its gate and takes its timing from the store."""
    checkout = _checkout(tmp_path)
    before = {json.loads((clone / cell).read_text())["cell_id"]: json.loads((clone / cell).read_text())
              for cell in (SDPA, SLEEP)}
    with open(checkout / "longca" / "execution" / "measure" / "gate.py", "a") as f:
        f.write("GATE_FIXED = True\n")
    assert planned_cells(clone, snakefile=checkout / "Snakefile") == {SDPA, SLEEP}
    proc = snakemake(clone, "all", snakefile=checkout / "Snakefile")
    assert proc.returncode == 0, proc.stderr[-4000:]
    for cell in (SDPA, SLEEP):
        row = json.loads((clone / cell).read_text())
        was = before[row["cell_id"]]
        assert row["status"] == "ok" and row["parts_reused"] == "time,memory"
        assert row["gate_wall_s"] > 0 and row["time_wall_s"] is None and row["memory_wall_s"] is None
        assert min(was["gate_wall_s"], was["time_wall_s"], was["memory_wall_s"]) > 0  # measured whole before
        assert (row["median_ms"], row["timed_at"]) == (was["median_ms"], was["timed_at"])
        assert row["gate_error"] == was["gate_error"]  # the same gate, measured again


def test_a_killed_run_completes_only_the_missing_cells(tmp_path):
    workdir = tmp_path / "killed"
    seqlens = [64, 128, 192, 256, 320, 384]
    write_config(workdir, {**BASE, "kernels": ["test_sleep"], "seqlens": seqlens,
                           "kernel_options": {"test_sleep": {"seconds": 0.15}}})
    proc = subprocess.Popen(command(workdir, "all", cores=1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(cell_files(workdir)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # Snakemake and its running job, mid-run
    proc.wait()
    finished = cell_files(workdir)
    assert 2 <= len(finished) < len(seqlens)
    for path in finished:
        json.loads((workdir / path).read_text())  # every visible row is whole

    # A SIGKILLed Snakemake leaves its lock: the next run stops on it, and `snakemake --unlock` clears
    # it, as the README's Quick start and docs/workflow.md say.
    stopped = snakemake(workdir, "all")
    assert stopped.returncode != 0 and "LockException" in stopped.stdout + stopped.stderr
    assert cell_files(workdir) == finished
    for doc in ("README.md", "docs/workflow.md"):
        assert "`snakemake --unlock`" in (REPO / doc).read_text()
    assert snakemake(workdir, "--unlock").returncode == 0
    planned = planned_cells(workdir)
    every = {f"results/cells/kernels/test_sleep/full/float32_fwd_{n}.json" for n in seqlens}
    assert planned >= every - set(finished)
    # At most the cell that was running when the kill came, if its row landed but Snakemake had not
    # yet recorded the job as finished (it is then marked incomplete and redone).
    assert len(planned & set(finished)) <= 1

    assert snakemake(workdir, "all").returncode == 0
    after = cell_files(workdir)
    assert set(after) == every
    assert all(after[p] == finished[p] for p in set(finished) - planned)
    assert len(load(workdir / "results" / "kernels.parquet")) == len(seqlens)


def _cells(dry_run_output: str) -> list[str]:
    from snakemake_run import CELL_OUTPUT

    return CELL_OUTPUT.findall(dry_run_output)


def test_another_path_to_the_same_interpreter_reruns_nothing(clone):
    """`snakemake all` (its entry point runs bin/python3) and `python -m snakemake all` are one
    interpreter under two names: the cache key is settings and code, not the interpreter's path."""
    exe = Path(sys.executable)
    names = ("python3", "python", f"python3.{sys.version_info.minor}")
    other = next((exe.with_name(n) for n in names if n != exe.name and exe.with_name(n).exists()), None)
    if other is None:
        pytest.skip(f"no second name for {exe} in its folder")
    proc = subprocess.run([str(other), *command(clone, "-n", "all")[1:]], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def test_a_changed_time_limit_reruns_no_cell(tmp_path):
    """Limits are not part of any cell's key, a CP cell's (measured under a real torchrun) included."""
    config = {**BASE, "kernels": ["sdpa"], "cp_strategies": ["ring"], "cp_sizes": [2], "cp_masks": ["full"],
              "cp_tokens_per_rank": [64], "directions": ["fwd"]}
    write_config(tmp_path, config)
    cp_cell = "results/cells/cp/ring/full/float32_fwd_64x2.json"
    proc = snakemake(tmp_path, cp_cell, SDPA)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((tmp_path / cp_cell).read_text())["status"] == "ok"
    write_config(tmp_path, {**config, "limits": {"cell_timeout_s": 300}})
    proc = snakemake(tmp_path, "-n", cp_cell, SDPA)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def test_a_deleted_cell_is_measured_again(clone):
    """A cell file removed by hand (to measure it again) is planned again, with what depends on it,
    though the tables built from it are there and newer."""
    (clone / SLEEP).unlink()
    proc = snakemake(clone, "-n", "all")
    out = proc.stdout + proc.stderr
    assert set(_cells(out)) == {SLEEP}, out[-3000:]
    assert "rule aggregate_kernels:" in out
