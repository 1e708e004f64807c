"""CP strategies under real torchrun process groups (gloo on CPU): exact against the reference, and
a hung collective ends as a ``timeout`` row."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longca import cp
from longca.cp.base import Unsupported
from longca.cp.ulysses import head_chunks

HERE = Path(__file__).resolve().parent
OURS = ["allgather", "double_ring", "groupcast", "ring", "ulysses", "usp"]


def _torchrun(nproc: int, *args: str, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("world, seqlen, calls", [(2, 384, "auto"), (2, 384, "pieces"), (4, 512, "auto")])
def test_every_strategy_matches_the_reference(tmp_path, world, seqlen, calls):
    """Blocks as one call each (the default: a dense mask per block on the CPU) and as pieces."""
    out = tmp_path / "gate.jsonl"
    proc = _torchrun(world, str(HERE / "cp_gate_script.py"), str(out), str(seqlen),
                     ",".join(n for n in cp.names() if not n.startswith("test_")),
                     *(["--pieces"] if calls == "pieces" else []))
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
@pytest.mark.parametrize("world, heads, options, chunks", [(2, "8,4", '{"head_chunks": 0}', 2),
                                                          (2, "8,8", '{"head_chunks": 4}', 4),
                                                          (4, "16,8", '{"head_chunks": 0}', 2),
                                                          (2, "8,4", '{"head_chunks": 4}', 4)])
def test_ulysses_in_head_chunks_matches_the_reference(tmp_path, world, heads, options, chunks):
    """Each rank attends its heads in chunks whose all-to-alls overlap the attention (0: one chunk per
    KV head a rank attends); every mask, dtype and direction still matches the reference."""
    out = tmp_path / "gate.jsonl"
    proc = _torchrun(world, str(HERE / "cp_gate_script.py"), str(out), "256", "ulysses",
                     f"--heads={heads}", f"--options={options}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 24 and all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"][:3]
    assert max(r["error"] for r in rows if r["dtype"] == "float32") < 1e-5
    heads_q, heads_kv = (int(h) // world for h in heads.split(","))
    assert head_chunks(json.loads(options)["head_chunks"], heads_q, heads_kv, world)[0] == chunks


def test_ulysses_chunks_hold_whole_kv_heads_or_whole_groups_of_their_query_heads():
    assert head_chunks(0, 16, 2, 4) == (2, 2) and head_chunks(0, 64, 8, 1) == (1, 1)
    assert head_chunks(1, 16, 2, 4) == (1, 1) and head_chunks(8, 16, 2, 4) == (8, 2)
    for bad in (3, 32, -1, True, "two"):
        with pytest.raises(Unsupported, match=f"head_chunks {bad!r}: a rank attends 16 query heads reading 2 KV"):
            head_chunks(bad, 16, 2, 4)


@pytest.mark.slow
def test_ulysses_head_chunks_that_split_a_kv_head_are_unsupported_naming_the_option(tmp_path):
    out = tmp_path / "gate.jsonl"
    proc = _torchrun(2, str(HERE / "cp_gate_script.py"), str(out), "256", "ulysses", "causal",
                     "--heads=8,4", '--options={"head_chunks": 3}')
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["status"] == "unsupported" and "head_chunks 3" in r["reason"] for r in rows)


@pytest.mark.slow
def test_hung_collective_is_a_timeout_row(tmp_path):
    from longca.execution.cluster.cp_launch import run

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
    from longca.execution.cluster.cp_launch import run

    # cp_size 3 with a mask whose settings make every rank raise before any collective is fine;
    # an unknown strategy makes every rank exit with an error before writing anything.
    settings = {"strategy": "no_such_strategy", "mask": "causal", "seqlen": 64, "cp_size": 2}
    row = run(settings, str(tmp_path / "row.json"), cell_id="x", timeout_s=120, threads=2)
    assert row["status"] == "error" and "no_such_strategy" in row["reason"]
    # Where it failed: one node, no SLURM job here (an ok row says the same of where it ran).
    assert row["nodes"] == 1 and "slurm_job_id" in row and row["slurm_job_id"] is None


@pytest.mark.slow
def test_time_based_warmup_keeps_ranks_in_step(tmp_path):
    """warmup_ms: each rank estimates its own extra warm-up calls; the cell only finishes (rather than
    hanging in a collective) if every rank makes the same number, the largest asked."""
    from longca.execution.cluster.cp_launch import run

    settings = {"strategy": "ring", "mask": "causal", "seqlen": 512, "cp_size": 2, "heads_q": 4, "heads_kv": 2,
                "head_dim": 16, "gate_seqlen": 128, "reps": 2, "warmup": 0, "warmup_ms": 150,
                "strategy_options": {"local_kernel": "sdpa_math"}}
    began = time.time()
    row = run(settings, str(tmp_path / "row.json"), cell_id="ring/causal", timeout_s=120, threads=2)
    assert row["status"] == "ok", row.get("reason")
    assert row["warmup_ms"] == 150 and row["median_ms"] > 0
    assert row["inputs_held"] == "shards"  # a rank times its own shards, the global tensors freed
    # Where and when it was timed: rank 0's host, during this run (the time is kept to the second).
    import socket
    from datetime import datetime

    assert row["timed_on"] == socket.gethostname() and row["timed_load_1m"] is not None
    assert int(began) <= datetime.fromisoformat(row["timed_at"]).timestamp() <= time.time()


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


def _resident_settings(**over):
    settings = {"strategy": "ring", "mask": "varlen_causal", "seqlen": 512, "cp_size": 2, "heads_q": 4,
                "heads_kv": 2, "head_dim": 16, "gate_seqlen": 128, "reps": 2, "warmup": 0, "device": "cpu",
                "strategy_options": {"local_kernel": "sdpa_math"}}
    return {**settings, **over}


def _group_processes() -> list[str]:
    """The ranks of this test's resident group (its name is in their socket path)."""
    from longca.execution.cluster.cp_group import group_name

    marker = group_name("cpu", ["cpu", "cpu"], 2)
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "cp_resident" in line and marker in line]


