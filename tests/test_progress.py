"""The progress line of a long run: counts by status, the slowest cell, the time left, not too often."""

import re

import pytest
from snakemake_run import snakemake, write_config

from longca.execution.processes import progress
from longca.execution.processes.progress import Record, summary
from longca.results.parquet import load

PROGRESS_LINE = re.compile(r"^longca progress: (\d+)/(\d+) cells · ok (\d+) · unsupported (\d+) · failed (\d+)(.*)$",
                           re.M)


def test_summary_counts_statuses_names_the_slowest_and_extrapolates_the_recent_pace():
    records = [Record(100.0 + 10 * i, f"k/m/float32_fwd_{i}", status, wall)
               for i, (status, wall) in enumerate([("ok", 3.0), ("unsupported", 0.1), ("oom", 41.0), ("ok", 2.0)])]
    line = summary(records, planned=10, started=100.0, now=130.0)
    # 4 cells in the 30 s since the start: 7.5 s each, 6 to go.
    assert line == ("longca progress: 4/10 cells · ok 2 · unsupported 1 · failed 1 (oom 1) · "
                    "slowest k/m/float32_fwd_2 41 s · ~45 s left")
    assert summary(records, planned=4, started=0.0, now=600.0).endswith("· done in 10 min")


def test_a_line_is_printed_at_most_every_interval_and_for_the_last_cell(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(progress.EVERY_ENV, "3600")
    monkeypatch.delenv(progress.DIR_ENV, raising=False)
    progress.record("outside/a/run", {"status": "ok", "wall_s": 1.0})  # a cell run by hand: nothing
    assert capsys.readouterr().out == "" and not (tmp_path / "progress").exists()
    progress.start(3, tmp_path / "progress")
    for i in range(3):
        progress.record(f"k/m/{i}", {"status": "ok", "wall_s": 1.0})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("longca progress: 3/3 cells · ok 3 ·")
    assert len((tmp_path / "progress" / "cells.tsv").read_text().splitlines()) == 3


@pytest.mark.slow
def test_a_real_run_prints_progress_lines_whose_counts_match_the_rows(tmp_path, monkeypatch):
    # One cell of each kind of outcome: ok, unsupported (cuDNN on a CPU), failed (a wrong kernel).
    write_config(tmp_path, {"kernels": ["sdpa", "sdpa_cudnn", "test_wrong"], "masks": ["full"], "seqlens": [64],
                            "directions": ["fwd"], "heads_q": 2, "heads_kv": 2, "head_dim": 16, "gate_seqlen": 64,
                            "timing": {"warmup": 1, "reps": 2}, "threads": 1, "cp_strategies": []})
    monkeypatch.setenv(progress.EVERY_ENV, "0")  # a line per cell (inherited by Snakemake and its jobs)
    proc = snakemake(tmp_path, "results/kernels.parquet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = PROGRESS_LINE.findall(proc.stdout)
    assert [(done, planned) for done, planned, *_ in lines] == [("1", "3"), ("2", "3"), ("3", "3")], proc.stdout
    rows = load(tmp_path / "results" / "kernels.parquet")["status"].value_counts().to_dict()
    assert rows == {"ok": 1, "unsupported": 1, "wrong": 1}
    *_, (done, planned, ok, unsupported, failed, rest) = lines
    assert (int(ok), int(unsupported), int(failed)) == (1, 1, 1)
    assert rest.startswith(" (wrong 1) · slowest ") and " · done in " in rest
