"""A warm worker per machine: imports torch once, forks one isolated child per cell.

Without it every cell is a fresh ``python -m longca run-cell`` that imports torch (1-2 s), which
dominates a grid of small cells.  With it, ``run-cell --isolation worker`` is a thin client that
never imports torch: it connects to a Unix socket, hands over the cell's settings and its own
stdout/stderr (so the cell's log still gets the child's output), and writes the row it gets back.

The worker (``longca worker``) is started by the first client that finds none, under a file lock so
concurrent clients start exactly one.  Its socket name is a hash of the interpreter, the package's
source files and the ``LONGCA_*`` environment: editing any LongCA file makes the next cell start a
fresh worker, so a forked child never runs stale code.  Per request the worker forks a handler,
which runs ``longca.execution.processes.runner.measure`` (another fork: the measurement child, with the time limit and
memory cap) and replies; a client that hangs up (e.g. a killed Snakemake) kills its measurement.
The worker exits after ``LONGCA_WORKER_IDLE_S`` seconds (default 120) without requests.  It runs
on the node its first client ran on (socket under the node-local temp dir), so in a SLURM job
that holds a group of cells the cells share one worker; there it is scoped to the job
(``LONGCA_JOB_SCOPE``, ``longca.execution.processes.job_scope``): a worker of its own, which exits
as soon as the job's Snakemake process is gone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..cache import compile_cache, store
from . import job_scope
from .wire import recv_msg, send_msg

PACKAGE = Path(__file__).resolve().parents[2]  # longca/: a worker serves the code of the whole package
START_TIMEOUT_S = 180.0   # importing torch on a busy node can be slow
DEFAULT_IDLE_S = 120.0
# LONGCA_* variables that do not change what a cell computes: how long a server idles, where a run's
# progress lines go (longca.execution.processes.progress), which store a run keeps its parts in (sent with each
# cell, longca.execution.cache.store).  Every other LONGCA_* variable names a server of its own.
NOT_IN_KEY = frozenset({"LONGCA_WORKER_IDLE_S", "LONGCA_PROGRESS_DIR", "LONGCA_PROGRESS_EVERY_S", "LONGCA_STORE"})
# Other variables a server is started with and keeps: where its modules come from, which GPUs it sees,
# and where its compilers keep what they compile (a process reads them once; a run in another
# directory gets servers of its own, compiling into its own results/compile_cache).
IN_KEY = frozenset({"PYTHONPATH", "CUDA_VISIBLE_DEVICES", *compile_cache.FOLDERS})


class WorkerError(RuntimeError):
    """The worker machinery (not a cell) failed: the job fails rather than caching a bogus row."""


# ---------------------------------------------------------------- naming

def _source_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(PACKAGE)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def worker_key(environ: dict | None = None) -> str:
    environ = os.environ if environ is None else environ
    h = hashlib.sha256()
    h.update(sys.executable.encode())
    h.update(str(PACKAGE).encode())
    h.update(_source_digest().encode())
    for name in sorted(environ):
        if name.startswith("LONGCA_") and name not in NOT_IN_KEY or name in IN_KEY:
            h.update(f"{name}={environ[name]}\0".encode())
    return h.hexdigest()[:20]


def runtime_dir() -> Path:
    # Node-local and private: Unix socket paths must be short (< 108 bytes) and not on NFS.
    path = Path(tempfile.gettempdir()) / f"longca-{os.getuid()}" / "workers"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


# ---------------------------------------------------------------- client

def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _start(key: str) -> socket.socket:
    """Connect to the worker for ``key``, starting it if there is none (exactly one, under a lock)."""
    return start_server(key, ["worker"])


def start_server(name: str, command: list[str]) -> socket.socket:
    """Connect to the server ``name`` (a socket in the runtime dir), starting ``longca <command>
    --socket <path>`` if none answers: exactly one, under a lock, in a session of its own so that it
    outlives this client and its Snakemake job.  The warm worker and the resident lanes
    (``longca.execution.processes.resident``) are started this way."""
    rdir = runtime_dir()
    sock_path, log_path = rdir / f"{name}.sock", rdir / f"{name}.log"
    sock = _connect(sock_path)
    if sock:
        return sock
    with open(rdir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(sock_path)  # another client may have started it while we waited
        if sock:
            return sock
        sock_path.unlink(missing_ok=True)  # a dead server's socket
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "longca", *command, "--socket", str(sock_path)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd="/",
                                    start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _connect(sock_path)
            if sock:
                return sock
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = log_path.read_text(errors="replace")[-2000:]
        raise WorkerError(f"the LongCA {command[0]} did not start (exit status {proc.poll()}); "
                          f"log {log_path}:\n{tail}")


def prestart(name: str, command: list[str]) -> threading.Thread:
    """Start the server ``name`` now, in a background thread of this process, for clients to come:
    a cluster job's Snakemake does so while it builds its DAG, so the worker imports torch meanwhile.
    The first client waits on the start lock, then connects; one that finds the server up uses it."""
    def run() -> None:
        try:
            start_server(name, command).close()  # the server takes a connection without a message as a probe
        except Exception as exc:  # noqa: BLE001 — the first client starts it again and says why it fails
            print(f"LongCA: could not start the {command[0]} ahead of the cells: {exc}", file=sys.stderr)

    thread = threading.Thread(target=run, name=f"longca-prestart-{command[0]}", daemon=True)
    thread.start()
    return thread


def request(settings: dict[str, Any], *, cell_id: str, threads: int, timeout_s: float | None,
            memory_mb: int | None, gpus: int) -> dict[str, Any]:
    """Measure one cell in the warm worker; returns its row.  Never imports torch."""
    sock = _start(worker_key())
    with sock:
        send_msg(sock, {"settings": settings, "cell_id": cell_id, "threads": threads,
                         "timeout_s": timeout_s, "memory_mb": memory_mb, "gpus": gpus,
                         "store": store.root_from_env()},
                  fds=[sys.stdout.fileno(), sys.stderr.fileno()])
        try:
            reply, _ = recv_msg(sock)
        except (ConnectionError, OSError) as exc:
            raise WorkerError(f"the LongCA worker's handler for {cell_id} died without a reply: {exc}") from exc
    return reply


# ---------------------------------------------------------------- server

def _handle(conn: socket.socket) -> None:
    from .runner import Limits, measure

    try:
        msg, fds = recv_msg(conn, max_fds=2)
    except ConnectionError:
        return  # a probe (``prestart``): connected, sent nothing
    limits = Limits(timeout_s=msg["timeout_s"], memory_mb=msg["memory_mb"], gpus=msg["gpus"])
    stdio = (fds[0], fds[1]) if len(fds) == 2 else None
    row = measure(msg["settings"], cell_id=msg["cell_id"], threads=msg["threads"], limits=limits,
                  stdio=stdio, abort_fd=conn.fileno(), store_root=msg.get("store"))  # readable = the client hung up
    send_msg(conn, row)


def serve(sock_path: str, idle_s: float | None = None) -> int:
    idle_s = float(os.environ.get("LONGCA_WORKER_IDLE_S", DEFAULT_IDLE_S)) if idle_s is None else idle_s
    from .runner import preload, warm_fingerprints

    preload()
    warm_fingerprints()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(128)
    server.settimeout(0.5)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    handlers: set[int] = set()
    unlinked = False
    last_active = time.monotonic()
    scope = job_scope.current()
    print(f"longca worker {os.getpid()} serving {sock_path} (idle exit after {idle_s:g} s"
          f"{f'; ends with job scope {scope}' if scope else ''})", flush=True)
    try:
        while True:
            for pid in list(handlers):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    handlers.discard(pid)
                    last_active = time.monotonic()
            if scope and not job_scope.alive(scope):
                # The job ended: its cells' clients are gone, so are their handlers' measurements
                # (each handler dies with this process, each measurement with its handler).
                print(f"longca worker {os.getpid()}: job scope {scope} ended; exiting", flush=True)
                return 0
            if not handlers and time.monotonic() - last_active > idle_s:
                break
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            last_active = time.monotonic()
            handlers.add(_fork_handler(server, conn))
        # Unlink first, so new clients start a fresh worker; then serve whoever connected meanwhile.
        Path(sock_path).unlink(missing_ok=True)
        unlinked = True
        server.setblocking(False)
        while True:
            try:
                conn, _ = server.accept()
            except BlockingIOError:
                break
            handlers.add(_fork_handler(server, conn))
        for pid in handlers:
            os.waitpid(pid, 0)
        return 0
    finally:
        if not unlinked:  # after unlinking, the path may already be a successor's socket
            Path(sock_path).unlink(missing_ok=True)
        server.close()


def _fork_handler(server: socket.socket, conn: socket.socket) -> int:
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            job_scope.die_with_parent(worker)
            server.close()
            conn.setblocking(True)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _handle(conn)
        except BaseException:  # noqa: BLE001 — the client sees no reply and fails its job
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    conn.close()
    return pid
