"""The workflow against a bare in-process loop, on one GPU: wall times and per-cell fidelity.

    python lab/longca_lab/bench_pipeline.py OUTDIR --budget-s 540 [--work DIR] [--kernels ...]
        [--seqlens ...] [--configfile config/gpu.yaml] [--cores 8] [--retests 2] [--fresh-processes]
        [--retest-cells CELL ...] [--bare-harness]

The grid (default: config/gpu.yaml's 14 masks, 1K-32K, forward and backward, and every kernel of
the config that is installed here) is cut into chunks, one per sequence length.  Each chunk is
measured twice, one right after the other:

* by the workflow: ``snakemake <the chunk's cell files> --configfile config/gpu.yaml <overrides>
  --cores 8 --resources gpu=1``, as a user would run it (resident lanes, cache, one row per cell);
* by a bare loop in this process: the project's own adapters and correctness gate, and the same
  call (``longca.execution.measure.timed.cell_call``: on a GPU the replay of the call captured in a CUDA
  graph, where it can be captured) timed with ``triton.testing.do_bench(warmup=25, rep=100,
  return_mode="median")``, twice: the first loop is what a one-pass script reports, right after the
  gate and the compilation, with the GPU's clocks wherever that left them (on an H200 it read cuDNN's
  32K forward 6 % below the same loop repeated); the second is the bare figure the workflow is
  compared with.  Both are kept per cell, and the bare wall time counts one loop, not two, so the
  wall-time ratio is against a single pass.

Which of the two goes first alternates from chunk to chunk, so a drift of the GPU's state over the
run does not favour either.  A chunk's two sides run minutes apart, and on a power-capped GPU a
heavy kernel's 100 ms loop does not repeat to ±3 % even right after itself (an H100 at 8K-16K).  So
once every chunk is done, the ok cells outside ±3 % are measured again, the two sides interleaved
on just those cells: ``--retests N`` (default 2) measurements per side in the order bare, workflow,
workflow, bare, ... (a linear drift cancels), the workflow side again through ``snakemake`` on the
cells' files, the bare side again through ``bare_cell``.  A cell's retest ratio is the median of its
workflow figures over the median of its bare figures.  The first pass's figures stay what they were
(the tables report both), and the retests take no part in the wall times.  With
``--fresh-processes`` each retest measurement of a side runs in a process of its own: a new
workflow lane (a ``LONGCA_`` variable of the round's own names a new lane) and a new bare process
(``bench_pipeline.py --bare-only``), both with their side's on-disk compile caches; so a difference
that follows one process's state (where its buffers sit, what it compiled) shows as a spread
between rounds, and one that follows the way of timing does not.  ``--bare-harness`` adds the
third figure that separates the two: the bare process also times each call with the workflow's own
timing (after its do_bench loops), so workflow / bare-harness compares processes timed alike and
bare-harness / bare compares ways of timing in one process.  ``--retest-cells`` skips the first pass
and measures just the named cells that way.

Each Snakemake invocation pays its own start-up (parsing, the DAG), which one whole-grid run would
pay once: the workflow's wall time here is, if anything, high.

State lives in ``--work``: running the same command again continues with the chunks not yet done
(a chunk cut off by the budget is measured again from scratch, both ways).  Written to OUTDIR
(re-written after every chunk): ``pipeline_cells.jsonl`` (per cell: both statuses and TFLOPs/s),
``pipeline_chunks.jsonl`` (per chunk: both wall times), ``pipeline_retests.jsonl`` (per retested
cell: every figure of both sides), ``gpu_util.csv`` (nvidia-smi samples:
utilisation, SM clock, power), ``summary.md`` (the tables lab/data/workflow_cost_2026-11-22.md
quotes) and ``environment.txt``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from longca_lab.timing_series import kernel_and_problem
from longca_lab.workflow_config import REPO, merged, resolved

from longca.api import config as longca_config
from longca.api import cell_name
from longca.api import compile_cache, store

BARE_WARMUP_MS, BARE_REP_MS = 25, 100  # triton.testing.do_bench's defaults
FIDELITY = 0.03
GROWTH = 1.6  # the least a chunk's wall time grows over the previous (shorter) chunk's
MAX_GROWTH = 4.0  # dense masks: twice the length, four times the work


def next_chunk_s(chunk_s: list[float]) -> float | None:
    """What the next, twice as long, chunk will take: the last chunk's time times the growth the
    last two showed, squared (on an H100 8K -> 16K grew 1.69x, 16K -> 32K about 3.4x: past 8K the
    dense cells' quadratic cost takes over from compilation), at least GROWTH, at most MAX_GROWTH."""
    if not chunk_s:
        return None
    growth = (chunk_s[-1] / chunk_s[-2]) ** 2 if len(chunk_s) > 1 and chunk_s[-2] > 0 else GROWTH
    return chunk_s[-1] * min(max(growth, GROWTH), MAX_GROWTH)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path, help="where the tables and logs go")
    p.add_argument("--budget-s", type=float, required=True, help="start no chunk that would end past this")
    p.add_argument("--work", type=Path, default=Path("/tmp/longca_pipeline"),
                   help="the workflow's working directory and this benchmark's state (kept between runs)")
    p.add_argument("--configfile", type=Path, default=REPO / "config" / "gpu.yaml")
    p.add_argument("--kernels", nargs="*", default=None, help="default: every kernel of the config installed here")
    p.add_argument("--seqlens", nargs="*", type=int, default=None, help="default: the config's")
    p.add_argument("--masks", nargs="*", default=None, help="default: the config's")
    p.add_argument("--cores", type=int, default=8)
    p.add_argument("--retests", type=int, default=2,
                   help="measurements per side when re-measuring the cells outside ±3 %% interleaved (0: none)")
    p.add_argument("--fresh-processes", action="store_true",
                   help="each retest measurement in a process of its own (a new lane, a new bare process)")
    p.add_argument("--retest-cells", nargs="*", default=None, metavar="CELL",
                   help="no first pass: measure just these cells (kernel/mask/dtype_dir_seqlen, as the tables name "
                        "them) interleaved, --retests times per side")
    p.add_argument("--bare-harness", action="store_true",
                   help="the bare process also times each call with the workflow's own timing, after its two "
                        "do_bench loops: the same way of timing in the other process")
    return p.parse_args(argv)


