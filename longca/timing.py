"""Timing people can trust: warm-up, per-iteration L2 flush, medians with their spread.

On CUDA the timed region is bracketed by CUDA events and the L2 cache is flushed (a buffer larger
than L2 is overwritten) before every iteration, so no iteration profits from the previous one's
cache.  On CPU ``time.perf_counter`` brackets the same region.  Repetitions are a count from
config; warm-up is a count *and* a minimum duration (``warmup_ms``): a GPU coming out of idle runs
at boost clocks for a while before power management settles, so a few warm-up calls of a
power-hungry kernel (cuDNN forward at 600+ TFLOPs/s) leave the first timed calls several per cent
faster than the sustained rate (measured on an H200: 1.05-1.12x after 2 calls or 250 ms).
Statistics: median with 20th and 80th percentiles.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100/H200: 50 MB)


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    max_ms: float
    reps: int
    peak_mem_bytes: int | None


def quantile(samples: list[float], q: float) -> float:
    """Linear-interpolated quantile, the same definition as numpy's default."""
    xs = sorted(samples)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples_ms: list[float], peak_mem_bytes: int | None = None) -> Timing:
    if not samples_ms:
        raise ValueError("no timing samples")
    return Timing(statistics.median(samples_ms), quantile(samples_ms, 0.2), quantile(samples_ms, 0.8),
                  min(samples_ms), max(samples_ms), len(samples_ms), peak_mem_bytes)


def measure(run: Callable[[], object], *, device: torch.device, warmup: int, reps: int,
            setup: Callable[[], object] | None = None, flush_l2: bool = True, warmup_ms: float = 0.0) -> Timing:
    """Time ``run`` ``reps`` times after the warm-up; ``setup`` runs untimed before each call."""
    return summarize(*sample(run, device=device, warmup=warmup, reps=reps, setup=setup, flush_l2=flush_l2,
                             warmup_ms=warmup_ms))


def sample(run: Callable[[], object], *, device: torch.device, warmup: int, reps: int,
           setup: Callable[[], object] | None = None, flush_l2: bool = True, warmup_ms: float = 0.0,
           agree: Callable[[int], int] = lambda n: n) -> tuple[list[float], int | None]:
    """The per-iteration times (ms) behind ``measure`` and the peak memory (CUDA; else None).

    Warm-up: ``warmup`` calls, then more until ``warmup_ms`` have passed.  ``agree`` turns this
    process's count of extra calls into the one every participant uses: CP ranks must make the same
    number of calls (each call is a collective), so they pass the maximum over ranks.

    CP cells need the samples themselves: a step is as slow as its slowest rank, iteration by
    iteration."""
    if reps < 1 or warmup < 0 or warmup_ms < 0:
        raise ValueError(f"need reps >= 1, warmup >= 0 and warmup_ms >= 0, got reps={reps}, warmup={warmup}, "
                         f"warmup_ms={warmup_ms}")
    warm_up(run, device=device, calls=warmup, min_ms=warmup_ms, setup=setup, agree=agree)
    if device.type == "cuda":
        return _sample_cuda(run, device, reps, setup, flush_l2)
    samples = []
    for _ in range(reps):
        if setup:
            setup()
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples, None


def warm_up(run: Callable[[], object], *, device: torch.device, calls: int, min_ms: float = 0.0,
            setup: Callable[[], object] | None = None, agree: Callable[[int], int] = lambda n: n) -> int:
    """Call ``run`` ``calls`` times, then as many more as fill ``min_ms``; return the total made.

    The extra count comes from the pace of one probe call made after the counted ones: the first
    calls carry one-time costs (cuDNN plan selection, Triton or Inductor compilation, allocator
    growth) that can take longer than ``min_ms`` on their own, so a pace measured over them would
    leave the GPU barely warmed up (the likely reason an H200 cell with a "1 s" warm-up still timed
    cuDNN's forward 11-13 % above its sustained rate).  Counting the calls ahead (instead
    of synchronising after each) lets every CP rank agree on the number before making them."""
    if min_ms > 0:
        calls = max(calls, 1)
    for _ in range(calls):
        if setup:
            setup()
        run()
    if min_ms <= 0:
        return calls
    _synchronize(device)
    if setup:
        setup()
    start = time.perf_counter()
    run()
    _synchronize(device)
    per_call_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    extra = agree(max(0, math.ceil(min_ms / per_call_ms) - 1))
    for _ in range(extra):
        if setup:
            setup()
        run()
    return calls + 1 + extra


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sample_cuda(run, device, reps, setup, flush_l2) -> tuple[list[float], int]:
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device) if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    _synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    for i in range(reps):
        if setup:
            setup()
        if flush is not None:
            flush.zero_()
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    # The flush buffer is ours, not the kernel's: leave it out of the peak.
    peak_kernel = peak - (flush.numel() if flush is not None else 0)
    del flush
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return samples, max(peak_kernel, base)
