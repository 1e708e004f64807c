"""Timing people can trust: warm-up, per-iteration L2 flush, medians with their spread.

On CUDA the timed region is bracketed by CUDA events and the L2 cache is flushed (a buffer larger
than L2 is overwritten) before every iteration, so no iteration profits from the previous one's
cache.  On CPU ``time.perf_counter`` brackets the same region.  Statistics: median with 20th and
80th percentiles.

Two ways to decide how long to warm up and how often to repeat:

* by count (CP cells, CPU cells): ``warmup`` calls, then more until ``warmup_ms`` have passed, then
  ``reps`` timed calls;
* by time budget (kernel cells on a GPU; ``warmup_max_ms`` > 0), like ``triton.testing.do_bench``
  but with a warm-up that ends when the device is in its sustained state: after ``warmup`` calls
  (none for a CUDA graph's replays: the eager calls before capture made them, and the first window
  is compared with the host probe's call where that was one call), windows of calls are timed
  until two successive windows agree within ``STEADY_TOLERANCE`` and ``warmup_ms`` have passed
  (or ``warmup_max_ms`` is reached: the row then says not steady); the timed repetitions are then
  at least ``reps`` and enough to fill ``rep_ms``.  Two windows that
  agree catch what settles within a cell (allocator growth, caches, autotuning, a clock ramp), but
  not a long plateau: a power-capped GPU out of idle runs at boost clocks for a while, steadily
  (an H200 timed cuDNN's forward 5-12 % fast after a fixed short warm-up,
  lab/data/kernels_h200_2026-11-22.md).  So
  the first cell after the device was idle (nothing timed in this process for ``IDLE_GAP_S``)
  warms up for the whole ``warmup_max_ms`` and then until steady (at most as long again); a cell
  that follows another in a resident measuring process finds the device already loaded and needs
  only the steadiness check: the long warm-up is paid once per run, not once per cell.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100/H200: 50 MB)
# Two successive warm-up windows within this relative difference = the sustained state.  Wider than
# event-timing noise of one window (well under 1 %), narrower than the boost-to-sustained step (5-12 %).
STEADY_TOLERANCE = 0.02
# A warm-up window: at least this long, so that launch gaps and timer resolution do not dominate.
WINDOW_MS = 10.0
# Timed repetitions at most, whatever rep_ms asks for (a 10 us kernel and rep_ms = 100 -> 10,000).
MAX_REPS = 10_000
# Nothing timed for this long: the device may have dropped out of its sustained state, so the next
# warm-up is the long one.  A judgement, not a measured constant: at 0.5 s every cell after a
# compilation (FA4, Inductor: 1-8 s each) paid the long warm-up on an H200 (2 s a cell), while cells
# measured after such gaps agreed with do_bench's 25 ms warm-up (lab/data/workflow_cost_2026-11-22.md).
IDLE_GAP_S = 3.0
_last_busy: dict[str, float] = {}  # device -> when this process last finished timing on it

# The long-call rule.  A call whose eager probe took at least LONG_CALL_MS (a 1M-token causal
# forward: 35.9 s on an H200, per issue 74) is its own steady state: the clocks settle within it,
# and its launch is nothing beside it.  The budget rule would still make 5 timed calls, warm-up
# windows and a graph capture (whose private pool holds a second copy of what the call allocates):
# 9-10 calls, ~6 min for that forward.  Such a call is timed eagerly, LONG_CALL_REPS times, after
# the warm-up call and the probe; the median and the spread are over those (``timed_via`` says so).
LONG_CALL_MS = 1000.0
LONG_CALL_REPS = 3


def long_call(probe_ms: float | None) -> str | None:
    """``timed_via`` of a cell timed by the long-call rule, when its probe call (ms) was that long."""
    if probe_ms is None or probe_ms < LONG_CALL_MS:
        return None
    return (f"eager: long call ({probe_ms / 1e3:.1f} s >= {LONG_CALL_MS / 1e3:g} s): {LONG_CALL_REPS} timed "
            "calls after the warm-up and probe calls, not captured")


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    max_ms: float
    reps: int
    peak_mem_bytes: int | None
    warmup_calls: int | None = None       # calls made before the timed ones
    warmup_spent_ms: float | None = None  # how long the warm-up took
    warmup_steady: bool | None = None     # budget warm-up: reached the sustained state (None: by count)
    timed_via: str | None = None          # "graph" or "eager: <why not>" (CUDA graph mode; None: eager)
    host_ms: float | None = None          # CPU time to issue one eager call (CUDA graph mode)


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up did, and the pace it ended at (ms a call; sizes the timed repetitions)."""

    calls: int
    spent_ms: float
    steady: bool | None
    per_call_ms: float | None


def quantile(samples: list[float], q: float) -> float:
    """Linear-interpolated quantile, the same definition as numpy's default."""
    xs = sorted(samples)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples_ms: list[float], peak_mem_bytes: int | None = None, warm: WarmUp | None = None) -> Timing:
    if not samples_ms:
        raise ValueError("no timing samples")
    return Timing(statistics.median(samples_ms), quantile(samples_ms, 0.2), quantile(samples_ms, 0.8),
                  min(samples_ms), max(samples_ms), len(samples_ms), peak_mem_bytes,
                  warm.calls if warm else None, warm.spent_ms if warm else None, warm.steady if warm else None)