# ---------------------------------------------------------------- the grid

def grid_config(args) -> dict:
    from longca.api import kernels

    merged_config = merged(args.configfile)
    # available() returns why a kernel cannot run here, or None: absent libraries are left out, since
    # their cells cost nothing on either side and would only pad both wall times.
    names = args.kernels or [k for k in merged_config["kernels"] if not kernels.get(k).available()]
    overrides = {"kernels": names, "cp_strategies": []}
    if args.seqlens:
        overrides["seqlens"] = args.seqlens
    if args.masks:
        overrides["masks"] = [m for m in merged["masks"] if (m if isinstance(m, str) else m["name"]) in args.masks]
    return overrides


def chunk_cells(cfg: dict, seqlen: int) -> list:
    return [c for c in longca_config.kernel_cells(cfg) if c.seqlen == seqlen]


# ---------------------------------------------------------------- the two ways of measuring

def run_workflow(args, overrides_path: Path, cells, timeout_s: float,
                 lane_env: dict[str, str] | None = None) -> tuple[float, int]:
    # Targets first: --configfile and --resources take every word after them.
    cmd = [sys.executable, "-m", "snakemake", *[c.path for c in cells], "-s", str(REPO / "Snakefile"),
           "--directory", str(args.work), "--cores", str(args.cores),
           "--configfile", str(args.configfile), str(overrides_path), "--resources", "gpu=1"]
    env = dict(os.environ, LONGCA_WORKER_IDLE_S="900", **compile_caches(args.work, "workflow"))  # lanes
    # live through the bare chunks (one run); compile caches of their own (see compile_caches)
    env.update(lane_env or {})
    # Each pass measures anew: a store of its own (the run's store would hand back the first
    # pass's timings, longca.execution.cache.store); every pass's parts are kept under work/stores/.
    env[store.STORE_ENV] = str((args.work / "stores" / f"pass_{time.time_ns()}").resolve())
    started = time.perf_counter()
    with open(args.work / "snakemake.log", "a") as log:
        log.write(f"\n=== {' '.join(cmd[:6])} ... ({len(cells)} targets)\n")
        log.flush()
        try:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = -1
    return time.perf_counter() - started, code


