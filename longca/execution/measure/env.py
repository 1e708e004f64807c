"""The environment a row was measured in: device, driver, CUDA, library versions, host, job."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from typing import Any

import torch

from ... import kernels

# Distribution names of the kernel libraries whose versions every row records.
KERNEL_LIBRARIES = ("flash-attn", "flash-attn-3", "flash-attn-4", "flash-attn-cute", "xformers",
                    "transformer-engine", "transformer-engine-torch", "nvidia-cudnn-frontend", "triton",
                    "magi-attention", "fastvideo-kernel", "flashinfer-python", "flashmask", "paddlepaddle-gpu")


@functools.lru_cache(maxsize=None)
def kernel_calls() -> dict[str, tuple[str, ...]]:
    """What each kernel calls besides torch, as the kernel declares it (``Kernel.libraries``):
    distributions, and "cudnn" for the cuDNN library torch loaded.  A kernel not here calls torch alone."""
    return {name: kernels.get(name).libraries for name in kernels.names() if kernels.get(name).libraries}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def library_versions() -> dict[str, str]:
    versions = {}
    for dist in KERNEL_LIBRARIES:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _version(library: str) -> str | None:
    if library == "cudnn":
        try:
            return str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
        except RuntimeError as exc:  # another cuDNN loaded first: say so in the row, do not die
            return f"unusable ({str(exc).split('.')[0]})"
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def kernel_library(kernel: str) -> str:
    """The libraries ``kernel`` calls, with the versions installed here: "torch 2.11.0+cu130 +
    flash-attn-4 4.0.0b36" (a library that is not installed reads "not installed")."""
    named = [f"torch {torch.__version__}"]
    for library in kernel_calls().get(kernel, ()):
        named.append(f"{library} {_version(library) or 'not installed'}")
    return " + ".join(named)


@functools.lru_cache(maxsize=None)
def _static() -> dict:
    return {
        "hostname": socket.gethostname(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "driver_version": _driver_version() if torch.cuda.is_available() else None,
        "libraries": library_versions(),
        "cpu_name": _cpu_name(),
    }


def collect(device: torch.device) -> dict:
    env = dict(_static())
    env["device_name"] = (torch.cuda.get_device_name(device) if device.type == "cuda" else env["cpu_name"])
    env["cpu_threads"] = torch.get_num_threads()
    env["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    return env


def now_here() -> dict[str, Any]:
    """A measurement's provenance: when (UTC, ISO 8601), on which host, and the host's 1-minute load
    average then."""
    return {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "on": socket.gethostname(),
            "load_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
