"""Does the harness measure what a bare loop measures?  (GPU; issue: kernels.)

For each seqlen × mask × direction × kernel: one LongCA cell (``longca.execution.measure.cell.run_cell``: support
check, correctness gate against the float64 reference, then CUDA-event timing with an L2 flush,
median of the reps) and, in the same process right after it, a bare ``triton.testing.do_bench``
loop of the same call on the same shapes (median, do_bench's own L2 flush).  The two TFLOPs/s
must agree within 3 %.  Prints a markdown table; writes every row as JSON lines to ``--out``.

Order and budget: a power-capped GPU's clock wanders (an H200 at its 700 W cap went between 1.3
and 1.98 GHz within seconds), so one loop can land in a dip.  The loops alternate A B A B … A B (the
cell's harness timing, bare, the harness's ``time_kernel`` again, …; ``--rounds`` bare loops) and the
ratio is of the medians over the loops of each method.  The cell warms up for ``--warmup-ms`` (it
follows the correctness gate, when the GPU was nearly idle); the later loops run back to back with
``--loop-warmup-ms`` each.  Mask metadata is prepared once for the comparison loops (``prepare`` is untimed
either way; building a dense 32K × 32K mask for SDPA takes seconds of CPU).  Timed repetitions
shrink with the square of the length above 8K (``--reps`` at 8K and below, at least
``--min-reps``) so every loop lasts about as long; the bare loop's budget follows the cell's median
(about ``--bare-reps`` timed calls).  ``--compare-dense-up-to`` leaves out the comparison (not the
cell) for masks fed to SDPA as a dense ``attn_mask`` above that length: they compute all S² pairs,
are the run's most expensive cells and tell nothing new about the harness.  ``--budget-s`` stops
starting new cells after that many seconds (the rest become ``skipped`` rows), so a fixed device
budget is never overrun.

FlexAttention in this one long-lived process compiles once per shape and grad mode (a new mask of
the same shape did not recompile in a CPU check); the dynamo recompile limit is raised anyway, so a
long grid can never push it into eager fallback (each Snakemake cell is its own process).

    PYTHONPATH=. PYTHONUNBUFFERED=1 python lab/longca_lab/bench_kernels.py --out /tmp/bench.jsonl
    # what lab/data/kernels_h200_2026-11-22.md reports (one H200, a 10-minute budget; 32K first, 16K last under the budget):
    PYTHONPATH=. PYTHONUNBUFFERED=1 python lab/longca_lab/bench_kernels.py --seqlens 32768 8192 16384 \\
        --compare-dense-up-to 8192 --budget-s 387 --out kernels.jsonl
    PYTHONPATH=. PYTHONUNBUFFERED=1 python lab/longca_lab/bench_kernels.py --seqlens 32768 \\
        --masks block_sparse --kernels flex triton_block_sparse --out block_sparse.jsonl
    # the workflow's own timing on a GPU (resident defaults, longca/config.py) against do_bench(25, 100)
    # exactly as lab/longca_lab/bench_pipeline.py calls it, alternated call by call on the same cells:
    PYTHONPATH=. PYTHONUNBUFFERED=1 python lab/longca_lab/bench_kernels.py --warmup 1 --reps 5 --min-reps 5 \
        --warmup-ms 25 --warmup-max-ms 1000 --rep-ms 100 --loop-warmup-ms 25 --do-bench-defaults --rounds 4 \
        --seqlens 32768 1024 --kernels sdpa_cudnn flex --directions fwd --out fidelity.jsonl
    # CPU smoke test of this script (tiny shapes, perf_counter instead of do_bench; add
    # triton_block_sparse with TRITON_INTERPRET=1 only at tiny sizes: the interpreter takes minutes):
    PYTHONPATH=. python lab/longca_lab/bench_kernels.py --device cpu --seqlens 256 --shape 4 2 32 \\
        --gate-seqlen 128 --kernels flex sdpa sdpa_flash --out /tmp/smoke.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch

from longca.api import kernels
from longca.api import attention_flops
from longca.api import CellSpec, run_cell
from longca.api import cell_call, time_kernel

MASKS = {
    "full": {},
    "causal": {},
    "varlen_causal": {},
    "sliding_window_causal": {},
}
EXCLUDED = ("sdpa_math",)  # the unfused reference: O(S²) memory, minutes per cell at 32K
LAST = ("sdpa",)  # the dispatcher duplicates a backend (or falls back to math): run it last


class _Prepared:
    """``kernel`` with ``prepare`` answered from one cached result (all else delegated)."""

    def __init__(self, kernel, prepared):
        self._kernel, self._prepared = kernel, prepared

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def prepare(self, problem):
        return self._prepared


def _bare(fn: Callable[[], Any], device: str, est_ms: float, bare_reps: int, warmup_ms: float,
          do_bench_defaults: bool = False) -> float:
    """A bare timing loop's median, in ms: do_bench on CUDA, a perf_counter loop on CPU (smoke)."""
    if device == "cuda":
        from triton.testing import do_bench

        if do_bench_defaults:  # the bare loop of lab/longca_lab/bench_pipeline.py, call for call
            return do_bench(fn, warmup=25, rep=100, return_mode="median")

        # do_bench's warm-up and rep are milliseconds; it sizes its loops from its own estimate.  Its
        # warm-up is the harness loop's it alternates with (--loop-warmup-ms): same start for both.
        return do_bench(fn, warmup=max(25.0, warmup_ms, est_ms), rep=max(100.0, bare_reps * est_ms),
                        return_mode="median")
    fn()
    samples = []
    for _ in range(max(3, bare_reps)):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def side_by_side(kernel_name: str, spec: CellSpec, cell_ms: float, args) -> dict:
    """Bare and harness loops alternated after the cell's own: A(cell) B A B … B, same inputs.

    The loops after the cell run back to back, so they need no long warm-up (--loop-warmup-ms,
    the same for both); the cell had its own (spec.warmup_ms).  A power-capped GPU's clock wanders
    by 10-20 % over seconds, so any one loop can land in a dip: medians over the rounds, not means
    of two, decide the ratio."""
    kernel = kernels.get(kernel_name).with_options(spec.kernel_options)
    problem = spec.problem()
    prepared = kernel.prepare(problem)
    cached = _Prepared(kernel, prepared)
    flops = attention_flops(problem.mask, spec.heads_q, spec.head_dim, spec.direction, spec.batch)
    harness_ms, bare_ms = [cell_ms], []
    for i in range(args.rounds):
        # The call exactly as the cell times it (eager, or a CUDA graph's replay), fresh inputs.
        with cell_call(cached, problem, max(spec.warmup, kernel.min_warmup), spec.cuda_graph) as (call, _, _):
            bare_ms.append(_bare(call, spec.device, cell_ms, args.bare_reps, args.loop_warmup_ms,
                                 args.do_bench_defaults))
        if i < args.rounds - 1:
            # The harness's own function, its own fresh inputs (as in the cell), the prepared metadata reused.
            t, _ = time_kernel(cached, problem, **{**spec.timing.harness_args(), "warmup_ms": args.loop_warmup_ms})
            harness_ms.append(t.median_ms)
    del prepared, cached
    if spec.device == "cuda":
        torch.cuda.empty_cache()
    tf = lambda ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
    harness, bare = [tf(ms) for ms in harness_ms], [tf(ms) for ms in bare_ms]
    return {"harness_ms": harness_ms, "bare_ms": bare_ms, "harness_tflops_each": harness, "bare_tflops_each": bare,
            "harness_tflops": statistics.median(harness), "bare_tflops": statistics.median(bare)}


