"""`longca status` on a real small grid: one cell measured by a real Snakemake run, then the grid's
cells reported as cached, missing or stale as the settings and then the code change."""

import os
import shutil
import subprocess
import sys

import pytest
import yaml
from snakemake_run import REPO, snakemake, write_config

from longca.status import parse_summary, why_stale
import tiny

pytestmark = pytest.mark.slow

CONFIG = tiny.grid(
    kernels=["sdpa_math"], dtypes=None,
    # One CP cell, never measured: status counts CP cells apart.
    cp_strategies=["ring"], cp_sizes=[2], cp_tokens_per_rank=[32], cp_masks=["causal"],
    cp_options={"ring": {"local_kernel": "sdpa_math"}},
)
MEASURED = "results/cells/kernels/sdpa_math/full/float32_fwd_64.json"


def status(workdir, *args, checkout=REPO):
    """`longca status` as a user types it, from the package of ``checkout``."""
    proc = subprocess.run([sys.executable, "-m", "longca", "status", "--configfile", str(workdir / "config.yaml"),
                           "--directory", str(workdir), *args], capture_output=True, text=True, timeout=300,
                          cwd=workdir, env={**os.environ, "PYTHONPATH": str(checkout)})
    return proc


def counts(text: str) -> dict[str, list[int]]:
    """The table's rows: state -> its count per kind of cell."""
    return {words[0]: [int(n) for n in words[1:]] for words in map(str.split, text.splitlines())
            if len(words) > 1 and all(w.isdigit() for w in words[1:])}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("status")
    write_config(workdir, CONFIG)
    proc = snakemake(workdir, MEASURED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir


def test_a_fresh_grid_is_cached_where_measured_and_missing_elsewhere(grid):
    proc = status(grid, "--list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split() == ["cells", "kernel", "cp"]
    assert counts(proc.stdout) == {"cached": [1, 0], "missing": [1, 1], "stale": [0, 0], "unreadable": [0, 0]}
    assert "missing    kernel  sdpa_math/causal/float32_fwd_64" in proc.stdout
    assert "missing    cp      ring/causal/float32_fwd_32x2" in proc.stdout
    assert "sdpa_math/full/" not in proc.stdout  # a cached cell is not listed


def test_a_row_file_that_holds_no_json_is_unreadable_not_cached(grid, tmp_path):
    work = tmp_path / "copy"
    shutil.copytree(grid, work, symlinks=True)
    (work / MEASURED).write_text('{"cell_id": ')
    proc = status(work, "--list")
    assert proc.returncode == 0, proc.stderr
    assert counts(proc.stdout)["cached"] == [0, 0] and counts(proc.stdout)["unreadable"] == [1, 0]
    assert ("unreadable kernel  sdpa_math/full/float32_fwd_64  (holds no JSON object: `longca remeasure` it, then "
            "`snakemake all` writes it again)") in proc.stdout


def test_changed_settings_make_the_cell_stale_and_say_which(grid, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(grid, run, symlinks=True)
    write_config(run, {**CONFIG, "timing": {"warmup": 1, "reps": 3}})
    proc = status(run, "--list")
    assert proc.returncode == 0, proc.stderr
    assert counts(proc.stdout) == {"cached": [0, 0], "missing": [1, 1], "stale": [1, 0], "unreadable": [0, 0]}
    assert "stale: settings changed 1" in proc.stdout
    assert "stale      kernel  sdpa_math/full/float32_fwd_64  (settings changed: reps 2 → 3)" in proc.stdout
    # --config reaches Snakemake as it would from `snakemake --config`: the old value is cached again.
    proc = status(run, "--config", "timing={warmup: 1, reps: 2}")
    assert counts(proc.stdout)["cached"] == [1, 0], proc.stdout + proc.stderr


def test_changed_code_makes_the_cell_stale_and_says_so(grid, tmp_path):
    """A checkout whose sdpa adapter differs by a statement (its file is in the cell's fingerprint);
    a comment, a docstring or an import alone is no change (the key follows the code lines)."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Snakefile", "workflow", "config"):
        (checkout / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "longca", checkout / "longca", ignore=shutil.ignore_patterns("__pycache__"))
    adapter = checkout / "longca" / "kernels" / "sdpa.py"
    source = adapter.read_text()
    assert source.startswith('"""') and "from __future__ import annotations\n" in source
    source = source.replace('"""', '"""Reworded. ', 1)  # the module docstring
    source = source.replace("from __future__ import annotations\n", "from __future__ import annotations\nimport math\n", 1)
    adapter.write_text(source + "# a comment\n")
    run = tmp_path / "run"
    shutil.copytree(grid, run, symlinks=True)
    proc = status(run, checkout=checkout)
    assert proc.returncode == 0 and counts(proc.stdout)["cached"] == [1, 0], proc.stdout + proc.stderr
    with open(adapter, "a") as f:
        f.write("_CHANGED = 1\n")
    proc = status(run, "--list", checkout=checkout)
    assert proc.returncode == 0, proc.stderr
    assert "stale      kernel  sdpa_math/full/float32_fwd_64  (code changed)" in proc.stdout
    write_config(run, {**CONFIG, "timing": {"warmup": 1, "reps": 3}})
    proc = status(run, "--list", checkout=checkout)
    assert "(settings changed: reps 2 → 3; code changed)" in proc.stdout
    assert "stale: settings changed 1, code changed 1" in proc.stdout


def test_a_bad_config_file_is_named_with_its_line(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG) + "seqlens: [64, 128\n")
    proc = status(tmp_path)
    assert proc.returncode == 2
    assert f"longca status: {tmp_path / 'config.yaml'}, line" in proc.stderr and "not valid YAML" in proc.stderr
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**CONFIG, "timing": {"reps": 0}}))
    proc = status(tmp_path)
    assert proc.returncode == 2 and "config.timing.reps: 0 is less than the minimum of 1" in proc.stderr


def test_reasons_are_read_from_snakemakes_words():
    settings = '\'{"reps": 2, "seqlen": 64}\''
    now = '\'{"reps": 3, "seqlen": 64}\''
    reason = "Params have changed since last execution: Union of exclusive params before and now across all output: "
    assert why_stale(f"{reason}before: {settings} now: {now} ") == "settings changed: reps 2 → 3"
    assert why_stale(f"{reason}before: '1a2b' now: 'c3d4' ") == "code changed"
    assert why_stale(f"{reason}before: {settings},'1a2b' now: 'c3d4',{now}") == \
        "settings changed: reps 2 → 3; code changed"
    assert why_stale("Code has changed since last execution") == "Code has changed since last execution"
    summary = ("output_file\tdate\trule\tlog-file(s)\tstatus\tplan\n"
               "results/kernels.parquet\t-\taggregate_kernels\t-\tmissing\tupdate pending\n"
               "results/cells/kernels/k/m/float32_fwd_64.json\tMon\tkernel_cell\t-\tok\tno update\n"
               "results/cells/cp/ring/m/float32_fwd_32x2.json\tMon\tcp_cell\t-\trule implementation changed\t"
               "update pending\n")
    cells = parse_summary(summary)
    assert [(c.name, c.kind, c.state, c.why) for c in cells] == [
        ("k/m/float32_fwd_64", "kernel", "cached", ""),
        ("ring/m/float32_fwd_32x2", "cp", "stale", "rule implementation changed")]
