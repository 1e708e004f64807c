"""The machine's ceilings: what one device can do at best, measured, so figures can draw it as a line.

Today one ceiling: the dense matmul rate (``matmul_tflops``), the rate attention's two matmuls are
bounded by.  It is a real measurement, never a datasheet number: square ``n × n @ n × n`` products
(``2 n³`` FLOPs) after warm-up, timed by ``longca.execution.measure.timing`` (CUDA events on GPU, ``perf_counter`` on
CPU), median with the 20th and 80th percentiles.  ``n`` is the power of two (up to ``max_n``) with
the best probed rate among the sizes whose product takes at most about ``2 · target_ms``, so slow
dtypes on a CPU (bfloat16 has no fast CPU matmul) still measure in about a second.  ``results/ceilings.json`` holds one entry
per dtype of the grid (rule ``ceilings``, ``workflow/rules/plots.smk``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from ...attention.problem import FP8_DTYPES, parse_dtype
from . import env, timing
from ..cache.atomic import write_json_atomic

CEILINGS_VERSION = 1
MIN_N = 256
MAX_N = {"cpu": 2048, "cuda": 8192}
TARGET_MS = 50.0  # sizes double until a product takes longer than this


def product(n: int, device: torch.device, dtype: torch.dtype, gen: torch.Generator):
    """One ``n × n`` product in ``dtype`` as a call: ``torch.matmul`` into a preallocated output, or
    for fp8 ``torch._scaled_mm`` (fp8 × fp8 → bf16, unit scales, the second operand column-major as
    cuBLASLt's fp8 GEMM takes it): the dense rate an fp8 attention kernel is set against."""
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    if dtype in FP8_DTYPES:
        b = b.t().contiguous().t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return lambda: torch.matmul(a, b, out=out)


def _probe_ms(call, device: torch.device, target_ms: float) -> float:
    """Best of two synchronised products after a warm one (for choosing n, not the reported number);
    a product already far over the target is not repeated."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    times = []
    for _ in range(3):
        sync(device)
        start = time.perf_counter()
        call()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        if times[0] > 4 * target_ms:
            return times[0]
    return min(times[1:])


def choose_n(device: torch.device, dtype: torch.dtype, *, max_n: int | None = None,
             target_ms: float = TARGET_MS) -> int:
    """The power of two ``n`` (``MIN_N`` ≤ n ≤ ``max_n``) with the best probed rate among the sizes
    whose product takes at most about ``2 · target_ms``.

    Sizes double from ``MIN_N`` until a product takes longer than ``target_ms`` (the next would take
    ~8× longer).  Small products are latency-bound (and on a busy CPU every parallel region waits for
    its threads), so the best rate, not the first size that is "big enough", is what is timed."""
    max_n = max_n or MAX_N.get(device.type, MAX_N["cuda"])
    gen = torch.Generator(device="cpu").manual_seed(0)
    best_n, best_rate = MIN_N, 0.0
    n = MIN_N
    while n <= max(max_n, MIN_N):
        ms = max(_probe_ms(product(n, device, dtype, gen), device, target_ms), 1e-6)
        rate = 2.0 * n ** 3 / ms
        if rate > best_rate and (ms <= 2 * target_ms or n == MIN_N):
            best_n, best_rate = n, rate
        if ms > target_ms:
            break
        n *= 2
    return best_n


def matmul_tflops(device: str | torch.device, dtype: str | torch.dtype = "float32", *, n: int | None = None,
                  warmup: int = 3, reps: int = 10, max_n: int | None = None,
                  target_ms: float = TARGET_MS) -> dict[str, Any]:
    """Measured dense matmul rate on ``device`` in ``dtype``.

    Returns ``{"kind": "matmul", "dtype", "n", "flops", "median_ms", "p20_ms", "p80_ms", "tflops",
    "tflops_p20", "tflops_p80", "warmup", "reps"}``; ``tflops`` is ``2 n³ / median``."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch_dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    dtype_name = str(torch_dtype).removeprefix("torch.")
    n = n or choose_n(device, torch_dtype, max_n=max_n, target_ms=target_ms)
    gen = torch.Generator(device="cpu").manual_seed(0)
    call = product(n, device, torch_dtype, gen)
    # No L2 flush: each operand of the sizes used on GPU is larger than L2 already, and a ceiling is
    # the best the device does.
    t = timing.measure(call, device=device, warmup=warmup, reps=reps, flush_l2=False)
    flops = 2.0 * n ** 3
    return {
        "kind": "matmul",
        "dtype": dtype_name,
        "n": n,
        "flops": flops,
        "median_ms": t.median_ms,
        "p20_ms": t.p20_ms,
        "p80_ms": t.p80_ms,
        "tflops": flops / (t.median_ms * 1e-3) / 1e12,
        "tflops_p20": flops / (t.p80_ms * 1e-3) / 1e12,  # the slower (80th percentile) time
        "tflops_p80": flops / (t.p20_ms * 1e-3) / 1e12,
        "warmup": warmup,
        "reps": reps,
    }


def measure(device: str, dtypes: list[str], *, threads: int = 0, **kw) -> dict[str, Any]:
    """Every dtype's matmul ceiling on ``device``, with where it was measured."""
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    start = time.perf_counter()
    entries = [matmul_tflops(dev, dtype, **kw) for dtype in dtypes]
    environment = env.collect(dev if dev.type != "cuda" else torch.device("cuda", torch.cuda.current_device()))
    return {
        "version": CEILINGS_VERSION,
        "device": dev.type,
        "device_name": environment["device_name"],
        "hostname": environment["hostname"],
        "cpu_threads": environment["cpu_threads"],
        "torch_version": environment["torch_version"],
        "cuda_version": environment["cuda_version"],
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32) if dev.type == "cuda" else None,
        "gpu_slot": os.environ.get("CUDA_VISIBLE_DEVICES") if dev.type == "cuda" else None,
        "matmul": entries,
        "wall_s": time.perf_counter() - start,
    }


def write(device: str, dtypes: list[str], out: str | os.PathLike, *, threads: int = 0, **kw) -> dict[str, Any]:
    """Measure and write the ceilings; a measurement that fails (no usable device in this job) is
    written as no ceiling with its ``error``, so the figures and the report are still made (they
    draw no line) and the run goes on."""
    try:
        result = measure(device, dtypes, threads=threads, **kw)
    except Exception as exc:  # noqa: BLE001 — a missing line on a figure, not a failed run
        result = {"version": CEILINGS_VERSION, "device": device, "matmul": [],
                  "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
    write_json_atomic(result, out)
    return result


def load(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """The ceilings file, or None when there is none (figures then draw no line)."""
    if path is None or not Path(path).exists():
        return None
    with open(path) as f:
        return json.load(f)


def matmul_ceiling(ceilings: dict[str, Any] | None, dtype: str) -> dict[str, Any] | None:
    """The measured matmul entry for ``dtype``, or None."""
    for entry in (ceilings or {}).get("matmul", []):
        if entry.get("dtype") == dtype and entry.get("tflops"):
            return entry
    return None