def reps_for(seqlen: int, reps_8k: int, min_reps: int) -> int:
    """``reps_8k`` at 8K and below, × (8K / seqlen)² above, at least ``min_reps``."""
    return max(min_reps, min(reps_8k, round(reps_8k * (8192 / seqlen) ** 2)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="*", default=None, help="default: every kernel available here "
                    f"except {', '.join(EXCLUDED)}")
    ap.add_argument("--masks", nargs="*", default=list(MASKS))
    ap.add_argument("--seqlens", nargs="*", type=int, default=[8192, 16384, 32768],
                    help="in the order given (put the ones that matter most first under --budget-s)")
    ap.add_argument("--directions", nargs="*", default=["fwd", "bwd"])
    ap.add_argument("--reps", type=int, default=20, help="harness timed reps at 8K and below (× (8K/seqlen)² above)")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--warmup-ms", type=float, default=1000.0,
                    help="the cell warms up at least this long (GPU clocks settle after the idle gate)")
    ap.add_argument("--warmup-max-ms", type=float, default=0.0,
                    help="> 0: the workflow's budget timing (warm up until steady, at most this long; with "
                         "--rep-ms), in the cell and in every later harness loop")
    ap.add_argument("--rep-ms", type=float, default=0.0,
                    help="> 0: harness loops repeat until this much time is filled (at least the reps)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="time the replay of the call captured in a CUDA graph, in the cell and in both "
                         "kinds of loop (the workflow's CUDA default, timing.cuda_graph)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="bare loops, alternated with the harness's (the cell's loop + rounds - 1 more)")
    ap.add_argument("--loop-warmup-ms", type=float, default=25.0,
                    help="warm-up of each loop after the cell's (they run back to back), both methods")
    ap.add_argument("--bare-reps", type=float, default=3.0,
                    help="bare do_bench's rep budget in units of the cell's median (≥ 100 ms)")
    ap.add_argument("--do-bench-defaults", action="store_true",
                    help="bare loops are do_bench(warmup=25, rep=100, median), as lab/longca_lab/bench_pipeline.py "
                         "times the grid (instead of sized from the cell's median)")
    ap.add_argument("--max-bare-ms", type=float, default=2000.0,
                    help="no bare comparison for cells whose median is longer (too slow for the budget)")
    ap.add_argument("--compare-dense-up-to", type=int, default=None,
                    help="bare comparison of cells whose mask goes in as a dense attn_mask only up to this "
                         "seqlen (they compute all S² pairs: the run's most expensive cells)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no new cell after this many seconds")
    ap.add_argument("--gate-seqlen", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shape", type=int, nargs=3, default=[64, 8, 128], metavar=("HQ", "HKV", "D"))
    ap.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests this script")
    ap.add_argument("--out", default="bench_kernels.jsonl")
    args = ap.parse_args()
    heads_q, heads_kv, head_dim = args.shape
    started = time.time()

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("needs a CUDA GPU (or --device cpu for a smoke test)", file=sys.stderr)
            return 2
        import torch._dynamo.config as dynamo_config

        for key in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, key):
                setattr(dynamo_config, key, 256)
        device_name = torch.cuda.get_device_name()
    else:
        device_name = "cpu"

    all_names = [n for n in kernels.names() if not n.startswith("test_")]
    unavailable = {n: kernels.get(n).available() for n in all_names if kernels.get(n).available()}
    names = args.kernels or [n for n in all_names if n not in unavailable and n not in EXCLUDED]
    names = sorted(names, key=lambda n: (n in LAST, n))
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    print(f"device: {device_name}  torch {torch.__version__} (CUDA {torch.version.cuda})  triton {triton_version}  "
          f"date {datetime.date.today()}", flush=True)
    print(f"{args.dtype}, batch 1, heads {heads_q}:{heads_kv}, head_dim {head_dim}; kernels: {', '.join(names)}",
          flush=True)
    for n, why in unavailable.items():
        print(f"  not available here: {n}: {why}", flush=True)

    rows = []
    with open(args.out, "a") as sink:
        for seqlen in args.seqlens:
            reps = reps_for(seqlen, args.reps, args.min_reps)
            for mask in args.masks:
                for direction in args.directions:
                    for name in names:
                        spec = CellSpec(kernel=name, mask=mask, seqlen=seqlen, direction=direction, dtype=args.dtype,
                                        batch=1, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                                        mask_params=MASKS.get(mask, {}), warmup=args.warmup, reps=reps,
                                        warmup_ms=args.warmup_ms if args.device == "cuda" else 0.0,
                                        warmup_max_ms=args.warmup_max_ms, rep_ms=args.rep_ms,
                                        cuda_graph=args.cuda_graph and args.device == "cuda",
                                        gate_seqlen=args.gate_seqlen, device=args.device,
                                        seed=1)  # seed 0 draws one 16K+ document: no packing below 32K
                        t0 = time.time()
                        if args.budget_s is not None and t0 - started > args.budget_s:
                            entry = {"kernel": name, "mask": mask, "seqlen": seqlen, "direction": direction,
                                     "status": "skipped", "reason": f"time budget ({args.budget_s:.0f} s) spent"}
                        else:
                            entry = measure(name, spec, args)
                        entry["wall_s"] = time.time() - t0
                        entry["reps"] = reps
                        rows.append(entry)
                        sink.write(json.dumps(entry, default=str) + "\n")
                        sink.flush()
                        print(_line(entry), flush=True)
    print(f"\ndevice: {device_name}  torch {torch.__version__}  triton {triton_version}  "
          f"total {time.time() - started:.0f} s")
    print("| kernel | mask | seqlen | dir | status | harness TFLOPs/s: cell (p20–p80); later loops "
          "| do_bench TFLOPs/s, each loop | ratio of medians | how |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for e in rows:
        print(_line(e))
    timed = [e for e in rows if "ratio" in e]
    bad = [e for e in timed if abs(e["ratio"] - 1) > 0.03]
    print(f"\n{len(timed)} cells compared; {len(bad)} outside ±3 % of do_bench"
          + "".join(f"\n  outside: {e['kernel']} {e['mask']} {e['seqlen']} {e['direction']} ratio {e['ratio']:.3f}"
                    for e in bad))
    return 0


def measure(name: str, spec: CellSpec, args) -> dict[str, Any]:
    row = run_cell(spec)
    entry = {k: row.get(k) for k in ("kernel", "mask", "seqlen", "direction", "status", "reason", "timed_via", "host_ms",
                                      "tflops", "tflops_p20", "tflops_p80", "median_ms", "flops", "density",
                                      "peak_mem_bytes", "gate_error", "gate_detail", "notes", "device_name",
                                      "torch_version", "cuda_version", "driver_version", "libraries")}
    if row["status"] != "ok":
        return entry
    if row["median_ms"] > args.max_bare_ms:
        entry["bare_error"] = f"not compared: cell median {row['median_ms']:.0f} ms > --max-bare-ms"
        return entry
    notes = json.loads(row.get("notes") or "{}")
    if (args.compare_dense_up_to is not None and notes.get("mask_via") == "dense"
            and spec.seqlen > args.compare_dense_up_to):
        entry["bare_error"] = f"not compared: dense-mask cell above {args.compare_dense_up_to}"
        return entry
    try:
        entry.update(side_by_side(name, spec, row["median_ms"], args))
        entry["ratio"] = entry["harness_tflops"] / entry["bare_tflops"]
    except Exception as exc:  # noqa: BLE001 — a failed comparison is reported, the run goes on
        entry["bare_error"] = traceback.format_exception_only(type(exc), exc)[-1].strip()
        traceback.print_exc(file=sys.stderr)
        if spec.device == "cuda":
            torch.cuda.empty_cache()
    return entry


def _how(e: dict) -> str:
    """The adapter's notes that change what was computed (mask route, KV expansion, tile density)."""
    try:
        notes = json.loads(e.get("notes") or "{}")
    except (TypeError, ValueError):
        return ""
    parts = []
    if "mask_via" in notes and "tile" not in notes["mask_via"]:
        parts.append(f"mask {notes['mask_via']}")
    if notes.get("kv_expanded"):
        parts.append("KV expanded")
    if notes.get("native_gqa"):
        parts.append("native GQA")
    if "tile_density" in notes:
        parts.append(f"tiles {notes['tile_density']:.3f}")
    if "documents" in notes:
        parts.append(f"{notes['documents']} docs")
    return ", ".join(parts)


def _line(e: dict) -> str:
    if e["status"] != "ok":
        reason = (e.get("reason") or "").splitlines()[0][:90].replace("|", "/") if e.get("reason") else ""
        return f"| {e['kernel']} | {e['mask']} | {e['seqlen']} | {e['direction']} | {e['status']} | {reason} | | | |"
    harness = f"{e['tflops']:.1f} ({e['tflops_p20']:.1f}–{e['tflops_p80']:.1f})"
    if "harness_tflops_each" in e:
        harness += "; " + ", ".join(f"{x:.1f}" for x in e["harness_tflops_each"][1:])
    if "bare_tflops_each" in e:
        bare = ", ".join(f"{x:.1f}" for x in e["bare_tflops_each"])
    else:
        bare = (e.get("bare_error") or "")[:60].replace("|", "/")
    ratio = f"{e['ratio']:.3f}" if "ratio" in e else ""
    return (f"| {e['kernel']} | {e['mask']} | {e['seqlen']} | {e['direction']} | ok | {harness} | {bare} | {ratio} "
            f"| {_how(e)} |")


if __name__ == "__main__":
    sys.exit(main())
