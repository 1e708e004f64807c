"""The environment a row was measured in: device, driver, CUDA, library versions, host, job."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess

import torch

# Distribution names of the kernel libraries whose versions every row records.
KERNEL_LIBRARIES = ("flash-attn", "flash-attn-3", "flash-attn-cute", "xformers", "transformer-engine",
                    "nvidia-cudnn-frontend", "triton")


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
