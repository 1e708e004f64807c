"""Running the real Snakemake on a config in a temporary directory (shared by the workflow tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CELL_OUTPUT = re.compile(r"^\s+output: (results/cells/\S+\.json)", re.M)


def command(workdir: Path, *args: str, snakefile: Path | None = None, cores: int = 2) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(snakefile or REPO / "Snakefile"), "--directory",
            str(workdir), "--configfile", str(workdir / "config.yaml"), "--cores", str(cores), *args]


def snakemake(workdir: Path, *args: str, snakefile: Path | None = None, cores: int = 2,
              timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command(workdir, *args, snakefile=snakefile, cores=cores),
                          capture_output=True, text=True, timeout=timeout)


def write_config(workdir: Path, config: dict) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))


def planned_cells(workdir: Path, **kw) -> set[str]:
    """The cell files a dry run says it would (re)compute."""
    proc = snakemake(workdir, "-n", "all", **kw)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return set(CELL_OUTPUT.findall(proc.stdout + proc.stderr))


def cell_files(workdir: Path) -> dict[str, int]:
    """Every finished cell file and its mtime in ns."""
    root = workdir / "results" / "cells"
    return {str(p.relative_to(workdir)): p.stat().st_mtime_ns for p in root.rglob("*.json")} if root.exists() else {}


def run_script(script: Path, *args: str, env: dict | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """A bash script of scripts/ as a user runs it, with this interpreter as its ``$PYTHON``."""
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})
