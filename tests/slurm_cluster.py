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

``gpus_per_node`` > 0 declares that many GPUs per node as gres, backed by character devices (major
195, made with mknod in the cluster's folder) standing in for /dev/nvidia*: Slurm allocates them
and sets ``CUDA_VISIBLE_DEVICES`` in the job.  On a GPU
machine ``gpu_files`` names the real devices instead, shared out in order, the same number to each
node (``--nodes 2`` on a 4-GPU host: n1 has /dev/nvidia0-1, n2 /dev/nvidia2-3; two "nodes" of one
host, as a cluster's nodes would be, with the GPUs of one never handed to the other).

Run as a script, it starts a cluster, runs one command against it and stops it (the command's exit
code is the script's), e.g. the README's SLURM command on a one-node cluster of a GPU machine:

    python tests/slurm_cluster.py ROOT --nodes 1 --cpus 16 --memory-mb 120000 --gpu-files /dev/nvidia0 \
        -- snakemake --profile slurm all --configfile config/gpu.yaml --config gpus=1 ranks_per_node=1
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
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


def _stand_in_gpu(path: Path, minor: int) -> None:
    """A character device numbered as NVIDIA's (major 195), in the cluster's own folder: slurmd takes
    only character or block devices as gres files (an empty file makes it refuse the node's GPUs, so
    no job would get CUDA_VISIBLE_DEVICES).  Nothing opens it: these nodes have no GPU behind it."""
    if path.exists():
        path.unlink()
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(195, minor))
    except PermissionError as exc:
        raise RuntimeError(f"cannot make the stand-in GPU device {path} (mknod needs root): {exc}") from None


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path, cpus_per_node: int = 2, gpus_per_node: int = 0, memory_mb: int = 2000,
                 oversubscribe: str = "FORCE:4", nodes: tuple[str, ...] = NODES, gpu_files: list[str] = (),
                 without_systemd: bool = False):
        self.root = Path(root)
        self.cpus = cpus_per_node
        self.gpu_files = list(gpu_files)
        self.nodes = tuple(nodes)
        if len(self.gpu_files) % len(self.nodes):
            raise ValueError(f"{len(self.gpu_files)} GPU devices do not share out evenly over {len(self.nodes)} nodes")
        self.gpus = len(self.gpu_files) // len(self.nodes) or gpus_per_node
        self.without_systemd = without_systemd
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
            files = self.gpu_files
            if not files:
                devices = self.root / "dev"
                devices.mkdir(exist_ok=True)
                for i in range(self.gpus):
                    _stand_in_gpu(devices / f"nvidia{i}", i)
                files = [str(devices / f"nvidia{i}") for i in range(self.gpus)] * len(self.nodes)
            # gres.conf sits beside slurm.conf, where every slurmd looks for it; each node its own devices.
            (self.root / "gres.conf").write_text("".join(
                f"NodeName={node} Name=gpu File={f}\n"
                for n, node in enumerate(self.nodes) for f in files[n * self.gpus:(n + 1) * self.gpus]))
            if self.gpu_files and len(self.nodes) > 1:
                lines.append(f"TaskProlog={self._write_device_map()}")
        for name in self.nodes:
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} "
                         f"CPUs={self.cpus} RealMemory={self.memory_mb}{gres} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP "
                     f"OverSubscribe={self.oversubscribe}")
        if self.without_systemd:
            # A machine with cgroup v2 but no systemd or D-Bus (a bare VM or container): slurmd makes its
            # cgroup scope itself instead of asking systemd, which it otherwise cannot start without.
            (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n")
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        for name in self.nodes:
            (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def _write_device_map(self) -> Path:
        """Slurm (without device cgroups) sets ``CUDA_VISIBLE_DEVICES`` to the allocated GPUs' places in
        the *node's* list (n2's first GPU is 0), which on a real cluster is that node's own GPU.  Here
        the nodes share one host, so a task prolog turns those places into the node's devices
        (/dev/nvidia2 → 2), in PCI order as nvidia-smi numbers them: each node's jobs get its GPUs."""
        cases = []
        for n, node in enumerate(self.nodes):
            minors = [str(os.minor(os.stat(f).st_rdev)) for f in self.gpu_files[n * self.gpus:(n + 1) * self.gpus]]
            cases.append(f'  {node}) set -- {" ".join(minors)} ;;')
        script = self.root / "task_prolog.sh"
        script.write_text("\n".join([
            "#!/bin/sh",
            "# Written by tests/slurm_cluster.py: node-local GPU places -> this node's devices (see there).",
            '[ -n "$CUDA_VISIBLE_DEVICES" ] || exit 0',
            'case "$SLURMD_NODENAME" in', *cases, "  *) exit 0 ;;", "esac",
            'out=""',
            'for place in $(echo "$CUDA_VISIBLE_DEVICES" | tr , " "); do',
            '  eval "dev=\\${$((place + 1))}"',
            '  out="${out:+$out,}$dev"',
            "done",
            'echo "export CUDA_DEVICE_ORDER=PCI_BUS_ID"',
            'echo "export CUDA_VISIBLE_DEVICES=$out"', ""]))
        script.chmod(0o755)
        return script

    def start(self) -> "Cluster":
        ensure_installed()
        self._write_config()
        sock = self.root / "munge.socket"
        self.env["MUNGE_SOCKET"] = str(sock)  # our own munged, never a system one
        key = self.root / "munge.key"  # and its own key: a machine may have none (or a real cluster's)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.procs["munged"] = subprocess.Popen(
            ["munged", "-F", "--force", f"--socket={sock}", f"--pid-file={self.root}/munged.pid",
             f"--log-file={self.root}/munged.log", f"--seed-file={self.root}/munged.seed", f"--key-file={key}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(lambda: sock.exists(), "munged")
        # Slurm's auth/munge plugin finds the socket through its config, not the environment.
        with open(self.conf, "a") as f:
            f.write(f"AuthInfo=socket={sock}\n")
        self._write_wrappers()
        self.procs["slurmctld"] = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env,
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name in self.nodes:
            self.procs[name] = subprocess.Popen(["slurmd", "-D", "-N", name, "-f", str(self.conf)], env=self.env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(self._nodes_idle, "slurmd nodes idle", timeout=90)
        return self

    def _nodes_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n, "").startswith(("idle", "mix", "alloc")) for n in self.nodes)

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Start a private Slurm cluster, run one command against it, stop it.")
    ap.add_argument("root", type=Path, help="a folder for the cluster's config, state and logs")
    ap.add_argument("--nodes", type=int, default=len(NODES), help="slurmd daemons (nodes n1, n2, ...)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs each node declares")
    ap.add_argument("--memory-mb", type=int, default=2000, help="memory each node declares")
    ap.add_argument("--gpus", type=int, default=0, help="stand-in GPUs per node (empty files)")
    ap.add_argument("--gpu-files", nargs="*", default=[],
                    help="real GPU devices (/dev/nvidia0 ...), shared out in order, as many to each node")
    ap.add_argument("--without-systemd", action="store_true",
                    help="cgroup v2 without systemd/D-Bus: slurmd makes its cgroup scope itself")
    ap.add_argument("--oversubscribe", default="NO", help="the partition's OverSubscribe (NO honours --exclusive)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        ap.error("no command: give it after --")
    split = argv.index("--")
    args, command = ap.parse_args(argv[:split]), argv[split + 1:]
    args.root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.root.resolve(), cpus_per_node=args.cpus, gpus_per_node=args.gpus,
                      memory_mb=args.memory_mb, oversubscribe=args.oversubscribe,
                      nodes=tuple(f"n{i + 1}" for i in range(args.nodes)), gpu_files=args.gpu_files,
                      without_systemd=args.without_systemd)
    try:
        cluster.start()
        print(f"slurm_cluster: {args.nodes} node(s) up; config {cluster.conf}", file=sys.stderr, flush=True)
        return subprocess.run(command, env=cluster.env).returncode
    finally:
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
