"""Forked children that crash, hang or exhaust memory are outcomes, and cells become rows."""

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from longca.execution.processes import isolate, runner
import tiny

SETTINGS = tiny.cell()


def test_value_comes_back():
    out = isolate.call(lambda: {"pid": os.getpid(), "x": [1, 2]})
    assert out.returned and out.value["x"] == [1, 2] and out.value["pid"] != os.getpid()


def test_large_value_comes_back_through_the_pipe():
    out = isolate.call(lambda: "y" * (5 << 20))  # larger than a pipe buffer
    assert out.returned and len(out.value) == 5 << 20


@pytest.mark.parametrize("fn, signum", [(lambda: ctypes.string_at(0), signal.SIGSEGV), (os.abort, signal.SIGABRT)])
def test_death_by_signal(fn, signum):
    out = isolate.call(fn, stdio=(os.open(os.devnull, os.O_WRONLY),) * 2)
    assert not out.returned and out.signal == signum
    assert signal.Signals(signum).name in out.describe()


def test_exit_without_a_value():
    out = isolate.call(lambda: os._exit(3))
    assert out.exit_code == 3 and "status 3" in out.describe()


def test_exception_is_reported_with_its_traceback():
    def boom():
        raise ValueError("nope")

    out = isolate.call(boom)
    assert not out.returned and "ValueError: nope" in out.error


def test_timeout_kills_the_child_and_what_it_started(tmp_path):
    pidfile = tmp_path / "pid"

    def hang():
        helper = subprocess.Popen(["sleep", "300"])
        pidfile.write_text(str(helper.pid))
        threading.Event().wait()

    started = time.monotonic()
    out = isolate.call(hang, timeout_s=1.0)
    assert out.timed_out and 1.0 <= time.monotonic() - started < 60  # not the helper's 300 s
    helper = int(pidfile.read_text())
    time.sleep(0.2)
    # The helper (a grandchild) was killed with the child's process group; reaped by init or a zombie.
    state = open(f"/proc/{helper}/stat").read().split()[2] if os.path.exists(f"/proc/{helper}") else "gone"
    assert state in ("Z", "gone", "X")


def test_abort_fd_stops_the_child():
    r, w = os.pipe()
    threading.Timer(0.5, os.write, (w, b"x")).start()
    out = isolate.call(lambda: threading.Event().wait(), timeout_s=30, abort_fd=r)
    assert out.timed_out and out.wall_s < 5


def test_memory_cap_makes_allocation_fail():
    def allocate():
        try:
            bytearray(128 << 20)
        except MemoryError:
            return "MemoryError"
        return "allocated"

    assert isolate.call(allocate, memory_bytes=32 << 20).value == "MemoryError"
    assert isolate.call(allocate).value == "allocated"


CASES = [  # kernel, limits, status, reason
    ("sdpa", {}, "ok", None),
    ("test_segfault", {}, "error", "SIGSEGV"),
    ("test_abort", {}, "error", "SIGABRT"),
    ("test_hang", {"timeout_s": 1.5}, "timeout", "limits.cell_timeout_s = 1.5 s"),
    ("test_hog", {"memory_mb": 256}, "oom", "can't allocate memory"),
    ("test_hog", {}, "unsupported", "memory cap"),
]

# runner.measure forks: the forking process must not have started OpenMP threads (libgomp is not
# fork-safe), which this pytest process may have, so the cells are measured from a fresh interpreter,
# as `longca run-cell` and the worker do.
MEASURE_CASES = """
import json, os, sys
from longca.execution.processes import runner
devnull = os.open(os.devnull, os.O_WRONLY)
rows = [runner.measure({**settings, "kernel": kernel}, cell_id=f"{kernel}/x", threads=1,
                       limits=runner.Limits(**limits), stdio=(devnull, devnull))
        for kernel, limits, settings in json.load(sys.stdin)]
json.dump(rows, sys.stdout, default=str)
"""


@pytest.fixture(scope="module")
def measured_rows():
    cases = json.dumps([(kernel, limits, SETTINGS) for kernel, limits, _, _ in CASES])
    proc = subprocess.run([sys.executable, "-c", MEASURE_CASES], input=cases, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_each_failure_is_a_row_with_the_cells_identity(measured_rows, case):
    kernel, _, status, reason = CASES[case]
    row = measured_rows[case]
    assert row["status"] == status
    assert reason is None or reason in row["reason"]
    assert (row["kernel"], row["mask"], row["seqlen"], row["cell_id"]) == (kernel, "causal", 64, f"{kernel}/x")
    assert row["fingerprint"] and row["wall_s"] > 0


def test_run_cell_writes_the_row_of_a_crashed_cell(tmp_path):
    out = tmp_path / "cell.json"
    proc = subprocess.run([sys.executable, "-m", "longca", "run-cell", "--settings",
                           json.dumps({**SETTINGS, "kernel": "test_segfault"}), "--isolation", "fork",
                           "--cell-id", "seg", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(out.read_text())
    assert row["status"] == "error" and "SIGSEGV" in row["reason"]
    assert "Segmentation fault" in proc.stderr and "testing.py" in proc.stderr  # the child's traceback


def test_sigkill_not_sent_by_us_reads_as_out_of_memory():
    row = runner.outcome_row({**SETTINGS, "kernel": "sdpa"}, isolate.Outcome(signal=signal.SIGKILL), runner.Limits())
    assert row["status"] == "oom" and "out-of-memory killer" in row["reason"]
