"""The warm worker: thin clients, one worker for many cells, failures still rows, clean shutdown."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from longca.execution.processes import worker
import tiny

SETTINGS = tiny.cell()


@pytest.fixture
def env():
    """An environment with a worker key of its own (LONGCA_* variables are part of the key); the
    worker exits by itself after 3 idle seconds."""
    return dict(os.environ, LONGCA_TEST_RUN=uuid.uuid4().hex, LONGCA_WORKER_IDLE_S="3")


def client(env, tmp_path, kernel, name, *extra):
    out = tmp_path / f"{name}.json"
    err = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "longca", "run-cell", "--isolation", "worker", "--threads", "1",
                             "--settings", json.dumps({**SETTINGS, "kernel": kernel}), "--cell-id", name,
                             "--out", str(out), *extra], env=env, stderr=err, stdout=subprocess.DEVNULL)
    return proc, out


def worker_processes(env) -> list[int]:
    """Pids of the worker and everything it forked (they share its command line)."""
    sock = str(worker.runtime_dir() / f"{worker.worker_key(env)}.sock")
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue
        if sock.encode() in cmd and state != "Z":
            pids.append(int(pid))
    return pids


def test_concurrent_clients_share_one_worker_and_failures_are_rows(env, tmp_path):
    kernels = ["sdpa", "sdpa_math", "test_segfault", "test_hang", "sdpa"]
    procs = [client(env, tmp_path, k, f"c{i}", "--timeout", "2") for i, k in enumerate(kernels)]
    for proc, _ in procs:
        assert proc.wait(120) == 0, (tmp_path / "c0.log").read_text()[-2000:]
    rows = [json.loads(out.read_text()) for _, out in procs]
    assert [r["status"] for r in rows] == ["ok", "ok", "error", "timeout", "ok"]
    assert "SIGSEGV" in rows[2]["reason"]
    # The crashed child's traceback reached the client's own stderr (its Snakemake log).
    assert "Segmentation fault" in (tmp_path / "c2.log").read_text()
    log = worker.runtime_dir() / f"{worker.worker_key(env)}.log"
    assert log.read_text().count("serving") == 1  # five clients, one worker started
    assert len(worker_processes(env)) == 1       # no handler or child left behind


def test_a_client_that_hangs_up_takes_its_measurement_down(env, tmp_path):
    proc, out = client(env, tmp_path, "test_hang", "hung", "--timeout", "300")
    deadline = time.monotonic() + 60
    while len(worker_processes(env)) < 3 and time.monotonic() < deadline:  # worker, handler, child
        time.sleep(0.1)
    assert len(worker_processes(env)) == 3
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while len(worker_processes(env)) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(worker_processes(env)) == 1
    assert not out.exists()


def test_worker_key_follows_environment_and_ignores_the_idle_setting():
    base = {"PATH": "/bin"}
    assert worker.worker_key(base) == worker.worker_key({**base, "LONGCA_WORKER_IDLE_S": "5", "HOME": "/x"})
    assert worker.worker_key(base) != worker.worker_key({**base, "LONGCA_TEST_KERNELS": "1"})
    assert worker.worker_key(base) != worker.worker_key({**base, "CUDA_VISIBLE_DEVICES": "1"})


def test_a_worker_scoped_to_a_job_ends_with_the_job_taking_its_measurement_down(env, tmp_path):
    """In a cluster job the worker names the job's Snakemake as its anchor (LONGCA_JOB_SCOPE): when
    that process ends, the worker, its handler and the measuring child all end, even with the
    cell's client still waiting (SLURM normally kills the client too)."""
    from longca.execution.processes import job_scope

    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        scope = f"77:{anchor.pid}:{job_scope._start_ticks(anchor.pid)}"
        env = {**env, job_scope.ENV: scope, "LONGCA_WORKER_IDLE_S": "300"}
        proc, out = client(env, tmp_path, "test_hang", "scoped", "--timeout", "300")
        deadline = time.monotonic() + 60
        while len(worker_processes(env)) < 3 and time.monotonic() < deadline:  # worker, handler, child
            time.sleep(0.1)
        assert len(worker_processes(env)) == 3
        log = worker.runtime_dir() / f"{worker.worker_key(env)}.log"
        assert f"ends with job scope {scope}" in log.read_text()
    finally:
        anchor.kill()
        anchor.wait()
    deadline = time.monotonic() + 10
    while worker_processes(env) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker_processes(env) == []
    assert proc.wait(30) == 2 and not out.exists()  # the machinery ended, not the cell: no row
    assert f"job scope {scope} ended" in log.read_text()
