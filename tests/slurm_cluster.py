"""A real, tiny SLURM cluster on this machine for the tests: munged, slurmctld and two slurmd daemons
(nodes n1 and n2, each on its own port), started from a config in a temporary directory and
stopped by PID.  Debian's packages are installed on first use (we run as root, as CI does).

No systemd, no containers: ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none`` and no
accounting daemon, so the executor plugin must check job status with ``squeue`` (``MinJobAge``
keeps finished jobs visible long enough for it).

Nothing outside the temporary directory is written: the system's /etc/slurm is never touched, so
two test runs on one host (or a login node's real cluster) cannot collide.  Slurm's commands find
the private config through ``SLURM_CONF``; since the executor plugin strips ``SLURM_*`` variables
from the commands it runs inside a job, ``bin/`` holds one wrapper per Slurm command that sets it
and execs the real command, first on ``PATH`` (the jobs inherit ``PATH``).

``gpus_per_node`` > 0 declares that many GPUs per node as gres, backed by empty files standing in
for /dev/nvidia*: Slurm allocates them and sets ``CUDA_VISIBLE_DEVICES`` in the job.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import closing
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
NODES = ("n1", "n2")
# The commands LongCA, the executor plugin and the tests call inside and outside jobs.
COMMANDS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo", "sacct")


def ensure_installed() -> None:
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, capture_output=True, env=env, timeout=900)
    subprocess.run(["apt-get", "install", "-y", *PACKAGES], check=True, capture_output=True, env=env, timeout=1800)


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path, cpus_per_node: int = 2, gpus_per_node: int = 0, memory_mb: int = 2000,
                 oversubscribe: str = "FORCE:4"):
        self.root = Path(root)
        self.cpus = cpus_per_node
        self.gpus = gpus_per_node
        self.memory_mb = memory_mb
        self.oversubscribe = oversubscribe  # FORCE:n shares nodes whatever a job asks; NO honours --exclusive
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.bin = self.root / "bin"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf),
                    "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}

    def _write_wrappers(self) -> None:
        self.bin.mkdir(parents=True, exist_ok=True)
        for name in COMMANDS:
            real = shutil.which(name, path=os.environ.get("PATH"))
            if real is None:
                continue
            wrapper = self.bin / name
            wrapper.write_text(f'#!/bin/sh\nSLURM_CONF="{self.conf}" exec "{real}" "$@"\n')
            wrapper.chmod(0o755)

    def _write_config(self) -> None:
        host = socket.gethostname()
        ctld_port = _free_port()
        lines = [
            "ClusterName=longca",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={self.root}/state",
            f"SlurmdSpoolDir={self.root}/spool/%n",
            f"SlurmctldPidFile={self.root}/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd.%n.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log",
            f"SlurmdLogFile={self.root}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "ReturnToService=2", "MpiDefault=none", "MinJobAge=600", "SlurmdTimeout=60",
            "KillWait=5", "SchedulerParameters=sched_interval=1",
            # Nodes may declare more CPUs and memory than this machine has (the GPU test's 8-GPU nodes).
            "SlurmdParameters=config_overrides",
        ]
        gres = ""
        if self.gpus:
            lines.append("GresTypes=gpu")
            gres = f" Gres=gpu:{self.gpus}"
            devices = self.root / "dev"
            devices.mkdir(exist_ok=True)
            for i in range(self.gpus):
                (devices / f"nvidia{i}").touch()
            # gres.conf sits beside slurm.conf, where slurmd looks for it.
            (self.root / "gres.conf").write_text(f"Name=gpu File={devices}/nvidia[0-{self.gpus - 1}]\n")
        for name in NODES:
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} "
                         f"CPUs={self.cpus} RealMemory={self.memory_mb}{gres} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP "
                     f"OverSubscribe={self.oversubscribe}")
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        for name in NODES:
            (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> "Cluster":
        ensure_installed()
        self._write_config()
        sock = self.root / "munge.socket"
        self.env["MUNGE_SOCKET"] = str(sock)  # our own munged, never a system one
        self.procs["munged"] = subprocess.Popen(
            ["munged", "-F", "--force", f"--socket={sock}", f"--pid-file={self.root}/munged.pid",
             f"--log-file={self.root}/munged.log", f"--seed-file={self.root}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(lambda: sock.exists(), "munged")
        # Slurm's auth/munge plugin finds the socket through its config, not the environment.
        with open(self.conf, "a") as f:
            f.write(f"AuthInfo=socket={sock}\n")
        self._write_wrappers()
        self.procs["slurmctld"] = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env,
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name in NODES:
            self.procs[name] = subprocess.Popen(["slurmd", "-D", "-N", name, "-f", str(self.conf)], env=self.env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(self._nodes_idle, "slurmd nodes idle", timeout=90)
        return self

    def _nodes_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n, "").startswith(("idle", "mix", "alloc")) for n in NODES)

    def _wait(self, ready, what: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}; logs in {self.root}")
            if ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"{what} not ready after {timeout} s; logs in {self.root}")

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