@pytest.mark.slow
def test_resident_group_measures_cell_after_cell_and_ends_when_idle(tmp_path, monkeypatch):
    """Two CP cells through `cp-cell`'s warm isolation: one torchrun group measures both (the second
    pays no start-up), each row says so and how long its job took; the group exits once idle."""
    from longca.execution.cluster.cp_launch import run

    monkeypatch.setenv("LONGCA_WORKER_IDLE_S", "3")
    monkeypatch.setenv("LONGCA_TEST_GROUP", str(tmp_path))  # a group of this test's own (worker key)
    rows = [run(_resident_settings(direction=d), str(tmp_path / f"{d}.json"), cell_id=f"ring/{d}", timeout_s=120,
                threads=2, isolation="worker") for d in ("fwd", "bwd")]
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("reason") for r in rows]
    assert [r["isolation"] for r in rows] == ["resident", "resident"]
    assert [r["group_cell"] for r in rows] == [1, 2]
    for row in rows:
        assert row["job_wall_s"] >= row["wall_s"] >= row["timed_wall_s"] > 0
        assert json.loads(row["notes"])["local_calls"] == "fused"
        assert json.loads((tmp_path / f"{row['direction']}.json").read_text())["job_wall_s"] == row["job_wall_s"]
    deadline = time.monotonic() + 60
    while _group_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_processes(), "the resident group outlived its idle time"


@pytest.mark.slow
def test_hung_cell_in_a_resident_group_is_a_timeout_row_and_the_group_is_killed(tmp_path, monkeypatch):
    from longca.execution.cluster.cp_launch import run

    monkeypatch.setenv("LONGCA_TEST_KERNELS", "1")
    monkeypatch.setenv("LONGCA_TEST_GROUP", str(tmp_path))
    settings = _resident_settings(strategy="test_hang", mask="causal", seqlen=256, strategy_options={})
    row = run(settings, str(tmp_path / "row.json"), cell_id="test_hang/causal", timeout_s=20, threads=2,
              isolation="worker")
    assert row["status"] == "timeout" and row["isolation"] == "resident", row
    time.sleep(1)
    assert not _group_processes(), "a killed group left ranks behind"


