"""CP strategies under real torchrun process groups (gloo on CPU): exact against the reference, and
a hung collective ends as a ``timeout`` row."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longca import cp

HERE = Path(__file__).resolve().parent
OURS = ["allgather", "double_ring", "ring", "ulysses", "usp"]


def _torchrun(nproc: int, *args: str, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("world, seqlen", [(2, 384), (4, 512)])
def test_every_strategy_matches_the_reference(tmp_path, world, seqlen):
    out = tmp_path / "gate.jsonl"
    proc = _torchrun(world, str(HERE / "cp_gate_script.py"), str(out), str(seqlen), ",".join(n for n in cp.names() if not n.startswith("test_")))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ours = [r for r in rows if r["strategy"] in OURS]
    assert {r["strategy"] for r in ours} == set(OURS)
    bad = [r for r in ours if r["status"] != "ok"]
    assert not bad, bad[:5]
    # fp32 is far inside its tolerance: partial blocks are merged exactly, not approximately.
    assert max(r["error"] for r in ours if r["dtype"] == "float32") < 1e-5
    # Strategies that cannot run here say why instead of failing.
    others = [r for r in rows if r["strategy"] not in OURS]
    assert others and all(r["status"] == "unsupported" and r["reason"] for r in others)


@pytest.mark.slow
def test_hung_collective_is_a_timeout_row(tmp_path):
    from longca.execution.cp_launch import run

    env_before = os.environ.get("LONGCA_TEST_KERNELS")
    os.environ["LONGCA_TEST_KERNELS"] = "1"
    try:
        settings = {"strategy": "test_hang", "mask": "causal", "seqlen": 256, "cp_size": 2, "heads_q": 4,
                    "heads_kv": 2, "head_dim": 16, "gate_seqlen": 128, "reps": 1, "warmup": 0}
        row = run(settings, str(tmp_path / "row.json"), cell_id="test_hang/causal", timeout_s=20, threads=2)
    finally:
        if env_before is None:
            del os.environ["LONGCA_TEST_KERNELS"]
        else:
            os.environ["LONGCA_TEST_KERNELS"] = env_before
    assert row["status"] == "timeout", row
    assert json.loads((tmp_path / "row.json").read_text())["status"] == "timeout"


@pytest.mark.slow
def test_crashed_job_still_writes_a_row(tmp_path):
    from longca.execution.cp_launch import run

    # cp_size 3 with a mask whose settings make every rank raise before any collective is fine;
    # an unknown strategy makes every rank exit with an error before writing anything.
    settings = {"strategy": "no_such_strategy", "mask": "causal", "seqlen": 64, "cp_size": 2}
    row = run(settings, str(tmp_path / "row.json"), cell_id="x", timeout_s=120, threads=2)
    assert row["status"] == "error" and "no_such_strategy" in row["reason"]


@pytest.mark.slow
def test_time_based_warmup_keeps_ranks_in_step(tmp_path):
    """warmup_ms: each rank estimates its own extra warm-up calls; the cell only finishes (rather than
    hanging in a collective) if every rank makes the same number, the largest asked."""
    from longca.execution.cp_launch import run

    settings = {"strategy": "ring", "mask": "causal", "seqlen": 512, "cp_size": 2, "heads_q": 4, "heads_kv": 2,
                "head_dim": 16, "gate_seqlen": 128, "reps": 2, "warmup": 0, "warmup_ms": 150,
                "strategy_options": {"local_kernel": "sdpa_math"}}
    row = run(settings, str(tmp_path / "row.json"), cell_id="ring/causal", timeout_s=120, threads=2)
    assert row["status"] == "ok", row.get("reason")
    assert row["warmup_ms"] == 150 and row["median_ms"] > 0


@pytest.mark.slow
def test_eight_ranks_every_strategy_and_every_2d_layout_match_the_reference(tmp_path):
    """Eight gloo ranks (the CP size of one 8-GPU node): every strategy on the masks the scaling runs
    use, and `usp` / `double_ring` on every rank grid that divides 8 (1×8, 2×4, 4×2, 8×1)."""
    out = tmp_path / "gate.jsonl"
    proc = _torchrun(8, str(HERE / "cp_gate_script.py"), str(out), "512", ",".join(OURS),
                     "full,causal,varlen_causal", "--layouts", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    bad = [r for r in rows if r["status"] != "ok"]
    assert not bad, bad[:5]
    layouts = {(r["strategy"], tuple(sorted(r["options"].items()))) for r in rows}
    assert {o for s, o in layouts if s == "usp"} == {(("ulysses_degree", d),) for d in (1, 2, 4, 8)}
    assert {o for s, o in layouts if s == "double_ring"} == {(("window", d),) for d in (1, 2, 4, 8)}
    assert max(r["error"] for r in rows if r["dtype"] == "float32") < 1e-5
