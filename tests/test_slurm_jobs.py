"""What each SLURM job asks for, from config (longca.execution.cluster.slurm_jobs), and the pieces that keep a
failed job's finished rows (longca.execution.cache.kept_rows, longca.results.lost_cells)."""

import json
import os
import subprocess
import sys

import pytest

from longca.config import ConfigError, validate
from longca.execution.cache import kept_rows
from longca.execution.cluster import placement, slurm_jobs
from longca.execution.processes import job_scope
from longca.execution.processes.worker import worker_key
from longca.results import lost_cells

GPU = {"device": "cuda", "kernels": ["sdpa"], "masks": ["full"], "seqlens": [1024], "cp_strategies": []}


def test_a_kernel_cell_asks_for_its_cpus_memory_gpu_and_time():
    """The executor runs a group's cells one after another on the job's GPU; with --cores at one
    cell's CPUs Snakemake makes each cell a layer, so the group job asks for one cell's CPUs, memory
    and GPU and for the sum of its cells' times (tests/test_slurm.py checks the real job)."""
    cfg = validate(GPU)
    assert slurm_jobs.kernel_cell_resources(cfg, 8) == {
        "threads": 8, "mem_mb": 32000, "runtime": 10 + slurm_jobs.START_UP_MIN, "gres": "gpu:1",
        "slurm_extra": "--exclusive"}
    # Each cell's time is cut so that its group's sum stays within the partition's limit.
    capped = validate({**GPU, "slurm_max_runtime_min": 60})
    assert slurm_jobs.kernel_cell_resources(capped, 8)["runtime"] == 7
    assert slurm_jobs.kernel_cell_resources(capped, 1)["runtime"] == 15


def test_a_cp_job_is_one_task_per_node_with_that_nodes_gpus():
    cfg = validate({**GPU, "ranks_per_node": 8, "slurm_cpus_per_cell": 12, "slurm_mem_mb_per_cell": 4000})
    two_nodes = slurm_jobs.cp_cell_resources(cfg, 16)
    assert two_nodes == {"nodes": 2, "tasks": 2, "tasks_per_gpu": 0, "mpi": "srun", "cpus_per_task": 8 * 12,
                         "mem_mb": 8 * 4000, "runtime": 15, "gres": "gpu:8", "slurm_extra": "--exclusive"}
    one_node = slurm_jobs.cp_cell_resources(cfg, 4)
    assert (one_node["nodes"], one_node["gres"], one_node["mpi"], one_node["mem_mb"]) == (1, "gpu:4", "", 16000)
    shared = validate({**GPU, "slurm_exclusive": False})
    assert "slurm_extra" not in slurm_jobs.cp_cell_resources(shared, 2)
    assert "slurm_extra" not in slurm_jobs.kernel_cell_resources(shared, 8)


def test_cpu_cells_ask_for_no_gpu():
    cfg = validate({**GPU, "device": "cpu"})
    assert "gres" not in slurm_jobs.kernel_cell_resources(cfg, 8)
    assert "gres" not in slurm_jobs.cp_cell_resources(cfg, 2)
    # ranks_per_node spreads CPU ranks over nodes too; 0 keeps them on one.
    assert slurm_jobs.cp_cell_resources(validate({**GPU, "device": "cpu", "ranks_per_node": 1}), 2)["nodes"] == 2
    assert slurm_jobs.cp_cell_resources(cfg, 2)["nodes"] == 1


@pytest.mark.parametrize("key, value", [("slurm_cpus_per_cell", 0), ("slurm_mem_mb_per_cell", 10),
                                        ("slurm_max_runtime_min", 0), ("slurm_exclusive", "maybe")])
def test_bad_slurm_keys_are_named(key, value):
    with pytest.raises(ConfigError, match=f"config.{key}"):
        validate({**GPU, key: value})


