"""scripts/device_run.sh is a plain script: its arguments, and (dry run) the workflow it drives."""

import pytest
from snakemake_run import REPO, run_script

SCRIPT = REPO / "scripts" / "device_run.sh"


def _run(*args, env=None, timeout=60):
    return run_script(SCRIPT, *args, env=env, timeout=timeout)


def test_help_says_how_to_call_it():
    proc = _run("--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: scripts/device_run.sh OUTDIR")
    for option in ("--budget-s", "--wheels", "--no-bench", "CUDA_VISIBLE_DEVICES"):
        assert option in proc.stdout


@pytest.mark.parametrize("args, says", [
    ((), "missing OUTDIR"),
    (("--budget-s",), "--budget-s needs a number of seconds"),
    (("out", "--budget-s", "soon"), "--budget-s must be a whole number of seconds"),
    (("out", "--frobnicate"), "unknown option --frobnicate"),
])
def test_bad_arguments_are_named(args, says):
    proc = _run(*args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not (REPO / "out").exists()


@pytest.mark.slow
def test_dry_run_plans_each_stage_on_the_given_gpu(tmp_path):
    """`-- -n` checks the script without a GPU: stage by stage, the narrowed GPU grid is planned."""
    out = tmp_path / "out"
    proc = _run(str(out), "--no-bench", "--budget-s", "120", "--stages", "[1024];[1024,2048]", "--", "-n",
                env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out / "workflow" / "stages.txt").read_text().count(" exit 0") == 2
    stage2 = (out / "workflow" / "stage2.log").read_text()
    assert "results/cells/kernels/flex/causal/bfloat16_bwd_2048.json" in stage2
    assert "results/cells/kernels/flex/causal/bfloat16_bwd_1024.json" in stage2
    assert "results/cells/kernels/sdpa_math/" not in stage2  # the narrowed kernel list
