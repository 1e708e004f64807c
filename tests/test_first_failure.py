"""Which rank of a CP cell failed first (``longca.execution.measure.first_failure``): the earliest
over every rank's own record and torchrun's report, and the row that names it.  The same under
torchrun here and across SLURM nodes: records are files in the cell's folder, torchrun's report
is text in its log (every node's agent's).  The real torchrun cases are in test_cp_distributed.py."""

import json

import pytest

from longca.execution.cluster.cp_launch import cell_log
from longca.execution.measure import first_failure as ff
from longca.execution.measure.first_failure import Failure


def _rank(rank, t, message, *, status="error", type="RuntimeError", stage="cell", host="n1"):
    return Failure(rank=rank, host=host, status=status, type=type, message=message, time=t, stage=stage)


def test_the_earliest_record_is_named_whatever_the_rank_order(tmp_path):
    # Rank 0 (who writes the row) failed last, because rank 3 had died in the collective with it.
    for f in (_rank(0, 105.0, "Connection closed by peer"), _rank(3, 100.25, "no NCCL", stage="start", host="n2"),
              _rank(1, 104.0, "Connection reset by peer")):
        (tmp_path / f"rank{f.rank}.json").write_text(json.dumps(f.__dict__))
    failures = ff.combined(ff.recorded(tmp_path), [])
    assert [f.rank for f in failures] == [3, 1, 0]
    status, reason = ff.summary(failures, log="results/logs/cp/ring/causal/x.log")
    assert status == "error"
    assert reason.startswith("first failure: rank 3 (host n2, ")
    assert "before the process group was up: RuntimeError: no NCCL" in reason
    assert "2 other ranks failed after it: rank 1 (RuntimeError: Connection reset by peer), rank 0 (" in reason
    assert reason.endswith("every rank's output: results/logs/cp/ring/causal/x.log")


def test_one_failure_says_no_other_rank_failed_and_the_same_error_is_not_repeated():
    assert "; no other rank failed" in ff.summary([_rank(1, 1.0, "boom")])[1]
    _, reason = ff.summary(ff.combined([_rank(1, 2.0, "boom"), _rank(0, 1.0, "boom")], []))
    assert reason.startswith("first failure: rank 0 ") and "1 other rank failed after it: rank 1 (the same)" in reason


def test_the_recorder_writes_a_ranks_first_failure_only(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    recorder = ff.Recorder(tmp_path)
    try:
        raise ValueError("the first")
    except ValueError as exc:
        recorder.note("error", exc, stage="start")
    recorder.note("timeout", TimeoutError("a consequence"))
    (record,) = ff.recorded(tmp_path)
    assert (record.rank, record.type, record.message, record.stage, record.status) == (
        2, "ValueError", "the first", "start", "error")
    ff.Recorder(None).note("error", ValueError("nowhere to go"))  # no folder: records nothing, raises nothing


def _torchrun_report(monkeypatch, *, first_exitcode=-9, then_exitcode=-15, first_at=1_000, then_at=1_001) -> str:
    """torchrun's own report (ChildFailedError's text) of rank 1 dying, then rank 0 stopped."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    clock = iter([first_at, then_at])
    monkeypatch.setattr("torch.distributed.elastic.multiprocessing.errors.time.time", lambda: next(clock))
    first = ProcessFailure(local_rank=1, pid=4242, exitcode=first_exitcode, error_file="<N/A>")
    then = ProcessFailure(local_rank=0, pid=4241, exitcode=then_exitcode, error_file="<N/A>")
    return "W0101 noise\n" + ChildFailedError("longca.execution.measure.cp_rank", {1: first, 0: then}).format_msg()


def test_a_rank_killed_without_a_python_exception_comes_from_torchruns_report(monkeypatch):
    reported = ff.torchrun_failures(_torchrun_report(monkeypatch))
    assert {f.rank: f.exitcode for f in reported} == {1: -9, 0: -15}
    killed = next(f for f in reported if f.rank == 1)
    assert killed.source == "torchrun" and killed.time == 1_000 and "SIGKILL" in killed.message
    # Rank 0's own record of its collective failing just after; torchrun's report of rank 0 (its
    # SIGTERM) gives way to it.  The kill, known to the second, still counts as first.
    failures = ff.combined([_rank(0, 1_000.4, "Connection reset by peer")], reported)
    assert [(f.rank, f.source) for f in failures] == [(1, "torchrun"), (0, "rank")]
    status, reason = ff.summary(failures)
    assert status == "error" and reason.startswith("first failure: rank 1 (host ")
    assert "to the second, as torchrun saw it): Signal 9 (SIGKILL) received by PID 4242" in reason
    # A Python failure more than a second before the second torchrun saw the death in stays first.
    assert ff.combined([_rank(0, 998.5, "boom")], reported)[0].rank == 0


def test_ranks_torchrun_stopped_are_not_failures_of_their_own_unless_nothing_else_failed(monkeypatch):
    reported = ff.torchrun_failures(_torchrun_report(monkeypatch, first_exitcode=1, then_exitcode=-15))
    assert [f.rank for f in ff.combined([], reported)] == [1]  # rank 0 was only stopped (SIGTERM)
    assert "exited with status 1" in ff.summary(ff.combined([], reported))[1]
    only_stopped = [f for f in reported if f.exitcode == -15]
    assert [f.rank for f in ff.combined([], only_stopped)] == [0]


@pytest.mark.parametrize("status", ["ok", "wrong", "unsupported"])
def test_a_verdict_every_rank_agreed_on_keeps_its_row(status):
    row = {"status": status, "reason": "the cell's own"}
    assert ff.name_first(row, [_rank(1, 1.0, "boom")]) == row


def test_a_ranks_unsupported_failure_first_makes_the_row_unsupported():
    row = {"status": "error", "reason": "rank 0: Connection closed by peer"}
    failures = ff.combined([_rank(0, 2.0, "Connection closed by peer"),
                            _rank(1, 1.0, "no kernel for this head_dim", status="unsupported", type="Unsupported")], [])
    named = ff.name_first(row, failures, context="the job was killed at its 20 s limit")
    assert named["status"] == "unsupported"
    assert named["reason"].startswith("first failure: rank 1 ") and "Unsupported: no kernel for this head_dim" in named["reason"]
    assert named["reason"].endswith("; the job was killed at its 20 s limit")
    assert ff.name_first(row, []) == row  # nothing recorded or reported: the row as it was


def test_the_rows_log_is_the_cells_log_in_the_same_run_directory():
    assert cell_log("/runs/a/results/cells/cp/ring/causal/float32_fwd_64x2.json", "ring/causal/float32_fwd_64x2") \
        == "/runs/a/results/logs/cp/ring/causal/float32_fwd_64x2.log"
    assert cell_log("/tmp/row.json", "ring/causal/float32_fwd_64x2") is None
