"""scripts/gpu_grid.sh runs the published grid (`snakemake all --configfile config/gpu.yaml`) within
a budget: its arguments, (dry run, no GPU needed) the workflow it drives, and the lock a Snakemake
killed at the budget leaves."""

import re
import subprocess
import tarfile

import pytest
from snakemake_run import REPO, run_script

SCRIPT = REPO / "scripts" / "gpu_grid.sh"


def _run(*args, env=None, timeout=60):
    return run_script(SCRIPT, *args, env=env, timeout=timeout)


def test_help_says_how_to_call_it():
    proc = _run("--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: scripts/gpu_grid.sh OUTDIR")
    for option in ("--budget-s", "--work", "--overrides", "CUDA_VISIBLE_DEVICES"):
        assert option in proc.stdout


@pytest.mark.parametrize("args, says", [
    ((), "missing OUTDIR"),
    (("out", "--budget-s", "30"), "--budget-s must be a whole number of seconds, at least 60"),
    (("out", "--overrides", "no-such.yaml"), "--overrides: no-such.yaml is not a file"),
    (("out", "--frobnicate"), "unknown option --frobnicate"),
])
def test_bad_arguments_are_named(args, says):
    proc = _run(*args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not (REPO / "out").exists()


@pytest.mark.slow
def test_dry_run_plans_the_gpu_grid_with_the_overrides_and_records_the_call(tmp_path):
    """`-- -n` plans `snakemake all` on config/gpu.yaml + the overrides file, in the work folder."""
    overrides = tmp_path / "one_gpu.yaml"
    overrides.write_text("cp_strategies: []\n")
    out, work = tmp_path / "out", tmp_path / "run"
    for kept in ("store/time/ab/ab.json", "compile_cache/triton/x/kernel.cubin"):  # a previous call's
        (work / "results" / kept).parent.mkdir(parents=True)
        (work / "results" / kept).write_text("{}")
    proc = _run(str(out), "--work", str(work), "--overrides", str(overrides), "--budget-s", "120",
                "--", "-n", "--config", "seqlens=[1024]", env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "exit 0" in (out / "runs.txt").read_text()
    assert (out / "overrides.yaml").read_text() == "cp_strategies: []\n"
    log = (out / "snakemake.log").read_text()
    assert "results/cells/kernels/flex_flash/causal/bfloat16_bwd_1024.json" in log
    assert "bfloat16_bwd_2048.json" not in log  # the --config seqlens override reached Snakemake
    assert "results/cells/cp/" not in log       # and so did the overrides file (no CP cells)
    assert not (work / "results" / "cells").exists()  # a dry run measures nothing
    # The run's results are copied out, the compilers' caches are not (and stay with the run).
    assert (out / "results" / "store" / "time" / "ab" / "ab.json").exists()
    assert not (out / "results" / "compile_cache").exists()
    with tarfile.open(out / "results.tar.gz") as archive:  # and the same as one file
        names = archive.getnames()
    assert "results/store/time/ab/ab.json" in names and not any("compile_cache" in n for n in names)
    assert (work / "results" / "compile_cache" / "triton" / "x" / "kernel.cubin").exists()


@pytest.mark.slow
def test_a_snakemake_killed_at_the_budget_leaves_no_lock_behind(tmp_path):
    """A cell that outlasts SIGINT's 20 s grace gets Snakemake killed, which leaves its lock on the run
    directory; the script removes it, so the next call goes on instead of stopping on a LockException.
    The stand-in for a long GPU cell is a real Snakemake job that ignores SIGINT and SIGTERM.

    The budget (60 s, the least the script takes) sends SIGINT 30 s in.  `timeout -s INT -k 20` then
    exits 137 when it had to kill Snakemake (128 + SIGKILL: the job was running and ignored SIGINT),
    and 124 when Snakemake ended on the SIGINT by itself, which it does only while no job runs: it
    waits for running jobs, and this one never ends.  Under load Snakemake can still be starting 30 s
    in; it then stops before the job with its lock released by itself (its lock is a context
    manager), and the script must neither unlock nor claim to.  Both codes mean "stopped at the
    budget"; anything else (0, 1, 130: not stopped by the budget) fails, and so does a 124 while the
    job ran, or a lock left behind either way."""
    sleeper = tmp_path / "sleeper.pid"
    snakefile = tmp_path / "long_cell.smk"
    snakefile.write_text(
        "rule all:\n    input: 'done.txt'\n"
        "rule long_cell:\n    output: 'done.txt'\n"
        f"    shell: \"trap '' INT TERM; sleep 120 & echo $! > {sleeper}; wait; touch {{output}}\"\n")
    out, work = tmp_path / "out", tmp_path / "run"
    try:
        proc = _run(str(out), "--work", str(work), "--budget-s", "60", "--", "-s", str(snakefile),
                    env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=120)
    finally:
        job_ran = sleeper.exists()
        if job_ran:
            subprocess.run(["kill", sleeper.read_text().strip()], check=False)
    assert proc.returncode == 0, proc.stderr
    code = int(re.search(r" exit (\d+) ", (out / "runs.txt").read_text()).group(1))
    said = proc.stdout + proc.stderr
    if code == 137:  # killed 20 s after SIGINT while the job ran: the script removed the lock
        assert job_ran and "its lock on" in proc.stdout and "is removed" in proc.stdout, said
    else:
        assert code == 124, f"Snakemake was not stopped by the budget: exit {code}\n{said}"
        assert not job_ran, "Snakemake ended within the grace although a job ignoring SIGINT ran"
        assert "lock" not in said, said  # nothing to remove, and nothing claimed
    locks = work / ".snakemake" / "locks"
    assert not locks.exists() or not list(locks.iterdir())
