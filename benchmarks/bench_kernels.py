"""Does the harness measure what a bare loop measures?  (GPU; issue: kernels.)

For each kernel × mask × seqlen × direction: one LongCA cell (``longca.cell.run_cell``: gate, then
CUDA-event timing with L2 flush, median of ``--reps``) and, in the same process right after it, a
bare ``triton.testing.do_bench`` loop of the same call on the same shapes (median, its own L2
flush).  The two TFLOPs/s must agree within 3 %.  Prints a markdown table; writes every row as JSON
lines to ``--out``.

    PYTHONPATH=. python benchmarks/bench_kernels.py --out /tmp/bench.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

from longca import kernels
from longca.cell import CellSpec, run_cell, time_kernel
from longca.flops import attention_flops
from longca.problem import Problem, parse_dtype

MASKS = {
    "full": {},
    "causal": {},
    "varlen_causal": {},
    "sliding_window_causal": {},
}


def side_by_side(kernel_name: str, spec: CellSpec) -> dict:
    """Bare do_bench, the harness's timing again, bare do_bench again (B A B after the cell's A).

    GPU clocks drift with sustained load, so whichever loop runs second is penalised; alternating
    and averaging the pairs cancels most of it.  Each number is a median over its own loop."""
    from triton.testing import do_bench

    kernel = kernels.get(kernel_name)
    problem = Problem(spec.mask, spec.seqlen, spec.batch, spec.heads_q, spec.heads_kv, spec.head_dim,
                      parse_dtype(spec.dtype), torch.device("cuda"), spec.direction, spec.seed, spec.mask_params)
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    prepared = kernel.prepare(problem)
    if spec.direction == "bwd":
        out = kernel.forward(q, k, v, prepared)
        fn = lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)  # noqa: E731
    else:
        fn = lambda: kernel.forward(q, k, v, prepared)  # noqa: E731
    flops = attention_flops(problem.mask, spec.heads_q, spec.head_dim, spec.direction, spec.batch)
    b1 = do_bench(fn, warmup=50, rep=200, return_mode="median")
    del fn, prepared
    if spec.direction == "bwd":
        del out
    h2, _ = time_kernel(kernel, problem, spec.warmup, spec.reps)
    prepared = kernel.prepare(problem)
    if spec.direction == "bwd":
        out = kernel.forward(q, k, v, prepared)
        fn = lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)  # noqa: E731
    else:
        fn = lambda: kernel.forward(q, k, v, prepared)  # noqa: E731
    b2 = do_bench(fn, warmup=50, rep=200, return_mode="median")
    del q, k, v, grad_out, prepared, fn
    torch.cuda.empty_cache()
    tf = lambda ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
    return {"bare_ms": [b1, b2], "harness2_ms": h2.median_ms, "bare_tflops": (tf(b1) + tf(b2)) / 2,
            "bare_tflops_each": [tf(b1), tf(b2)], "harness2_tflops": tf(h2.median_ms)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", nargs="*", default=None)
    ap.add_argument("--masks", nargs="*", default=list(MASKS))
    ap.add_argument("--seqlens", nargs="*", type=int, default=[8192, 16384, 32768])
    ap.add_argument("--directions", nargs="*", default=["fwd", "bwd"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="bench_kernels.jsonl")
    args = ap.parse_args()

    names = args.kernels or [n for n in kernels.names() if not kernels.get(n).available()
                             and n not in ("sdpa_math",) and not n.startswith("test_")]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  kernels: {', '.join(names)}",
          flush=True)
    rows = []
    with open(args.out, "a") as sink:
        for seqlen in args.seqlens:
            for mask in args.masks:
                for direction in args.directions:
                    for name in names:
                        spec = CellSpec(kernel=name, mask=mask, seqlen=seqlen, direction=direction, dtype="bfloat16",
                                        batch=1, heads_q=64, heads_kv=8, head_dim=128, mask_params=MASKS.get(mask, {}),
                                        warmup=args.warmup, reps=args.reps, gate_seqlen=1024, device="cuda",
                                        seed=1)  # seed 0 draws one 16K+ document: no packing below 32K
                        t0 = time.time()
                        row = run_cell(spec)
                        entry = {k: row.get(k) for k in ("kernel", "mask", "seqlen", "direction", "status", "reason",
                                                          "tflops", "tflops_p20", "tflops_p80", "median_ms",
                                                          "peak_mem_bytes", "gate_error", "notes", "device_name")}
                        if row["status"] == "ok":
                            try:
                                entry.update(side_by_side(name, spec))
                                entry["harness_tflops"] = (entry["tflops"] + entry["harness2_tflops"]) / 2
                                entry["ratio"] = entry["harness_tflops"] / entry["bare_tflops"]
                            except Exception as exc:  # noqa: BLE001
                                entry["bare_error"] = traceback.format_exception_only(type(exc), exc)[-1].strip()
                        entry["wall_s"] = time.time() - t0
                        rows.append(entry)
                        sink.write(json.dumps(entry, default=str) + "\n")
                        sink.flush()
                        print(_line(entry), flush=True)
    print()
    print("| kernel | mask | seqlen | dir | status | harness TFLOPs/s: cell (p20–p80), again | do_bench TFLOPs/s: before, after "
          "| ratio of means |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for e in rows:
        print(_line(e))
    bad = [e for e in rows if "ratio" in e and abs(e["ratio"] - 1) > 0.03]
    print(f"\n{len([e for e in rows if 'ratio' in e])} timed cells; {len(bad)} outside ±3 % of do_bench")
    return 0


def _line(e: dict) -> str:
    if e["status"] != "ok":
        reason = (e.get("reason") or "")[:70].replace("|", "/")
        return f"| {e['kernel']} | {e['mask']} | {e['seqlen']} | {e['direction']} | {e['status']} | {reason} | | |"
    bare = f"{e['bare_tflops']:.1f}" if "bare_tflops" in e else e.get("bare_error", "")[:40]
    ratio = f"{e['ratio']:.3f}" if "ratio" in e else ""
    harness = f"{e['tflops']:.1f} ({e['tflops_p20']:.1f}–{e['tflops_p80']:.1f})"
    if "harness2_tflops" in e:
        harness += f", {e['harness2_tflops']:.1f}"
        bare = " , ".join(f"{x:.1f}" for x in e["bare_tflops_each"])
    return f"| {e['kernel']} | {e['mask']} | {e['seqlen']} | {e['direction']} | ok | {harness} | {bare} | {ratio} |"


if __name__ == "__main__":
    sys.exit(main())
