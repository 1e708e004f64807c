"""`snakemake --profile slurm all` against a real SLURM cluster (munged, slurmctld, two slurmd) on
this machine, through the real executor plugin, from a private configuration (nothing under /etc):

* CPU nodes: kernel cells as a grouped job (run by the job's own Snakemake, no job step each, and
  measured by one warm worker scoped to the job, which ends with it), a CP cell spanning both nodes
  (srun starts one torchrun agent per node, gloo), a cancelled job whose finished cell keeps its row
  while the lost one is reported with its SLURM log, and a second run that completes only what is
  missing;
* nodes declaring 8 GPUs as gres (stand-in device files): the README's SLURM command validates on
  this GPU-less "login node", and each job asks for what config says - one node's GPUs, CPUs and
  memory, exclusive, a time limit the partition accepts - whatever `--config` is given."""

import json
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

from longca.execution.processes.worker import runtime_dir

REPO = Path(__file__).resolve().parent.parent
COMMAND = ["snakemake", "--profile", "slurm", "all"]  # exactly what the README documents

pytestmark = pytest.mark.slow

# Two cells of one group job, both slow: the job runs them one after the other in an order of its
# own, and the test cancels it between them (with one slow and one fast cell, the fast one second
# left a moment of milliseconds to catch: CI missed it twice on 2026-11-29).
CONFIG = {
    "kernels": ["test_sleep"],
    "masks": ["causal", "full"],
    "cp_masks": ["causal"],
    "seqlens": [128],
    "directions": ["fwd"],
    "dtypes": ["float32"],
    "heads_q": 4, "heads_kv": 2, "head_dim": 16, "gate_seqlen": 64,
    "timing": {"warmup": 1, "reps": 2},
    "kernel_options": {"test_sleep": {"seconds": 3.0}},
    "cp_strategies": ["ring"],
    "cp_sizes": [2],
    "ranks_per_node": 1,   # the CP cell spans both nodes, one rank each
    # Two small CPU nodes, shared by the jobs (the GPU test below checks exclusive nodes).
    "slurm_cpus_per_cell": 1, "slurm_mem_mb_per_cell": 400, "slurm_exclusive": False,
}
CAUSAL = "results/cells/kernels/test_sleep/causal/float32_fwd_128.json"
FULL = "results/cells/kernels/test_sleep/full/float32_fwd_128.json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _checkout(dest: Path, config: dict | None = CONFIG) -> Path:
    """The repository's tracked files (and the `slurm` profile link) in a fresh folder."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        src, dst = REPO / f, dest / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.exists():
            shutil.copy2(src, dst)
    if config is not None:
        (dest / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return dest


def _env(cluster):
    env = {**cluster.env, "LONGCA_TEST_KERNELS": "1"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # this venv's snakemake
    return env


def _squeue(cluster):
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %k"], env=cluster.env, capture_output=True, text=True)
    return [line.split(None, 2) for line in out.stdout.splitlines() if line.strip()]


def _steps(cluster) -> set[str]:
    """The job steps running now, ``JOB.STEP`` (``JOB.batch``: the job's batch script)."""
    out = subprocess.run(["squeue", "-s", "-h", "-o", "%i"], env=cluster.env, capture_output=True, text=True)
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def _servers(work: Path, job_id: str | None = None) -> dict[int, str]:
    """LongCA workers and lanes (with the processes they forked, which share their command line) of
    this checkout's runs (its folder is in their PYTHONPATH), or of one job: pid → LONGCA_JOB_SCOPE."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                           if b"=" in kv)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError):
            continue
        if b"longca" not in cmd or not {b"worker", b"lane"} & set(cmd) or state == "Z":
            continue
        scope = environ.get(b"LONGCA_JOB_SCOPE", b"").decode()
        if str(work).encode() in environ.get(b"PYTHONPATH", b"") and (job_id is None or scope.startswith(f"{job_id}:")):
            found[int(pid)] = scope
    return found


def _none_left(work: Path, timeout: float = 15) -> dict[int, str]:
    deadline = time.time() + timeout
    while (left := _servers(work)) and time.time() < deadline:
        time.sleep(0.2)
    return left


def _jobs(cluster) -> dict[str, dict[str, str]]:
    """Every job the controller knows (finished ones stay for MinJobAge), as scontrol's fields."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], env=cluster.env, capture_output=True, text=True).stdout
    jobs = {}
    for line in out.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "JobId" in fields:
            jobs[fields["JobId"]] = fields
    return jobs


def test_profile_runs_grid_on_slurm_and_resubmits_only_lost_cells(cluster, tmp_path):
    work = _checkout(tmp_path / "longca")
    env = _env(cluster)
    run1 = subprocess.Popen(COMMAND, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Cancel the kernel-cell job once one of its two cells (run one after the other) has finished and
    # the other has not: a job killed from outside, not a cell failing.
    cancelled, finished, kernel_jobs, steps, servers = None, [], set(), set(), {}
    # Generous for a loaded machine (the job's start and its worker's torch import come first); the
    # loop ends when the run does anyway.
    deadline = time.time() + 600
    while cancelled is None and time.time() < deadline and run1.poll() is None:
        finished = [c for c in (CAUSAL, FULL) if (work / "results" / "kept" / c.removeprefix("results/cells/")).exists()]
        steps |= _steps(cluster)
        for job_id, state, comment in _squeue(cluster):
            # Only the grouped kernel-cell job: the ceilings and CP jobs run beside it.
            if "kernel_cell" in comment:
                kernel_jobs.add(job_id)
            if len(finished) == 1 and state == "RUNNING" and "kernel_cell" in comment:
                servers = _servers(work, job_id)  # the job's worker, measuring the other cell now
                subprocess.run(["scancel", job_id], env=cluster.env, check=True)
                cancelled = job_id
                break
        time.sleep(0.2)
    out1, _ = run1.communicate(timeout=600)
    assert cancelled, f"no kernel-cell job seen running with one finished cell:\n{out1[-3000:]}"
    assert run1.returncode != 0, out1[-3000:]
    # The job's cells ran in its own Snakemake, no `srun` step (and no Snakemake) each, and shared
    # one worker scoped to the job (its log: started once, for this job's scope)...
    assert kernel_jobs and not {s for s in steps if s.split(".")[0] in kernel_jobs and s.split(".")[1].isdigit()}, \
        (steps, kernel_jobs)
    assert servers and len(set(servers.values())) == 1, servers
    scope = next(iter(servers.values()))
    logs = [p.read_text(errors="replace") for p in runtime_dir().glob("*.log")]
    assert sum(log.count(f"ends with job scope {scope})") for log in logs) == 1, scope
    # ... which did not outlive the cancelled job, nor did anything it forked.
    assert not _none_left(work), _servers(work)
    done = finished[0]
    cut = FULL if done == CAUSAL else CAUSAL
    mask_of = {CAUSAL: "causal", FULL: "full"}

    # The CP cell ran across both nodes: srun started one torchrun agent on each.
    assert (work / "results" / "lost_cp.parquet").exists(), out1[-5000:]
    cp_rows = pd.read_parquet(work / "results" / "lost_cp.parquet")
    ring = cp_rows[cp_rows["strategy"] == "ring"].iloc[0]
    assert ring["status"] == "ok", ring["reason"]
    assert ring["nodes"] == 2 and ring["cp_size"] == 2 and ring["slurm_job_id"]
    # The cancelled job's finished cell keeps its row (Snakemake deleted its file with the job's
    # outputs); the cell it cut short is a failed row naming the job's SLURM log.
    kernels = pd.read_parquet(work / "results" / "lost_kernels.parquet").set_index("mask")
    assert kernels.loc[mask_of[done], "status"] == "ok"
    assert str(kernels.loc[mask_of[done], "slurm_job_id"]) == cancelled
    lost = kernels.loc[mask_of[cut]]
    assert lost["status"] == "error" and "failed or was cancelled" in lost["reason"]
    assert f".snakemake/slurm_logs/group_kernel_cells" in lost["reason"] and f"/{cancelled}.log" in lost["reason"], \
        lost["reason"]
    assert not (work / CAUSAL).exists() and not (work / FULL).exists()

    # A dry run plans both cells again (plus aggregation); the real run measures only the lost one
    # and writes the finished one's kept row back.
    # (--verbose: Snakemake 9.27's dry run prints the jobs' blocks only with it)
    dry = subprocess.run(COMMAND + ["-n", "--verbose"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    planned = {line.split("output: ")[1].split(",")[0].strip() for line in (dry.stdout + dry.stderr).splitlines()
               if "output: results/cells/" in line}
    assert planned == {CAUSAL, FULL}, planned
    run2 = subprocess.run(COMMAND, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert run2.returncode == 0, (run2.stdout + run2.stderr)[-4000:]
    kernels = pd.read_parquet(work / "results" / "kernels.parquet").set_index("mask")
    assert (kernels["status"] == "ok").all() and len(kernels) == 2
    assert str(kernels.loc[mask_of[done], "slurm_job_id"]) == cancelled  # measured once, in the cancelled job
    assert str(kernels.loc[mask_of[cut], "slurm_job_id"]) != cancelled
    assert (work / "results" / "report.html").exists()
    assert not (work / "results" / "lost").exists() and not (work / "results" / "lost_kernels.parquet").exists()
    # Kernel cells ran as grouped SLURM jobs, each row with its job id, each measured by the job's
    # warm worker (a child of its own per cell); no worker outlives its job.
    assert kernels["slurm_job_id"].notna().all() and (kernels["isolation"] == "worker").all()
    assert not _none_left(work), _servers(work)


# Two 8-GPU nodes, as many CPUs and as much memory as a real one (slurmd accepts the declared sizes).
GPU_NODE = {"cpus_per_node": 64, "gpus_per_node": 8, "memory_mb": 512000, "oversubscribe": "NO"}
GPU_CONFIG = {
    "device": "cuda", "kernels": ["sdpa"], "masks": ["full"], "seqlens": [128, 256], "directions": ["fwd"],
    "dtypes": ["float32"], "heads_q": 4, "heads_kv": 2, "head_dim": 16, "gate_seqlen": 64,
    "timing": {"warmup": 1, "reps": 2}, "limits": {"cell_timeout_s": 120},
    "cp_strategies": ["ring"], "cp_sizes": [2], "cp_masks": ["full"], "cp_tokens_per_rank": [64],
}


def test_jobs_no_node_can_hold_stop_the_run_before_submitting_naming_the_keys(cluster, tmp_path):
    """The CPU grid asks 8 CPUs and 32,000 MiB per cell by default; on nodes of 2 CPUs and 2,000 MiB
    every job would pend forever with Snakemake silent, so the README's SLURM command stops at once
    and says which keys to set and to what."""
    work = _checkout(tmp_path / "longca", config={k: v for k, v in CONFIG.items()
                                                  if k not in ("slurm_cpus_per_cell", "slurm_mem_mb_per_cell")})
    run = subprocess.run(COMMAND, cwd=work, env=_env(cluster), capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "slurm_cpus_per_cell" in out and "at most 2 CPUs and 2000 MiB" in out, out[-3000:]
    assert "slurm_cpus_per_cell=2" in out, out[-3000:]
    assert not _squeue(cluster)  # nothing was submitted


@pytest.fixture
def gpu_cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm_gpu"), **GPU_NODE)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_gpu_jobs_ask_for_one_nodes_gpus_cpus_and_memory_exclusively(gpu_cluster, tmp_path):
    work = _checkout(tmp_path / "longca", config=None)
    env = {**_env(gpu_cluster), "CUDA_VISIBLE_DEVICES": ""}  # this "login node" has no GPU
    # The README's command, as written, is planned here without a GPU: every kernel cell in jobs of
    # 8 asking for one GPU, the CP cells for theirs.
    readme = COMMAND + ["--configfile", "config/gpu.yaml", "--config", "gpus=8", "ranks_per_node=8"]
    dry = subprocess.run(readme + ["-n", "--verbose"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-4000:]
    plan = dry.stdout + dry.stderr
    assert "no GPU is visible" not in plan
    gpu_grid = yaml.safe_load((work / "config" / "gpu.yaml").read_text())
    assert plan.count("rule kernel_cell:") == len(gpu_grid["kernels"]) * 14 * 8 * 2
    assert "gres=gpu:1" in plan and "slurm_extra=--exclusive" in plan

    (work / "config" / "small.yaml").write_text(yaml.safe_dump(GPU_CONFIG))
    # `--config` on the command line, which used to replace the profile's `isolation: fork`.
    run = subprocess.run(COMMAND + ["--configfile", "config/small.yaml", "--config", "gpus=8", "ranks_per_node=1"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    # The jobs must run: a job that dies (no GPU granted, a Snakefile it cannot read) leaves rows
    # written for lost cells, which must not pass for measured ones.
    assert run.returncode == 0, out[-4000:]
    jobs = _jobs(gpu_cluster)
    kernel_jobs = [j for j in jobs.values() if "kernel_cell" in j.get("Comment", "")]
    cp_jobs = [j for j in jobs.values() if "cp_cell" in j.get("Comment", "")]
    assert len(kernel_jobs) == 1 and len(cp_jobs) == 1, (jobs, out[-3000:])
    group = kernel_jobs[0]
    # One node and one GPU (the executor runs a group's cells one after another), one cell's CPUs and
    # memory (8, 32000 MiB), alone on the node, for both cells' limits (2 min each) plus start-up.
    # (An exclusive job holds all of its node's CPUs; what it asked for is CPUs/Task and MinMemoryNode.)
    shape = lambda job: {key: job.get(key) for key in ("NumNodes", "NumTasks", "CPUs/Task", "MinMemoryNode",
                                                        "TresPerNode", "OverSubscribe", "TimeLimit")}
    assert shape(group) == {"NumNodes": "1", "NumTasks": "1", "CPUs/Task": "8", "MinMemoryNode": "32000M",
                            "TresPerNode": "gres:gpu:1", "OverSubscribe": "NO", "TimeLimit": "00:14:00"}, group
    # 2 ranks at 1 a node: two nodes, one task (a torchrun agent) each, with its GPU and 8 CPUs.
    assert shape(cp_jobs[0]) == {"NumNodes": "2", "NumTasks": "2", "CPUs/Task": "8", "MinMemoryNode": "32000M",
                                 "TresPerNode": "gres:gpu:1", "OverSubscribe": "NO", "TimeLimit": "00:07:00"}, cp_jobs[0]
    # Every cell has its row (these GPUs are stand-ins, so the measurements fail as rows), each made
    # by the job's resident lane for its GPU, which ended with the job: no lane outlives a job.
    rows = [json.loads(p.read_text()) for p in (work / "results").glob("**/kernels/sdpa/full/*.json")]
    assert {r["cell_id"] for r in rows} >= {"sdpa/full/float32_fwd_128", "sdpa/full/float32_fwd_256"}, out[-3000:]
    assert all(r.get("isolation") == "resident" and r.get("slurm_job_id") for r in rows), rows
    assert not _none_left(work), _servers(work)


def test_the_cluster_script_runs_one_command_against_a_one_node_cluster_and_stops_it(tmp_path):
    """`python tests/slurm_cluster.py ROOT --nodes 1 ... -- COMMAND` (how the README's SLURM command
    runs on a one-node cluster of a GPU machine): the command sees the private cluster, its exit code
    is the script's, and no daemon outlives the script."""
    script = Path(__file__).with_name("slurm_cluster.py")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "c"), "--nodes", "1", "--cpus", "2", "--",
                           "sh", "-c", 'sinfo -h -N -o "%N %c" && srun -n1 sh -c "exit 3"'],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout.split() == ["n1", "2"]
    # munged, slurmctld and slurmd all name the cluster's folder on their command line.
    left = subprocess.run(["pgrep", "-af", str(tmp_path / "c")], capture_output=True, text=True).stdout
    assert left == "", left
    assert not (tmp_path / "c" / "cgroup.conf").exists()  # only with --without-systemd


def test_two_nodes_sharing_a_hosts_gpus_each_give_their_jobs_their_own_devices(tmp_path):
    """How the two-node run on one 4-GPU host is made: `--nodes 2 --gpu-files` four devices (here
    character devices numbered as /dev/nvidia0-3, standing in: nothing opens them).  n1 holds the
    first two, n2 the last two; a job over both nodes sees, on each, that node's own devices
    (CUDA_VISIBLE_DEVICES 0,1 on n1 and 2,3 on n2, not n2's node-local places 0,1), in a batch step as
    in an srun step of it."""
    from slurm_cluster import _stand_in_gpu

    devices = tmp_path / "dev"
    devices.mkdir()
    files = []
    for i in range(4):
        _stand_in_gpu(devices / f"nvidia{i}", i)
        files.append(str(devices / f"nvidia{i}"))
    script = Path(__file__).with_name("slurm_cluster.py")
    show = 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "c"), "--nodes", "2", "--cpus", "2", "--gpu-files", *files,
         "--", "sh", "-c",
         f"srun -N2 --ntasks-per-node=1 --gres=gpu:2 sh -c '{show}' && "
         f"srun -w n2 -N1 -n1 --gres=gpu:1 sh -c '{show}'"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split("\n")
    assert sorted(lines[:2]) == ["n1 0,1", "n2 2,3"], proc.stdout
    assert lines[2] == "n2 2", proc.stdout
    assert (tmp_path / "c" / "gres.conf").read_text().count("NodeName=n2") == 2
