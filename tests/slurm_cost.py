"""What a kernel cell costs in a SLURM group job against what its measurement takes, on the real
private cluster of ``tests/slurm_cluster.py`` (one CPU node, one job at a time), for one or more
commits side by side:

    python tests/slurm_cost.py OUT_DIR REV [REV ...]     (REV ``.``: this working tree)

For each commit: its tracked tree (``git archive``) in ``OUT_DIR/<rev>``, the kernel cells of the
default CPU grid (``config/config.yaml``: 2 kernels × 4 masks × 3 lengths × fwd/bwd = 48 cells, 6
jobs of 8; no CP cells), ``snakemake --profile slurm all`` against a fresh cluster.  Per kernel-cell job: its time (``scontrol``'s
StartTime → EndTime, whole seconds) over its cells, and the cells' measuring time (each row's
``wall_s``: the cell's build, gate and timing in its measuring process).  Prints one line per
commit and writes ``OUT_DIR/cost.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GRID = {
    "cp_strategies": [],
    # One node of this machine's 2 cores, alone: one job at a time, each cell with both cores.
    "slurm_cpus_per_cell": 2, "slurm_mem_mb_per_cell": 1500, "slurm_exclusive": True,
}


def _checkout(rev: str, dest: Path) -> None:
    """The commit's tree, or for ``.`` this working tree's files (tracked and new, not ignored)."""
    dest.mkdir(parents=True)
    if rev == ".":
        files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.split()
        archive = subprocess.run(["tar", "-c", "--no-recursion", *[f for f in files if os.path.lexists(REPO / f)]],
                                 cwd=REPO, capture_output=True, check=True).stdout
    else:
        archive = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    config = dest / "config" / "config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), **GRID}))


def _jobs(env) -> list[dict]:
    out = subprocess.run(["scontrol", "show", "job", "-o"], env=env, capture_output=True, text=True).stdout
    return [dict(tok.split("=", 1) for tok in line.split() if "=" in tok) for line in out.splitlines() if "JobId=" in line]


def _t(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp).timestamp()


def cost(rev: str, out: Path, n: int) -> dict:
    work = out / f"{n}_{rev.replace('/', '_') if rev != '.' else 'worktree'}"
    _checkout(rev, work)
    cluster = Cluster(out / f"cluster_{work.name}", cpus_per_node=2, memory_mb=2000,
                      oversubscribe="NO", nodes=("n1",))
    try:
        cluster.start()
        env = {**cluster.env, "PATH": os.path.dirname(sys.executable) + os.pathsep + cluster.env["PATH"]}
        env.pop("PYTHONPATH", None)  # the checkout's own package, not this one's
        started = time.monotonic()
        run = subprocess.run(["snakemake", "--profile", "slurm", "all"], cwd=work, env=env, capture_output=True,
                             text=True, timeout=3600)
        total = time.monotonic() - started
        if run.returncode:
            raise SystemExit(f"{rev}: snakemake failed:\n{(run.stdout + run.stderr)[-4000:]}")
        jobs = [j for j in _jobs(env) if "kernel_cell" in j.get("Comment", "")]
    finally:
        cluster.stop()
    rows = [json.loads(p.read_text()) for p in (work / "results" / "cells" / "kernels").glob("**/*.json")]
    per_job = []
    for job in jobs:
        cells = [r for r in rows if str(r.get("slurm_job_id")) == job["JobId"]]
        per_job.append({"job": job["JobId"], "cells": len(cells), "job_s": _t(job["EndTime"]) - _t(job["StartTime"]),
                        "measure_s": sum(r["wall_s"] for r in cells),
                        "isolation": sorted({r.get("isolation") for r in cells})})
    n = sum(j["cells"] for j in per_job)
    result = {"rev": rev, "commit": subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True,
                                                   text=True).stdout.strip(),
              "cells": n, "run_s": total, "jobs": per_job,
              "job_s_per_cell": sum(j["job_s"] for j in per_job) / n,
              "measure_s_per_cell": sum(j["measure_s"] for j in per_job) / n,
              "statuses": sorted({r["status"] for r in rows}), "load": os.getloadavg()}
    result["ratio"] = result["job_s_per_cell"] / result["measure_s_per_cell"]
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("revs", nargs="+")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n, rev in enumerate(args.revs):
        r = cost(rev, args.out.resolve(), n)
        results.append(r)
        print(f"{r['rev']} ({r['commit']}): {r['cells']} cells in {len(r['jobs'])} jobs, run {r['run_s']:.0f} s; "
              f"job {r['job_s_per_cell']:.1f} s/cell, measuring {r['measure_s_per_cell']:.1f} s/cell, "
              f"ratio {r['ratio']:.2f}; isolation {sorted({i for j in r['jobs'] for i in j['isolation']})}; "
              f"statuses {r['statuses']}; load {r['load'][0]:.1f}", flush=True)
    (args.out / "cost.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