def _fail_first_settings(**options):
    return {"strategy": "test_fail_first", "mask": "causal", "seqlen": 256, "cp_size": 2, "heads_q": 4,
            "heads_kv": 2, "head_dim": 16, "gate_seqlen": 128, "reps": 1, "warmup": 0, "device": "cpu",
            "strategy_options": {"local_kernel": "sdpa_math", **options}}


@pytest.mark.slow
@pytest.mark.parametrize("isolation, then", [
    ("fork", "; 1 other rank failed after it: rank 0 ("),
    ("worker", "; no other rank failed; the group was killed at the cell's 20 s limit;")], ids=["fork", "resident"])
def test_a_failed_row_names_the_rank_that_failed_first(tmp_path, monkeypatch, isolation, then):
    """Rank 1 raises; rank 0 goes on into the ring and waits for it.  In a torchrun of its own (fork:
    what a SLURM job runs) rank 1 then exits and rank 0 fails seconds later, its partner gone; in a
    resident group rank 1 stays and rank 0 waits until the cell's limit.  Either way the row names
    rank 1's error, not rank 0's failure or the limit."""
    from longca.execution.cluster import cp_launch

    monkeypatch.setenv("LONGCA_TEST_KERNELS", "1")
    monkeypatch.setenv("LONGCA_TEST_GROUP", str(tmp_path))  # a resident group of this test's own
    monkeypatch.setattr(cp_launch, "COLLECTIVE_SHARE", 0.01)  # collectives give up after 5 s
    out = tmp_path / "results" / "cells" / "cp" / "test_fail_first" / "causal" / "float32_fwd_128x2.json"
    row = cp_launch.run(_fail_first_settings(), str(out), cell_id="test_fail_first/causal/float32_fwd_128x2",
                        timeout_s=120 if isolation == "fork" else 20, threads=2, isolation=isolation)
    assert row["status"] == "error", row
    assert row["reason"].startswith("first failure: rank 1 (host "), row["reason"]
    assert "RuntimeError: test_fail_first: rank 1 fails first, on purpose" in row["reason"]
    assert then in row["reason"]
    assert row["reason"].endswith(f"every rank's output: {tmp_path}/results/logs/cp/test_fail_first/causal/"
                                  "float32_fwd_128x2.log")
    assert json.loads(out.read_text())["reason"] == row["reason"]
    assert not list(out.parent.glob("*.failures"))  # the ranks' records are not left beside the row


@pytest.mark.slow
def test_a_rank_killed_without_a_python_exception_is_named_from_torchruns_report(tmp_path, monkeypatch):
    from longca.execution.cluster import cp_launch

    monkeypatch.setenv("LONGCA_TEST_KERNELS", "1")
    monkeypatch.setattr(cp_launch, "COLLECTIVE_SHARE", 0.01)
    row = cp_launch.run(_fail_first_settings(die=True), str(tmp_path / "row.json"), cell_id="killed",
                        timeout_s=120, threads=2)
    assert row["status"] == "error", row
    assert row["reason"].startswith("first failure: rank 1 (host "), row["reason"]
    assert "as torchrun saw it): Signal 9 (SIGKILL)" in row["reason"]
    assert "torchrun exited with status 1" in row["reason"]


@pytest.mark.slow
def test_a_failure_starting_the_process_group_is_named(tmp_path):
    """The issue's case: NCCL missing (this CPU-only torch has no NCCL), every rank failing before the
    process group is up; rank 0 writes no row, and the row names the failure, not torchrun's status."""
    import torch.distributed as dist

    from longca.execution.cluster import cp_launch

    if dist.is_nccl_available():
        pytest.skip("this torch has NCCL")
    settings = {**_fail_first_settings(), "strategy": "ring", "device": "cuda"}
    row = cp_launch.run(settings, str(tmp_path / "row.json"), cell_id="no_nccl", timeout_s=120, threads=2)
    assert row["status"] == "error", row
    assert "before the process group was up: RuntimeError: Distributed package doesn't have NCCL built in" \
        in row["reason"], row["reason"]
    assert "1 other rank failed after it: rank " in row["reason"]
    assert row["reason"].endswith("torchrun exited with status 1 and rank 0 wrote no row")
