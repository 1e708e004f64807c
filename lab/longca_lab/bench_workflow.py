"""How much the workflow machinery costs per cell, and how long a dry run of a large grid takes.

    python lab/longca_lab/bench_workflow.py cells     # run-cell: fresh process per cell vs the warm worker
    python lab/longca_lab/bench_workflow.py workflow  # whole snakemake runs, marginal cost per cell
    python lab/longca_lab/bench_workflow.py dryrun    # snakemake -n on a 10,000-cell grid

Cells are tiny (seqlen 64, 2 heads, head_dim 16, 1 rep) so the numbers are the machinery, not the
kernel.  Results go in lab/data/workflow_cost_2026-11-22.md, with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CELL = {"kernel": "sdpa", "mask": "causal", "seqlen": 64, "direction": "fwd", "dtype": "float32", "batch": 1,
        "heads_q": 2, "heads_kv": 2, "head_dim": 16, "gate_seqlen": 64, "warmup": 0, "reps": 1,
        "device": "cpu"}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def bench_cells(n: int) -> None:
    """Sequential run-cell calls; overhead = client wall time − the child's own measurement time."""
    env = dict(os.environ, LONGCA_BENCH=uuid.uuid4().hex)  # a worker of our own (cold at first)
    with tempfile.TemporaryDirectory() as tmp:
        print("| isolation | cells | wall per cell (s) | measurement per cell (s) | overhead per cell (s) |")
        print("| --- | --- | --- | --- | --- |")
        for isolation in ("fork", "worker"):
            walls, measured = [], []
            for i in range(n + 1):  # the first worker call starts the worker: reported apart
                out = Path(tmp) / f"{isolation}{i}.json"
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "longca", "run-cell", "--settings", json.dumps(CELL),
                                "--threads", "1", "--isolation", isolation, "--out", str(out)],
                               env=env, check=True, capture_output=True)
                wall = time.perf_counter() - t
                if i == 0:
                    if isolation == "worker":
                        print(f"| worker start (first cell) | 1 | {wall:.2f} | | |")
                    continue
                walls.append(wall)
                measured.append(json.loads(out.read_text())["wall_s"])
            w, m = statistics.median(walls), statistics.median(measured)
            print(f"| {isolation} | {n} | {w:.3f} | {m:.3f} | {w - m:.3f} |")


def _grid_config(cells: int, isolation: str) -> dict:
    return {"device": "cpu", "threads": 1, "kernels": ["sdpa"], "masks": ["causal"],
            "seqlens": [64 * (i + 1) for i in range(cells)], "directions": ["fwd"], "dtypes": ["float32"],
            "heads_q": 2, "heads_kv": 2, "head_dim": 16, "gate_seqlen": 64,
            "timing": {"warmup": 0, "reps": 1}, "isolation": isolation}


def _snakemake(workdir: Path, *args: str, cores: int) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                    "--configfile", str(workdir / "config.yaml"), "--cores", str(cores), *args],
                   check=True, capture_output=True)
    return time.perf_counter() - t


def bench_workflow(sizes: list[int], cores: int) -> None:
    """Whole `snakemake all` runs; the marginal cost per cell is the slope between grid sizes."""
    print("| isolation | cells | snakemake all (s) | marginal per cell (s) |")
    print("| --- | --- | --- | --- |")
    for isolation in ("fork", "worker"):
        times = []
        for n in sizes:
            with tempfile.TemporaryDirectory() as tmp:
                workdir = Path(tmp)
                (workdir / "config.yaml").write_text(yaml.safe_dump(_grid_config(n, isolation)))
                times.append(_snakemake(workdir, "all", cores=cores))
        slope = (times[-1] - times[0]) / (sizes[-1] - sizes[0])
        for n, t in zip(sizes, times):
            print(f"| {isolation} | {n} | {t:.1f} | {slope:.3f} |")


def dryrun_config() -> dict:
    """10,000 cells: 5 kernels × 10 masks × 25 seqlens × 2 directions × 4 dtypes."""
    masks = ["full", "causal", "sliding_window", "sliding_window_causal", "varlen_full", "varlen_causal",
             "prefix_lm_causal", "shared_question", "causal_blockwise", "global_sliding_window"]
    return {"device": "cpu", "kernels": ["sdpa", "sdpa_math", "flex", "test_wrong", "test_sleep"],
            "masks": masks, "seqlens": [1024 * (i + 1) for i in range(25)], "directions": ["fwd", "bwd"],
            "dtypes": ["float32", "bfloat16", "float16", "float64"]}


TRIVIAL_SNAKEFILE = """
rule all:
    input: expand("out/{i}.txt", i=range(10000))
rule cell:
    output: "out/{i}.txt"
    shell: "touch {output}"
"""


def bench_dryrun(repeats: int) -> None:
    """LongCA's 10,000-cell dry run next to a trivial 10,000-job Snakefile (Snakemake's own floor),
    timed in the same session: the box may be shared, so the ratio means more than the seconds."""
    config = dryrun_config()
    cells = (len(config["kernels"]) * len(config["masks"]) * len(config["seqlens"]) * len(config["directions"])
             * len(config["dtypes"]))
    print(f"load average before: {os.getloadavg()[0]:.2f}\n")
    print(f"| workflow | jobs | command | median of {repeats} (s) | min (s) |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "longca"
        workdir.mkdir()
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
        trivial = Path(tmp) / "trivial"
        trivial.mkdir()
        (trivial / "Snakefile").write_text(TRIVIAL_SNAKEFILE)
        # (`--quiet` takes optional values: `--quiet all` would read the target as one.)
        for args in (["all", "-n", "--quiet"], ["all", "-n"]):
            times = [_snakemake(workdir, *args, cores=2) for _ in range(repeats)]
            print(f"| LongCA grid ({len(config['kernels'])} kernels × {len(config['masks'])} masks × 25 seqlens × "
                  f"2 directions × 4 dtypes) | {cells} cells + 14 | `snakemake {' '.join(args)}` | "
                  f"{statistics.median(times):.1f} | {min(times):.1f} |")
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "snakemake", "-s", str(trivial / "Snakefile"), "--directory",
                                str(trivial), "--cores", "2", *args], check=True, capture_output=True)
                times.append(time.perf_counter() - t)
            print(f"| trivial Snakefile (one `touch` rule) | 10000 + 1 | `snakemake {' '.join(args)}` | "
                  f"{statistics.median(times):.1f} | {min(times):.1f} |")


def main() -> None:
    os.environ["LONGCA_TEST_KERNELS"] = "1"  # the dry-run grid names test kernels (never run)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["cells", "workflow", "dryrun"])
    parser.add_argument("--cells", type=int, default=10, help="cells per mode (cells)")
    parser.add_argument("--sizes", type=int, nargs=2, default=[8, 32], help="grid sizes (workflow)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}\n")
    if args.what == "cells":
        bench_cells(args.cells)
    elif args.what == "workflow":
        bench_workflow(args.sizes, args.cores)
    else:
        bench_dryrun(args.repeats)


if __name__ == "__main__":
    main()