def measure(run: Callable[[], object], *, device: torch.device, warmup: int, reps: int,
            setup: Callable[[], object] | None = None, flush_l2: bool = True, warmup_ms: float = 0.0,
            warmup_max_ms: float = 0.0, rep_ms: float = 0.0, previous_ms: float | None = None) -> Timing:
    """Time ``run`` after the warm-up; ``setup`` runs untimed before each call.

    ``warmup_max_ms`` > 0 warms up until steady (at most that long; ``previous_ms``: see
    ``warm_up_until_steady``); ``rep_ms`` > 0 repeats until that much time is filled (at least
    ``reps`` times).  Both 0: counts only, as CP cells do."""
    check_counts(warmup, reps, warmup_ms, warmup_max_ms, rep_ms)
    if warmup_max_ms > 0:
        # Out of idle: the whole warmup_max_ms, then on until steady (at most as long again).
        idle = time.monotonic() - _last_busy.get(str(device), -math.inf) > IDLE_GAP_S
        warm = warm_up_until_steady(run, device=device, calls=warmup, min_ms=warmup_max_ms if idle else warmup_ms,
                                    max_ms=2 * warmup_max_ms if idle else warmup_max_ms, setup=setup,
                                    previous_ms=previous_ms)
    else:
        warm = _counted_warm_up(run, device=device, calls=warmup, min_ms=warmup_ms, setup=setup,
                                probe=rep_ms > 0)
    if rep_ms > 0:
        reps = min(max(reps, math.ceil(rep_ms / max(warm.per_call_ms, 1e-6))), MAX_REPS)
    samples = _sample(run, device, reps, setup, flush_l2)
    _last_busy[str(device)] = time.monotonic()
    return summarize(*samples, warm)


def check_counts(warmup: int, reps: int, warmup_ms: float = 0.0, warmup_max_ms: float = 0.0,
                 rep_ms: float = 0.0) -> None:
    if reps < 1 or warmup < 0 or warmup_ms < 0 or warmup_max_ms < 0 or rep_ms < 0:
        raise ValueError(f"need reps >= 1 and warmup, warmup_ms, warmup_max_ms, rep_ms >= 0, got reps={reps}, "
                         f"warmup={warmup}, warmup_ms={warmup_ms}, warmup_max_ms={warmup_max_ms}, rep_ms={rep_ms}")


def sample(run: Callable[[], object], *, device: torch.device, warmup: int, reps: int,
           setup: Callable[[], object] | None = None, flush_l2: bool = True, warmup_ms: float = 0.0,
           agree: Callable[[int], int] = lambda n: n) -> tuple[list[float], int | None]:
    """The per-iteration times (ms) of a count-based measurement and the peak memory (CUDA; else None).

    Warm-up: ``warmup`` calls, then more until ``warmup_ms`` have passed.  ``agree`` turns this
    process's count of extra calls into the one every participant uses: CP ranks must make the same
    number of calls (each call is a collective), so they pass the maximum over ranks.

    CP cells need the samples themselves: a step is as slow as its slowest rank, iteration by
    iteration."""
    check_counts(warmup, reps, warmup_ms)
    warm_up(run, device=device, calls=warmup, min_ms=warmup_ms, setup=setup, agree=agree)
    return _sample(run, device, reps, setup, flush_l2)


def _sample(run, device: torch.device, reps: int, setup, flush_l2: bool) -> tuple[list[float], int | None]:
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


def _counted_warm_up(run, *, device: torch.device, calls: int, min_ms: float, setup, probe: bool) -> WarmUp:
    """``warm_up`` with what it did; ``probe`` times one more call for the pace when none was taken."""
    start = time.perf_counter()
    made = warm_up(run, device=device, calls=calls, min_ms=min_ms, setup=setup)
    pace = None
    if probe:
        pace = _timed_window(run, device, 1, setup)
        made += 1
    return WarmUp(made, (time.perf_counter() - start) * 1e3, None, pace)


def warm_up_until_steady(run: Callable[[], object], *, device: torch.device, calls: int, min_ms: float,
                         max_ms: float, setup: Callable[[], object] | None = None,
                         tolerance: float = STEADY_TOLERANCE, previous_ms: float | None = None) -> WarmUp:
    """``calls`` calls (one-time costs: plans, compilation; 0 when they were made already), then timed
    windows of calls until two successive windows' pace agrees within ``tolerance`` and ``min_ms``
    have passed, or until ``max_ms`` have passed (then ``steady`` is False).  ``previous_ms``: the
    pace of a window of the same work made just before (a graph's eager probe call), which the first
    window is compared with."""
    start = time.perf_counter()
    for _ in range(calls):
        if setup:
            setup()
        run()
    made = calls
    previous = previous_ms
    pace = _timed_window(run, device, 1, setup)
    made += 1
    while True:
        elapsed_ms = (time.perf_counter() - start) * 1e3
        steady = previous is not None and abs(pace - previous) <= tolerance * previous
        if (steady and elapsed_ms >= min_ms) or (elapsed_ms >= max_ms and previous is not None):
            return WarmUp(made, elapsed_ms, steady, pace)
        n = max(1, math.ceil(WINDOW_MS / max(pace, 1e-6)))
        previous, pace = pace, _timed_window(run, device, n, setup)
        made += n


def _timed_window(run, device: torch.device, n: int, setup) -> float:
    """Milliseconds a call over ``n`` back-to-back calls (the device drained before and after)."""
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        if setup:
            setup()
        run()
    _synchronize(device)
    return max((time.perf_counter() - start) * 1e3 / n, 1e-6)


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