def bare_cell(spec, harness: bool = False) -> dict:
    """One cell the way a hand-written loop measures it: adapter, gate, do_bench on the same call.

    ``harness``: after the two do_bench loops, the same call timed once more by the workflow's own
    ``timing.measure`` with the cell's settings (``harness_tflops``): the workflow's way of timing in
    this process, to tell a gap that follows the process from one that follows the way of timing."""
    import torch

    from longca.api import kernels
    from longca.api import attention_flops
    from longca.api import is_oom
    from longca.api import correctness_gate, gate_problem
    from longca.api import cell_call

    try:
        kernel, problem, reason = kernel_and_problem(spec)
        if reason:
            return {"status": "unsupported", "reason": reason}
        ok, _, _, detail = correctness_gate(kernel, gate_problem(problem, spec.gate_seqlen))
        if not ok:
            return {"status": "wrong", "reason": detail}
        with cell_call(kernel, problem, max(spec.warmup, kernel.min_warmup), spec.cuda_graph) as (call, _, facts):
            first_ms = bare_loop(call, problem, spec)
            started = time.perf_counter()
            ms = bare_loop(call, problem, spec)
            second_loop_s = time.perf_counter() - started
            started = time.perf_counter()
            harness_ms = harness_loop(call, problem, spec) if harness else None
            harness_s = time.perf_counter() - started
        flops = attention_flops(problem.mask, spec.heads_q, spec.head_dim, spec.direction, spec.batch)
        tflops = lambda t: flops / (t * 1e-3) / 1e12  # noqa: E731
        row = {"status": "ok", "median_ms": ms, "tflops": tflops(ms), "first_loop_tflops": tflops(first_ms),
               "second_loop_s": second_loop_s, **facts}
        if harness_ms is not None:
            row.update(harness_tflops=tflops(harness_ms), harness_s=harness_s)
        return row
    except Exception as exc:  # noqa: BLE001
        unsupported = getattr(kernels.base, "Unsupported", ())
        status = ("unsupported" if unsupported and isinstance(exc, unsupported)
                  else "oom" if is_oom(exc) else "error")
        gc.collect()  # the traceback's frames may hold tensors (run_cell does the same)
        return {"status": status, "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def bare_loop(call, problem, spec) -> float:
    """One do_bench loop over the call: its median, in ms."""
    if problem.device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(call, warmup=BARE_WARMUP_MS, rep=BARE_REP_MS, return_mode="median")
    from longca.api import timing  # a CPU smoke test of this script: no do_bench there

    return timing.measure(call, device=problem.device, warmup=spec.warmup, reps=spec.reps).median_ms


def harness_loop(call, problem, spec) -> float:
    """The workflow's own timing of the call (``longca.execution.measure.timing.measure``, the cell's
    settings): its median, in ms."""
    from longca.api import timing

    return timing.measure(call, device=problem.device, warmup=spec.warmup, reps=spec.reps,
                          warmup_ms=spec.warmup_ms, warmup_max_ms=spec.warmup_max_ms,
                          rep_ms=spec.rep_ms).median_ms


def run_bare_fresh(args, overrides_path: Path, cells) -> dict:
    """``run_bare`` in a new process (``--bare-only``): no import, compiled kernel or buffer of this
    one carries over; the on-disk compile caches of the bare side do (main() put them in this
    process's environment, which the new one inherits), as a new lane's do."""
    out = args.work / "bare_only.json"
    out.unlink(missing_ok=True)
    subprocess.run([sys.executable, __file__, "--bare-only", str(out), str(args.configfile), str(overrides_path),
                    "--harness" if args.bare_harness else "--no-harness", *[c.path for c in cells]])
    rows = json.loads(out.read_text()) if out.exists() else {}
    return {c.path: rows.get(c.path, {"status": "missing"}) for c in cells}


def bare_only(argv: list[str]) -> int:
    """``--bare-only OUT.json CONFIGFILE OVERRIDES --harness|--no-harness CELL_PATH...``: the bare
    loop over those cells, rows to OUT."""
    out, configfile, overrides, harness, *paths = argv
    cfg = resolved(configfile, overrides)
    by_path = {c.path: c for c in longca_config.kernel_cells(cfg)}
    rows = run_bare(cfg, [by_path[p] for p in paths], harness == "--harness")[2]
    Path(out).write_text(json.dumps(rows))
    return 0


def compile_caches(work: Path, side: str) -> dict[str, str]:
    """On-disk compile caches (Inductor, Triton, CuTe DSL) of one side: whichever side measures a
    chunk second would otherwise find the other's compiled kernels on disk and skip compiling (seen
    on an H200: the side that went second was 1.5-2.7x faster per chunk)."""
    return compile_cache.environment(work / f"compile-cache-{side}")


def run_bare(cfg: dict, cells, harness: bool = False) -> tuple[float, float, dict]:
    """The bare loop over ``cells``: (its wall time as a one-pass loop, the second loops' time, rows)."""
    from longca.api import CellSpec

    started = time.perf_counter()
    rows = {}
    for c in cells:
        spec = CellSpec.from_dict(longca_config.cell_settings(cfg, c.kernel, c.mask, c.seqlen, c.direction, c.dtype))
        rows[c.path] = bare_cell(spec, harness)
    # A one-pass loop would not make the second do_bench loop (nor the harness's, with --bare-harness):
    # their time is not the bare side's.
    extra = sum(r.get("second_loop_s", 0.0) + r.get("harness_s", 0.0) for r in rows.values())
    return time.perf_counter() - started - extra, extra, rows


def outside_fidelity(state: dict, path: str) -> bool:
    """Whether a cell ok on both sides of the first pass read more than ±3 % apart."""
    wf, bare = state["workflow_rows"].get(path, {}), state["cells"][path]
    if wf.get("status") != "ok" or bare["status"] != "ok":
        return False
    return abs(wf["tflops"] / bare["tflops"] - 1) > FIDELITY


def retest_misses(args, cfg: dict, overrides_path: Path, state: dict, deadline: float) -> None:
    """The first pass's cells outside ±3 %, measured again with the two sides interleaved on just
    those cells (bare, workflow, workflow, bare, ...), one length at a time, shortest first, as long
    as the budget allows: the module's docstring says why."""
    by_path = {c.path: c for c in longca_config.kernel_cells(cfg)}
    paths = [p for p in state["cells"] if p not in state["retests"] and p in by_path and outside_fidelity(state, p)]
    retest(args, cfg, overrides_path, state, paths, deadline)


def named_cells(cfg: dict, names: list[str]) -> list[str]:
    """The cell files of ``--retest-cells``; a name that is no cell of the grid stops the run, naming it."""
    try:
        return [c.path for c in longca_config.named_cells(cfg, names)]
    except longca_config.ConfigError as exc:
        raise SystemExit(f"--retest-cells: {exc}") from None


def retest(args, cfg: dict, overrides_path: Path, state: dict, paths: list[str], deadline: float,
           by_length: bool = True) -> None:
    """``paths`` measured with the two sides interleaved, ``--retests`` times per side: one length at
    a time, shortest first (``by_length``; a budget cut loses the longest), or all in one go (one
    Snakemake start-up and one import of the kernel libraries per measurement, not one per length)."""
    by_path = {c.path: c for c in longca_config.kernel_cells(cfg)}
    by_seqlen: dict[int, list[str]] = {}
    for path in paths:
        by_seqlen.setdefault(by_path[path].seqlen if by_length else 0, []).append(path)
    for seqlen, paths in sorted(by_seqlen.items()):
        # Each measurement of a side costs about what the workflow's first pass took per cell (its
        # warm-up and timing; compiled kernels are cached by now), plus one Snakemake start-up.
        cost = args.retests * (2.2 * sum(state["workflow_rows"].get(p, {}).get("wall_s") or 1.0 for p in paths) + 15)
        if time.monotonic() + cost > deadline:
            print(f"retest: {len(paths)} cells at {seqlen} skipped, ~{cost:.0f} s needed, "
                  f"{deadline - time.monotonic():.0f} s left")
            continue
        cells = [by_path[p] for p in paths]
        figures = {p: {"order": [], "workflow": [], "bare": [], "bare_first": [], "bare_harness": [],
                       "fresh_processes": args.fresh_processes} for p in paths}
        for i in range(args.retests):
            for side in (("bare", "workflow") if i % 2 == 0 else ("workflow", "bare")):
                t0 = time.time()
                if side == "workflow":
                    for c in cells:  # a missing file is what makes Snakemake measure the cell again
                        (args.work / c.path).unlink(missing_ok=True)
                    # A new lane per round, short-lived: it is used by this one invocation.
                    lane = ({"LONGCA_BENCH_RETEST_LANE": f"{seqlen}-{i}", "LONGCA_WORKER_IDLE_S": "30"}
                            if args.fresh_processes else None)
                    run_workflow(args, overrides_path, cells, max(deadline - time.monotonic(), 1), lane)
                    rows = {p: workflow_row(args.work, p) for p in paths}
                elif args.fresh_processes:
                    rows = run_bare_fresh(args, overrides_path, cells)
                else:
                    rows = run_bare(cfg, cells, args.bare_harness)[2]
                state["phases"].append({"phase": f"retest-{side}", "start": t0, "end": time.time()})
                for p, row in rows.items():
                    figures[p]["order"].append(side)
                    if row.get("status") == "ok":
                        figures[p][side].append(row["tflops"])
                        if side == "bare":
                            figures[p]["bare_first"].append(row["first_loop_tflops"])
                            if "harness_tflops" in row:
                                figures[p]["bare_harness"].append(row["harness_tflops"])
        state["retests"].update(figures)
        save_state(args.work, state)
        print(f"retest: {len(paths)} cells at {seqlen or 'their lengths'} measured again, "
              f"{args.retests} times per side", flush=True)


# ---------------------------------------------------------------- bookkeeping

class GpuSampler:
    """nvidia-smi twice a second, for the whole run: utilisation, SM clock, power."""

    def __init__(self, path: Path):
        gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.file = open(path, "a")
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", gpu, "--query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw",
                 "--format=csv,noheader,nounits", "-lms", "500"], stdout=self.file, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.file.close()


