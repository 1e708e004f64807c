"""GPU slots on one machine: each concurrently running GPU cell gets a device of its own.

Snakemake decides how many GPU cells run at once (threads/resources); this module decides which
device each one gets.  Slot ``i`` is an exclusive ``flock`` on ``slot-<i>.lock`` in a per-user
directory shared by every LongCA process on the host (two workflow runs in different directories
still never share a GPU).  The kernel drops an flock when its process dies, so a killed cell never
leaves a slot taken.  The holder runs its measurement with ``CUDA_VISIBLE_DEVICES`` set to the
slot's device before CUDA is initialised.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def default_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"longca-{os.getuid()}" / "gpu-slots"


def visible_devices(count: int = 0, environ: dict | None = None) -> list[str]:
    """The devices cells may use: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi``'s GPUs.

    ``count`` > 0 keeps only the first ``count`` of them (config key ``gpus``)."""
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        devices = [d.strip() for d in listed.split(",") if d.strip()]
    else:
        devices = [str(i) for i in range(_nvidia_smi_count())]
    return devices[:count] if count > 0 else devices


def _nvidia_smi_count() -> int:
    # nvidia-smi, not torch.cuda: the caller may be about to fork, and CUDA must stay uninitialised.
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


@dataclass
class Slot:
    index: int
    device: str
    _fd: int

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _open_lock(lock_dir: Path, device: str) -> int:
    # Keyed by device, not index: runs that see different CUDA_VISIBLE_DEVICES still exclude each other.
    name = device.replace("/", "_")  # MIG ids contain slashes
    return os.open(lock_dir / f"slot-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)


def _held(fd: int, index: int, device: str) -> Slot:
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a human looking
    return Slot(index, device, fd)


def acquire(devices: list[str], *, lock_dir: Path | None = None, timeout_s: float | None = None,
            poll_s: float = 0.005) -> Slot:
    """Take a free slot (blocking until one is free); raise TimeoutError after ``timeout_s``.

    One device and no timeout: a blocking lock, so the next waiting cell starts the moment the last
    one lets go (resident lanes keep clients queued on it).  Several: slots are tried starting at a
    pid-dependent index so concurrent starters spread out instead of all contending for slot 0."""
    if not devices:
        raise ValueError("no GPU to give a slot on: CUDA_VISIBLE_DEVICES is empty and nvidia-smi lists none")
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    if len(devices) == 1 and timeout_s is None:
        fd = _open_lock(lock_dir, devices[0])
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _held(fd, 0, devices[0])
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    start = os.getpid() % len(devices)
    while True:
        for k in range(len(devices)):
            i = (start + k) % len(devices)
            fd = _open_lock(lock_dir, devices[i])
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return _held(fd, i, devices[i])
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no free GPU slot among devices {devices} after {timeout_s} s")
        time.sleep(poll_s)


def acquire_all(devices: list[str], *, lock_dir: Path | None = None) -> list[Slot]:
    """Every slot of ``devices``, blocking, in a fixed order (a CP cell's GPUs).  Cells hold one slot
    at a time, and multi-slot holders take them in the same order, so nobody waits in a cycle."""
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    slots = []
    for i, device in sorted(enumerate(devices), key=lambda pair: pair[1]):
        fd = _open_lock(lock_dir, device)
        fcntl.flock(fd, fcntl.LOCK_EX)
        slots.append(_held(fd, i, device))
    return slots


def acquire_set(devices: list[str], size: int, *, lock_dir: Path | None = None, poll_s: float = 0.05) -> list[Slot]:
    """The slots of ``size`` devices free together, blocking until some are: the aligned groups
    (devices 0-1, 2-3, ... for size 2) are tried in turn, each all or nothing, so two cp_size-2
    cells run at once on a 4-GPU host and nobody holds part of a group while waiting for the rest."""
    if size > len(devices):
        raise ValueError(f"{size} GPUs asked for, {len(devices)} visible ({', '.join(devices) or 'none'})")
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    groups = [devices[i:i + size] for i in range(0, len(devices) - size + 1, size)]
    while True:
        for group in groups:
            held: list[Slot] = []
            for i, device in enumerate(group):
                fd = _open_lock(lock_dir, device)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    break
                held.append(_held(fd, i, device))
            if len(held) == size:
                return held
            for slot in held:
                slot.release()
        time.sleep(poll_s)