def test_a_cluster_jobs_cp_cells_fork_their_own_child_and_its_kernel_cells_share_a_scoped_server(monkeypatch):
    cfg = validate(GPU)
    assert cfg["isolation"] == "resident"
    assert placement.isolation(cfg, placement.LOCAL) == "resident"
    assert placement.isolation(cfg, placement.SUBMITS_JOBS) == "resident"  # the submit host measures nothing
    assert placement.isolation(cfg, placement.IN_CLUSTER_JOB) == "fork"
    # Kernel cells in a job: the job's Snakemake runs them (no srun step, no Snakemake per cell) and
    # they share a lane that ends with the job's Snakemake.
    assert placement.kernel_cell_isolation(cfg, placement.IN_CLUSTER_JOB) == "resident"
    assert placement.cells_in_job_process(placement.IN_CLUSTER_JOB)
    assert not placement.cells_in_job_process(placement.SUBMITS_JOBS)
    assert not placement.cells_in_job_process(placement.LOCAL)
    monkeypatch.delenv(job_scope.ENV, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    placement.scope_servers_to_job(placement.LOCAL)
    assert job_scope.current() is None
    placement.scope_servers_to_job(placement.IN_CLUSTER_JOB)
    scope = job_scope.current()
    assert scope.startswith(f"77:{os.getpid()}:") and job_scope.alive(scope)
    assert worker_key() != worker_key({**os.environ, job_scope.ENV: "78" + scope[2:]})  # a server per job


def test_a_job_scope_ends_with_its_anchor_process_not_a_reuse_of_its_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        scope = job_scope.here().split(":")[0] + f":{child.pid}:{job_scope._start_ticks(child.pid)}"
        assert job_scope.alive(scope)
        assert not job_scope.alive(scope.rsplit(":", 1)[0] + ":1")  # same pid, another start time
    finally:
        child.kill()
        child.wait()
    assert not job_scope.alive(scope)


def test_unplaced_reason_only_for_local_gpu_runs_short_of_gpus():
    cfg = validate(GPU)
    assert placement.unplaced_reason(cfg, placement.LOCAL, 1, 2).startswith("needs 2 GPUs")
    assert placement.unplaced_reason(cfg, placement.LOCAL, 2, 2) is None
    assert placement.unplaced_reason(cfg, placement.SUBMITS_JOBS, 8, 16) is None
    assert placement.unplaced_reason(validate({**GPU, "device": "cpu"}), placement.LOCAL, 0, 2) is None


def test_a_kept_row_comes_back_only_for_the_same_settings_and_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = "results/cells/kernels/sdpa/full/float32_fwd_64.json"
    settings = {"kernel": "sdpa", "seqlen": 64, "mask_params": {"window": (1, 2)}}
    row = {"cell_id": "sdpa/full/float32_fwd_64", "status": "ok", "tflops": 1.5}
    kept_rows.keep(out, settings, "abc", row)
    assert (tmp_path / "results/kept/kernels/sdpa/full/float32_fwd_64.json").exists()
    assert kept_rows.recall(out, settings, "abc") == row
    assert kept_rows.recall(str(tmp_path / out), settings, "abc") == row  # an absolute path names the same cell
    assert kept_rows.recall(out, settings, "abd") is None  # other code
    assert kept_rows.recall(out, {**settings, "seqlen": 128}, "abc") is None  # other settings
    assert kept_rows.recall(out, settings, None) is None
    # A failed run's report shows the row whatever its code; rerunning checks the code.
    assert kept_rows.row_for_settings(out, settings) == row
    assert kept_rows.row_for_settings(out, {**settings, "seqlen": 128}) is None
    assert kept_rows.kept_path("elsewhere/row.json") is None
    monkeypatch.setenv(kept_rows.FINGERPRINTS_ENV, json.dumps({"sdpa": "abc"}))
    assert kept_rows.kernel_fingerprint("sdpa") == "abc" and kept_rows.kernel_fingerprint("flex") is None


# What Snakemake 9 writes to its log when SLURM jobs fail: a single rule's job (the SLURM log listed
# after the rule's own log) and a group job (its jobs' outputs, then the group's SLURM log).
MAIN_LOG = """\
[Wed Nov 25 13:00:00 2026]
Error in rule cp_cell:
    message: SLURM-job '7' failed, SLURM status is: 'CANCELLED'.
    jobid: 12
    output: results/cells/cp/ring/causal/float32_fwd_128x2.json
    log: results/logs/cp/ring/causal/float32_fwd_128x2.log, {logdir}/rule_cp_cell/ring_causal/7.log (check log file(s) for error details)
    external_jobid: 7
[Wed Nov 25 13:00:05 2026]
Error in group kernel_cells:
    message: SLURM-job '9' failed, SLURM status is: 'CANCELLED'.
    jobs:
        rule kernel_cell:
            jobid: 3
            output: results/cells/kernels/test_sleep/causal/float32_fwd_128.json
            log: results/logs/kernels/test_sleep/causal/float32_fwd_128.log (check log file(s) for error details)
        rule kernel_cell:
            jobid: 4
            output: results/cells/kernels/sdpa_math/causal/float32_fwd_128.json
    log: {logdir}/group_kernel_cells/9.log (check log file(s) for error details)
"""


@pytest.mark.parametrize("logdir", [".snakemake/slurm_logs", "/scratch/me/logs"])
def test_lost_cells_name_their_jobs_slurm_log(tmp_path, logdir):
    log = tmp_path / "snakemake.log"
    log.write_text(MAIN_LOG.format(logdir=logdir))
    found = lost_cells.slurm_logs_by_cell([log], lost_cells.Path(logdir))
    assert found == {
        "results/cells/cp/ring/causal/float32_fwd_128x2.json": f"{logdir}/rule_cp_cell/ring_causal/7.log",
        "results/cells/kernels/test_sleep/causal/float32_fwd_128.json": f"{logdir}/group_kernel_cells/9.log",
        "results/cells/kernels/sdpa_math/causal/float32_fwd_128.json": f"{logdir}/group_kernel_cells/9.log",
    }


def test_a_run_that_succeeds_releases_the_copies_of_recorded_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recorded, only_copy = "results/cells/kernels/a/full/x.json", "results/cells/kernels/b/full/x.json"
    for out in (recorded, only_copy):
        kept_rows.keep(out, {"kernel": "x"}, "f", {"status": "ok"})
    (tmp_path / recorded).parent.mkdir(parents=True)
    (tmp_path / recorded).write_text("{}")
    assert kept_rows.release() == 1
    assert not (tmp_path / "results/kept/kernels/a").exists()  # emptied folders go too
    assert kept_rows.recall(recorded, {"kernel": "x"}, "f") is None
    assert kept_rows.recall(only_copy, {"kernel": "x"}, "f") == {"status": "ok"}


def test_a_job_no_node_of_the_partition_can_hold_is_named_with_the_keys_to_change():
    cfg = validate({**GPU, "ranks_per_node": 4})
    # Kernel cells ask 8 CPUs / 32,000 MiB; a cp_size-8 cell at 4 ranks a node asks 32 / 128,000.
    assert slurm_jobs.node_demand(cfg, [8]) == (32, 128000)
    assert slurm_jobs.partition_misfit(cfg, [8], [(64, 512000)], "gpu") is None
    assert slurm_jobs.partition_misfit(cfg, [8], [], None) is None  # no sinfo: the cluster decides
    small = slurm_jobs.partition_misfit(cfg, [8], [(16, 64000), (8, 32000)], "gpu")
    assert "partition gpu" in small and "at most 16 CPUs and 64000 MiB" in small
    assert "slurm_cpus_per_cell=4" in small and "slurm_mem_mb_per_cell=16000" in small
    # One node that holds the job is enough, whatever the others are.
    assert slurm_jobs.partition_misfit(cfg, [8], [(2, 2000), (32, 128000)], None) is None


def test_a_lost_cells_row_names_its_job_id(tmp_path):
    """The executor names a job's log <job id>.log: the failure row carries the id, as a finished
    cell's row does (SLURM_JOB_ID)."""
    logdir = tmp_path / "slurm_logs"
    log = tmp_path / "snakemake.log"
    log.write_text(MAIN_LOG.format(logdir=logdir))
    known = lost_cells.slurm_logs_by_cell([log], logdir)
    reason, job = lost_cells.loss("results/cells/cp/ring/causal/float32_fwd_128x2.json", known, logdir)
    assert job == "7" and f"SLURM log: {logdir}/rule_cp_cell/ring_causal/7.log" in reason
    assert lost_cells.loss("results/cells/kernels/sdpa_math/causal/float32_fwd_128.json", known, logdir)[1] == "9"
    assert lost_cells.loss("results/cells/kernels/none/full/x.json", {}, logdir) == (
        f"the cell's job failed or was cancelled before the cell wrote its row (no SLURM log under {logdir} "
        "mentions it)", None)