def utilisation(samples_path: Path, phases: list[dict], phase: str) -> float | None:
    """Fraction of the samples taken during ``phase`` with utilisation >= 50 %."""
    if not samples_path.exists():
        return None
    spans = [(p["start"], p["end"]) for p in phases if p["phase"] == phase]
    hits = total = 0
    with open(samples_path) as f:
        for row in csv.reader(f):
            try:
                t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                util = float(row[1])
            except (ValueError, IndexError):
                continue
            if any(a <= t <= b for a, b in spans):
                total += 1
                hits += util >= 50
    return hits / total if total else None


def load_state(work: Path) -> dict:
    path = work / "bench_state.json"
    state = json.loads(path.read_text()) if path.exists() else {}
    for key, empty in (("chunks", []), ("cells", {}), ("phases", []), ("workflow_rows", {}), ("retests", {})):
        state.setdefault(key, empty)
    return state


def save_state(work: Path, state: dict) -> None:
    tmp = work / "bench_state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, work / "bench_state.json")


def workflow_row(work: Path, path: str) -> dict:
    try:
        return json.loads((work / path).read_text())
    except (OSError, ValueError):
        return {"status": "missing"}


def write_outputs(args, cfg: dict, state: dict) -> str:
    args.outdir.mkdir(parents=True, exist_ok=True)
    with open(args.outdir / "pipeline_chunks.jsonl", "w") as f:
        for chunk in state["chunks"]:
            f.write(json.dumps(chunk) + "\n")
    cells = []
    for path, bare in state["cells"].items():
        wf = state["workflow_rows"].get(path) or workflow_row(args.work, path)
        entry = {"cell": cell_name(path),
                 "workflow_status": wf.get("status"), "workflow_tflops": wf.get("tflops"),
                 "workflow_reps": wf.get("reps"), "workflow_warmup_calls": wf.get("warmup_calls"),
                 "workflow_warmup_steady": wf.get("warmup_steady"), "workflow_wall_s": wf.get("wall_s"),
                 "workflow_timed_via": wf.get("timed_via"), "bare_timed_via": bare.get("timed_via"),
                 "workflow_host_ms": wf.get("host_ms"), "bare_host_ms": bare.get("host_ms"),
                 "bare_status": bare["status"], "bare_tflops": bare.get("tflops"),
                 "bare_first_loop_tflops": bare.get("first_loop_tflops"),
                 "workflow_reason": wf.get("reason"), "bare_reason": bare.get("reason")}
        if entry["workflow_tflops"] and entry["bare_tflops"]:
            entry["ratio"] = entry["workflow_tflops"] / entry["bare_tflops"]
            entry["ratio_first_loop"] = entry["workflow_tflops"] / entry["bare_first_loop_tflops"]
            entry["bare_loops_ratio"] = entry["bare_first_loop_tflops"] / entry["bare_tflops"]
        retest = state["retests"].get(path)
        if retest and retest["workflow"] and retest["bare"]:
            wf_median = statistics.median(retest["workflow"])
            entry["retest_ratio"] = wf_median / statistics.median(retest["bare"])
            # The first loop times where the workflow does, right after the warm-up; the second
            # after the first's ~125 ms of load: how far the workflow is from the nearer of the two.
            bare_range = sorted((statistics.median(retest["bare"]), statistics.median(retest["bare_first"])))
            entry["retest_off_range"] = (wf_median / bare_range[1] - 1 if wf_median > bare_range[1]
                                         else wf_median / bare_range[0] - 1 if wf_median < bare_range[0] else 0.0)
        cells.append(entry)
    with open(args.outdir / "pipeline_cells.jsonl", "w") as f:
        for entry in cells:
            f.write(json.dumps(entry) + "\n")
    with open(args.outdir / "pipeline_retests.jsonl", "w") as f:
        for path, retest in state["retests"].items():
            f.write(json.dumps({"cell": cell_name(path), **retest}) + "\n")
    summary = summarize(args, cfg, state, cells)
    (args.outdir / "summary.md").write_text(summary)
    return summary


