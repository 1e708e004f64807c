"""Synthetic result tables for the plot and report tests (never for docs: the numbers are made up).

Rows go through the real schemas (``longca.results.parquet.to_table``), so the DataFrames have the columns
and types the Parquet tables have."""

from __future__ import annotations

import json

import pandas as pd

from longca.results.parquet import CP_SCHEMA, KERNEL_SCHEMA, to_table

SHAPE = {"batch": 1, "heads_q": 4, "heads_kv": 2, "head_dim": 16}
# Status of the cells that fail (kernel, mask, seqlen, direction) -> (status, reason)
FAILURES = {
    ("slow_kernel", "causal", 256, "fwd"): ("oom", "CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("slow_kernel", "causal", 256, "bwd"): ("oom", "CUDA out of memory. Tried to allocate 4.00 GiB"),
    ("fast_kernel", "sliding", 64, "bwd"): ("wrong", "relative L2 error 0.3 > tolerance 2e-3"),
    ("fast_kernel", "sliding", 128, "fwd"): ("error", "process killed by SIGSEGV (signal 11)"),
    ("fast_kernel", "sliding", 256, "fwd"): ("timeout", "ran past limits.cell_timeout_s (2 s)"),
}
HOSTILE_REASON = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">'


def kernel_rows(*, device: str = "cuda", hostile: bool = False, dtypes=("bfloat16",)) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for kernel, speed in (("fast_kernel", 2.0), ("slow_kernel", 1.0), ("never_kernel", 0)):
            for mask, density in (("causal", 0.5), ("sliding", 0.25)):
                for seqlen in (64, 128, 256):
                    for direction in ("fwd", "bwd"):
                        cell_id = f"{kernel}/{mask}/{dtype}_{direction}_{seqlen}"
                        area = int(density * seqlen * seqlen)
                        flops = 4.0 * area * SHAPE["heads_q"] * SHAPE["head_dim"] * (2.5 if direction == "bwd" else 1)
                        row = {"kind": "kernel", "cell_id": cell_id, "kernel": kernel, "mask": mask,
                               "pattern": mask, "seqlen": seqlen, "direction": direction, "dtype": dtype,
                               **SHAPE, "device": device, "warmup": 2, "reps": 5, "gate_seqlen": 64,
                               "area": area, "density": density, "flops": flops, "seed": 0,
                               "mask_params": "{}", "mask_params_resolved": json.dumps({"window": 16}),
                               "device_name": "Synthetic GPU" if device == "cuda" else "Synthetic CPU",
                               "cpu_name": "Synthetic CPU", "cpu_threads": 2, "hostname": "synthetic-host",
                               "torch_version": "2.13.0", "cuda_version": "12.8" if device == "cuda" else None,
                               "libraries": json.dumps({"triton": "3.5.0"}), "fingerprint": "f" * 16}
                        failure = FAILURES.get((kernel, mask, seqlen, direction))
                        if kernel == "never_kernel":
                            failure = ("unsupported", "mask kind INV_CAUSAL is not supported"
                                       + (" " + HOSTILE_REASON if hostile else ""))
                        if failure:
                            row.update(status=failure[0], reason=failure[1])
                        else:
                            tflops = speed * seqlen / 256 * (0.8 if direction == "bwd" else 1.0)
                            median = flops / (tflops * 1e12) * 1e3
                            row.update(status="ok", tflops=tflops, tflops_p20=tflops * 0.95,
                                       tflops_p80=tflops * 1.03, median_ms=median, p20_ms=median / 0.95,
                                       p80_ms=median / 1.03, gate_error=1e-3, gate_tolerance=2e-2,
                                       peak_mem_bytes=(seqlen * 2 ** 20 * (2 if kernel == "slow_kernel" else 1)
                                                       if device == "cuda" else None),
                                       gate_area=64 * 65 // 2, parts_reused=None)
                        rows.append(row)
    return rows


def kernels_df(**kw) -> pd.DataFrame:
    return to_table(kernel_rows(**kw), KERNEL_SCHEMA).to_pandas()


def cp_rows(*, dtype: str = "bfloat16", with_tokens_per_rank: bool = True) -> list[dict]:
    """Two strategies × cp_size 1, 2, 4 × 64 and 128 tokens per rank (weak scaling, as the CP grid is
    laid out), on the causal mask; scaling 0.9 (ring) and 0.7 (ulysses) against their cp_size-1
    cells, which run at the single-GPU fast_kernel's speed at that length; one OOM cell."""
    rows = []
    for strategy, factor in (("ring", 0.9), ("ulysses", 0.7)):
        for cp_size in (1, 2, 4):
            for tokens in (64, 128):
                seqlen = tokens * cp_size
                for direction in ("fwd", "bwd"):
                    cell_id = f"{strategy}/causal/{dtype}_{direction}_{tokens}x{cp_size}"
                    row = {"kind": "cp", "cell_id": cell_id, "strategy": strategy, "cp_size": cp_size,
                           "nodes": 1, "local_kernel": "fast_kernel",
                           "layout": json.dumps({"kind": "zigzag"}), "mask": "causal", "pattern": "causal",
                           "seqlen": seqlen, "direction": direction, "dtype": dtype, **SHAPE, "device": "cuda",
                           "backend": "nccl", "device_name": "Synthetic GPU", "hostnames": ["synthetic-host"] * cp_size,
                           "torch_version": "2.13.0", "nccl_version": "2.27.3"}
                    if with_tokens_per_rank:
                        row["tokens_per_rank"] = tokens
                    if strategy == "ulysses" and cp_size == 4 and tokens == 128:
                        row.update(status="oom", reason="CUDA out of memory on rank 3")
                    else:
                        # The single-GPU fast_kernel at `tokens` reaches 2 · tokens / 256 (× 0.8 backward).
                        tflops = 2.0 * tokens / 256 * (factor if cp_size > 1 else 1.0) * (0.8 if direction == "bwd" else 1.0)
                        row.update(status="ok", tflops_per_gpu=tflops, tflops_per_gpu_p20=tflops * 0.9,
                                   tflops_per_gpu_p80=tflops * 1.05, median_ms=1.0, p20_ms=1.1, p80_ms=0.95,
                                   peak_mem_bytes=seqlen * 2 ** 20, comm_bytes=seqlen * 4096,
                                   rank_area=[1000 + 10 * r for r in range(cp_size)], gate_error=1e-3,
                                   gate_tolerance=4e-2)
                    rows.append(row)
    return rows


def cp_df(**kw) -> pd.DataFrame:
    rows = cp_rows(**kw)
    df = to_table(rows, CP_SCHEMA).to_pandas()
    if "tokens_per_rank" not in df.columns and all("tokens_per_rank" in r for r in rows):
        df["tokens_per_rank"] = pd.array([r["tokens_per_rank"] for r in rows], dtype="Int64")
    return df


def empty_cp_df() -> pd.DataFrame:
    return to_table([], CP_SCHEMA).to_pandas()


CEILINGS = {"version": 1, "device": "cuda", "device_name": "Synthetic GPU", "cpu_threads": 2,
            "matmul": [{"kind": "matmul", "dtype": "bfloat16", "n": 8192, "tflops": 3.0, "tflops_p20": 2.9,
                        "tflops_p80": 3.1, "median_ms": 1.0, "p20_ms": 1.03, "p80_ms": 0.97, "flops": 1.1e12,
                        "warmup": 3, "reps": 10}]}


def figures(out, kernels: pd.DataFrame, cp: pd.DataFrame):
    """Every kind of figure the report shows, drawn from these tables into folder ``out``: the
    matrix, throughput and memory for two masks, CP scaling, efficiency and prediction for one."""
    from longca.results import plots, report

    data = plots.FigureData(kernels, cp, ceilings=CEILINGS, masks=["causal", "sliding"])
    return report.Figures(plots.draw_all(data, out, cp_masks=["causal"]))
