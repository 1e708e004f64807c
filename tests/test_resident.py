"""Resident measurement: one long-lived measuring process per device, a fresh one after a crash.

On the CPU lane (what CI has); the GPU lanes run the same code with CUDA_VISIBLE_DEVICES set
(lab/longca_lab/bench_pipeline.py checks them on a GPU box)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from longca.execution.processes import resident
import tiny

SETTINGS = tiny.cell()


@pytest.fixture
def env():
    """A lane of its own (LONGCA_* variables are part of its name) and slot locks of its own (a
    short temp dir: Unix socket paths are limited to 107 bytes); the lane exits after 3 idle s."""
    tmp = tempfile.mkdtemp(prefix="lc", dir="/tmp")
    yield dict(os.environ, LONGCA_TEST_RUN=uuid.uuid4().hex, LONGCA_WORKER_IDLE_S="3", TMPDIR=tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def start_client(env, tmp_path, kernel, name, *extra, **settings):
    out = tmp_path / f"{name}.json"
    with open(tmp_path / f"{name}.log", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "longca", "run-cell", "--isolation", "resident",
                                 "--threads", "1", "--settings", json.dumps({**SETTINGS, "kernel": kernel, **settings}),
                                 "--cell-id", name, "--out", str(out), *extra],
                                env=env, stderr=err, stdout=subprocess.DEVNULL)
    return proc, out


def run_client(env, tmp_path, kernel, name, *extra, **settings) -> dict:
    proc, out = start_client(env, tmp_path, kernel, name, *extra, **settings)
    assert proc.wait(180) == 0, (tmp_path / f"{name}.log").read_text()[-2000:]
    return json.loads(out.read_text())


def lane_log(env) -> str:
    path = Path(env["TMPDIR"]) / f"longca-{os.getuid()}" / "workers" / f"{resident.lane_name('cpu', env)}.log"
    return path.read_text()


def test_cells_share_one_measuring_process_until_one_crashes_or_hangs(env, tmp_path):
    rows = [run_client(env, tmp_path, "sdpa", "a"), run_client(env, tmp_path, "sdpa_math", "b"),
            run_client(env, tmp_path, "test_oom", "c")]
    assert [r["status"] for r in rows] == ["ok", "ok", "oom"]
    # An OOM after other cells is tried again in a fresh process (it runs out there too, and says
    # so); that process goes on with the next cell.
    assert rows[2]["reason"].endswith("(also in a fresh measuring process)")
    assert run_client(env, tmp_path, "sdpa", "d")["status"] == "ok"
    assert lane_log(env).count(" started (#") == 2
    crashed = run_client(env, tmp_path, "test_segfault", "e")
    assert crashed["status"] == "error" and "SIGSEGV" in crashed["reason"]
    # The crash's Python stack went to that cell's own log, not the lane's.
    assert "Segmentation fault" in (tmp_path / "e.log").read_text()
    assert run_client(env, tmp_path, "sdpa", "f")["status"] == "ok"
    hung = run_client(env, tmp_path, "test_hang", "g", "--timeout", "2")
    assert hung["status"] == "timeout" and "cell_timeout_s = 2" in hung["reason"]
    after = run_client(env, tmp_path, "sdpa", "h")
    assert after["status"] == "ok" and after["isolation"] == "resident"
    log = lane_log(env)
    assert log.count(" started (#") == 4, log  # the first, after the oom, after the segfault, after the hang
    assert log.count("serving") == 1           # one lane served them all
    for row, name in zip(rows, "abc"):
        assert row["cell_id"] == name and row["fingerprint"]


def test_a_cell_that_raises_past_run_cell_still_ends_as_a_row_with_its_traceback_in_its_log(env, tmp_path):
    """A library that calls sys.exit while loading (SystemExit escapes run_cell's Exception
    handling): the cell's row says so and its own log has the traceback; the next cell runs in a
    fresh measuring process."""
    row = run_client(env, tmp_path, "test_exits", "x")
    assert row["status"] == "error" and "SystemExit: 3" in row["reason"], row["reason"]
    assert "Traceback" in (tmp_path / "x.log").read_text() and "SystemExit" in (tmp_path / "x.log").read_text()
    assert run_client(env, tmp_path, "sdpa", "y")["status"] == "ok"
    assert lane_log(env).count(" started (#") == 2


def test_an_oom_after_other_cells_is_measured_again_in_a_fresh_process(env, tmp_path):
    # An oom in a fresh process is the cell's own: its row stands, and the process goes on.
    first = run_client(env, tmp_path, "test_oom", "oom_first")
    assert first["status"] == "oom" and "fresh" not in first["reason"]
    assert lane_log(env).count(" started (#") == 1
    # test_tight fits alone but not next to what a test_leaky cell leaves behind in its process, as
    # 64K cells on an H100 did not fit next to earlier cells' leftovers.
    assert run_client(env, tmp_path, "test_leaky", "leaky")["status"] == "ok"
    tight = run_client(env, tmp_path, "test_tight", "tight")
    assert tight["status"] == "ok", tight["reason"]
    log = lane_log(env)
    assert "tight ran out of memory after other cells; measuring it again in a fresh measuring process" in log
    assert log.count(" started (#") == 2, log
    assert run_client(env, tmp_path, "sdpa", "after")["status"] == "ok"
    assert lane_log(env).count(" started (#") == 2


def test_what_counts_as_running_out_of_memory():
    # The CPU has no graph capture: the eager fallback's row is checked as cell.py writes it.
    capture_oom = "eager: capture failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert resident.ran_out_of_memory({"status": "oom", "reason": "OutOfMemoryError: ..."})
    assert resident.ran_out_of_memory({"status": "ok", "timed_via": capture_oom})
    assert not resident.ran_out_of_memory({"status": "ok", "timed_via": "graph"})
    assert not resident.ran_out_of_memory({"status": "ok", "timed_via": "eager: capture failed: RuntimeError: x"})
    assert not resident.ran_out_of_memory({"status": "error", "reason": "RuntimeError: boom"})


def test_concurrent_clients_queue_on_the_lane(env, tmp_path):
    procs = [start_client(env, tmp_path, "sdpa", f"q{i}", seqlen=64 * (i + 1)) for i in range(4)]
    for proc, _ in procs:
        assert proc.wait(180) == 0
    rows = [json.loads(out.read_text()) for _, out in procs]
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert [r["seqlen"] for r in rows] == [64, 128, 192, 256]
    assert lane_log(env).count(" started (#") == 1


def test_a_client_that_hangs_up_takes_its_measurement_down(env, tmp_path):
    proc, out = start_client(env, tmp_path, "test_hang", "hung", "--timeout", "300")
    deadline = time.monotonic() + 60
    while "started (#1)" not in (lane_log(env) if _lane_log_exists(env) else "") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the cell is in test_hang's forward by now
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while "ended" not in lane_log(env) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "ended" in lane_log(env)
    assert not out.exists()
    # The next cell gets a fresh measuring process.
    assert run_client(env, tmp_path, "sdpa", "next")["status"] == "ok"
    assert lane_log(env).count(" started (#") == 2


def _lane_log_exists(env) -> bool:
    return (Path(env["TMPDIR"]) / f"longca-{os.getuid()}" / "workers" / f"{resident.lane_name('cpu', env)}.log").exists()