def summarize(args, cfg: dict, state: dict, cells: list[dict]) -> str:
    wf = sum(c["workflow_s"] for c in state["chunks"])
    bare = sum(c["bare_s"] for c in state["chunks"])
    lines = [f"kernels: {', '.join(cfg['kernels'])}; seqlens done: "
             f"{', '.join(str(c['seqlen']) for c in state['chunks'])}; cells: {len(cells)}", "",
             "| seqlen | cells | workflow (s) | bare loop (s) | ratio | first |", "| --- | --- | --- | --- | --- | --- |"]
    for c in state["chunks"]:
        lines.append(f"| {c['seqlen']} | {c['cells']} | {c['workflow_s']:.1f} | {c['bare_s']:.1f} | "
                     f"{c['workflow_s'] / c['bare_s']:.2f} | {c['first']} |")
    if bare:
        lines.append(f"| all | {len(cells)} | {wf:.1f} | {bare:.1f} | {wf / bare:.2f} | |")
    statuses = {}
    for c in cells:
        key = (c["workflow_status"], c["bare_status"])
        statuses[key] = statuses.get(key, 0) + 1
    lines += ["", "| workflow status | bare status | cells |", "| --- | --- | --- |"]
    lines += [f"| {w} | {b} | {n} |" for (w, b), n in sorted(statuses.items(), key=str)]
    ratios = [c["ratio"] for c in cells if "ratio" in c]
    if ratios:
        outside = sorted((c for c in cells if "ratio" in c and abs(c["ratio"] - 1) > FIDELITY),
                         key=lambda c: abs(c["ratio"] - 1), reverse=True)
        lines += ["", f"ok in both: {len(ratios)}; " + fidelity_line(cells, "ratio", "workflow / bare TFLOPs/s"),
                  fidelity_line(cells, "ratio_first_loop", "workflow / the bare first loop"),
                  fidelity_line(cells, "bare_loops_ratio", "the bare first loop / the bare second loop")]
        retested = [c for c in outside if "retest_ratio" in c]
        if retested:
            settled = sum(abs(c["retest_ratio"] - 1) <= FIDELITY for c in retested)
            lines += [fidelity_line(retested, "retest_ratio",
                                    f"the {len(retested)} of {len(outside)} cells outside ±{FIDELITY:.0%} retested "
                                    f"interleaved ({args.retests} per side"
                                    f"{', each in a fresh process' if args.fresh_processes else ''}), "
                                    "median workflow / median bare"),
                      f"ok cells within ±{FIDELITY:.0%}, first pass or interleaved retest: "
                      f"{len(ratios) - len(outside) + settled} of {len(ratios)}",
                      f"retested cells within ±{FIDELITY:.0%} of the range of the two bare loops: "
                      f"{sum(abs(c['retest_off_range']) <= FIDELITY for c in retested)} of {len(retested)}"]
        if outside:
            lines += ["", f"| cell outside ±{FIDELITY:.0%} | workflow TFLOPs/s | bare TFLOPs/s | ratio | bare 1st loop "
                          "| reps | warm-up calls (steady) | retest ratio |",
                      "| --- | --- | --- | --- | --- | --- | --- | --- |"]
            lines += [f"| {c['cell']} | {c['workflow_tflops']:.1f} | {c['bare_tflops']:.1f} | {c['ratio']:.3f} | "
                      f"{c['bare_first_loop_tflops']:.1f} | {c['workflow_reps']} | "
                      f"{c['workflow_warmup_calls']} ({c['workflow_warmup_steady']}) | "
                      f"{format(c['retest_ratio'], '.3f') if 'retest_ratio' in c else ''} |" for c in outside[:60]]
    lines += retest_table(state["retests"])
    wf_util = utilisation(args.outdir / "gpu_util.csv", state["phases"], "workflow")
    bare_util = utilisation(args.outdir / "gpu_util.csv", state["phases"], "bare")
    if wf_util is not None:
        lines += ["", f"GPU utilisation >= 50 % in {wf_util:.0%} of the 0.5 s samples during the workflow, "
                      f"{bare_util:.0%} during the bare loop"]
    return "\n".join(lines) + "\n"


def retest_table(retests: dict) -> list[str]:
    """Every retested cell's figures, side by side: the workflow (its lane), the bare process's two
    do_bench loops and, with --bare-harness, the workflow's timing in the bare process.  Workflow /
    bare harness compares two processes timed the same way; bare harness / bare do_bench, two ways
    of timing in one process."""
    if not retests:
        return []
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    ratio = lambda a, b: f"{a / b:.3f}" if a and b else ""  # noqa: E731
    each = lambda xs: ", ".join(f"{x:.0f}" for x in xs)  # noqa: E731
    lines = ["", "| retested cell | workflow TFLOPs/s | bare do_bench (2nd loop) | bare do_bench (1st loop) "
                 "| bare, workflow's timing | workflow / bare | workflow / bare, workflow's timing "
                 "| bare: workflow's timing / do_bench |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path, r in retests.items():
        wf, bare, harness = med(r["workflow"]), med(r["bare"]), med(r.get("bare_harness", []))
        lines.append(f"| {cell_name(path)} | {each(r['workflow'])} | {each(r['bare'])} "
                     f"| {each(r['bare_first'])} "
                     f"| {each(r.get('bare_harness', []))} | {ratio(wf, bare)} | {ratio(wf, harness)} "
                     f"| {ratio(harness, bare)} |")
    return lines


def fidelity_line(cells: list[dict], key: str, what: str) -> str:
    ratios = [c[key] for c in cells if c.get(key)]
    within = sum(abs(r - 1) <= FIDELITY for r in ratios)
    return (f"{what}: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}; "
            f"within ±{FIDELITY:.0%}: {within} of {len(ratios)}") if ratios else f"{what}: no cells"


def environment(outdir: Path) -> None:
    import torch

    lines = [f"python {sys.version.split()[0]}", f"torch {torch.__version__} cuda {torch.version.cuda}"]
    if torch.cuda.is_available():
        lines.append(f"device {torch.cuda.get_device_name(0)}; cudnn {torch.backends.cudnn.version()}")
    for mod in ("triton", "snakemake", "flash_attn", "cudnn"):
        try:
            lines.append(f"{mod} {getattr(__import__(mod), '__version__', '?')}")
        except Exception as exc:  # noqa: BLE001
            lines.append(f"{mod}: {type(exc).__name__}")
    (outdir / "environment.txt").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--bare-only"]:
        return bare_only(argv[1:])
    args = parse_args(argv)
    start = time.monotonic()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.update(compile_caches(args.work, "bare"))  # before this process compiles anything
    args.outdir.mkdir(parents=True, exist_ok=True)
    environment(args.outdir)
    overrides = grid_config(args)
    overrides_path = args.work / "overrides.yaml"
    overrides_path.write_text(yaml.safe_dump(overrides))
    (args.outdir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    cfg = resolved(args.configfile, overrides_path)
    retest_paths = named_cells(cfg, args.retest_cells) if args.retest_cells else None  # before any work
    state = load_state(args.work)
    done = {c["seqlen"] for c in state["chunks"]}
    sampler = GpuSampler(args.outdir / "gpu_util.csv")
    chunk_s: list[float] = []  # this invocation's chunks (a new process compiles anew: no earlier ones)
    try:
        for i, seqlen in enumerate([] if args.retest_cells else cfg["seqlens"]):
            if seqlen in done:
                continue
            left = args.budget_s - (time.monotonic() - start)
            expected = next_chunk_s(chunk_s)
            if expected is not None and expected > left:
                print(f"stopping: {left:.0f} s left, the {seqlen} chunk would take ~{expected:.0f} s")
                break
            cells = chunk_cells(cfg, seqlen)
            for c in cells:  # a chunk cut off earlier starts from scratch, both ways
                (args.work / c.path).unlink(missing_ok=True)
                state["cells"].pop(c.path, None)
            workflow_first = len(state["chunks"]) % 2 == 0
            chunk = {"seqlen": seqlen, "cells": len(cells), "first": "workflow" if workflow_first else "bare"}
            for phase in (("workflow", "bare") if workflow_first else ("bare", "workflow")):
                t0 = time.time()
                if phase == "workflow":
                    remaining = args.budget_s - (time.monotonic() - start)
                    chunk["workflow_s"], code = run_workflow(args, overrides_path, cells, max(remaining, 1))
                    chunk["workflow_exit"] = code
                else:
                    chunk["bare_s"], chunk["bare_second_loops_s"], rows = run_bare(cfg, cells)
                state["phases"].append({"phase": phase, "start": t0, "end": time.time()})
            if chunk["workflow_exit"] != 0:
                print(f"seqlen {seqlen}: snakemake exited {chunk['workflow_exit']} (see {args.work}/snakemake.log); "
                      f"the chunk is not counted")
                save_state(args.work, state)
                break
            state["cells"].update(rows)
            state["workflow_rows"].update({c.path: workflow_row(args.work, c.path) for c in cells})
            state["chunks"].append(chunk)
            save_state(args.work, state)
            chunk_s.append(chunk["workflow_s"] + chunk["bare_s"] + chunk["bare_second_loops_s"])  # all it took
            print(f"seqlen {seqlen}: {len(cells)} cells, workflow {chunk['workflow_s']:.1f} s, "
                  f"bare {chunk['bare_s']:.1f} s", flush=True)
            write_outputs(args, cfg, state)
        if retest_paths:
            retest(args, cfg, overrides_path, state, retest_paths, start + args.budget_s, by_length=False)
        elif args.retests > 0:
            retest_misses(args, cfg, overrides_path, state, start + args.budget_s)
    finally:
        sampler.stop()
        if (args.work / "snakemake.log").exists():
            shutil.copy(args.work / "snakemake.log", args.outdir / "snakemake.log")
    print(write_outputs(args, cfg, state))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
