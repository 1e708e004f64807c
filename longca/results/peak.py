"""Each row's share of its GPU's dense tensor-core peak at the SM clock sampled while it was timed.

A GPU's peak is its SMs × the dense tensor-core FLOPs one SM does per clock × the SM clock.  The
nominal figures (989 TFLOP/s bf16 on an H100 SXM, 1,071 on an H200 at 1,980 MHz) assume the
highest clock, but a power-capped GPU under attention load runs lower (1,650-1,710 MHz through a
512K-token grid on an H200, 2026-11-29), so a row is set against the peak at the clock that was
sampled while its timed calls ran (samples with the GPU busy): ``scripts/gpu_grid.sh`` writes the samples (``gpu_clocks.csv``,
nvidia-smi twice a second) and a row's ``timed_at`` (UTC, to the second, taken when its timing
ended) and ``time_wall_s`` place its window.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pandas as pd

from . import gpus

# Dense tensor-core FLOPs per clock per SM (no sparsity), by architecture and input dtype: Hopper's
# 4th-generation tensor cores do 1,024 dense bf16/fp16 FMAs (2,048 FLOPs) per clock per tensor core,
# four per SM; fp8 twice that (NVIDIA's H100 whitepaper: 989.4 / 1,978.9 TFLOP/s at 1,830 MHz on
# 132 SMs).  float32 inputs are not listed: their rate depends on whether TF32 is allowed.
FLOPS_PER_CLOCK_PER_SM = {
    "sm_90": {"bfloat16": 4096, "float16": 4096, "float8_e4m3fn": 8192},
}

# A sample counts only while the GPU was busy: right after a call an idle GPU still reports its top
# clock (1,980 MHz at 0 % utilisation on the H200), which no timed call ran at.
BUSY_PCT = 50.0
# ``timed_at`` is truncated to the second: the timing ended within this much after it.
SLACK = timedelta(seconds=1)


def peak_tflops(device_name: str | None, dtype: str, clock_mhz: float) -> float | None:
    """The dense tensor-core peak of ``device_name`` for ``dtype`` inputs at ``clock_mhz`` (its SMs:
    ``gpus.SMS``)."""
    known = gpus.sms_of(device_name)
    rate = FLOPS_PER_CLOCK_PER_SM.get(known[0], {}).get(dtype) if known else None
    if rate is None:
        return None
    return known[1] * rate * clock_mhz * 1e6 / 1e12


def read_clocks(path: str | Path) -> pd.DataFrame:
    """``gpu_clocks.csv`` (nvidia-smi's CSV: timestamp, index, clocks.current.sm [MHz], …,
    utilization.gpu [%]) as ``time`` (UTC), ``sm_mhz`` and ``busy_pct``; the box's clock is UTC, as
    the rows' timestamps are."""
    raw = pd.read_csv(path, skipinitialspace=True)

    def column(prefix: str, unit: str) -> pd.Series:
        name = next(c for c in raw.columns if c.startswith(prefix))
        return raw[name].astype(str).str.removesuffix(unit).str.strip().astype(float)

    return pd.DataFrame({
        "time": pd.to_datetime(raw["timestamp"], format="%Y/%m/%d %H:%M:%S.%f", utc=True),
        "sm_mhz": column("clocks.current.sm", " MHz"),
        "busy_pct": column("utilization.gpu", " %"),
    })


def clock_during(clocks: pd.DataFrame, start, end) -> float | None:
    """The median SM clock of the busy samples in ``[start, end]``, or None when none fell there."""
    inside = clocks[(clocks["time"] >= start) & (clocks["time"] <= end) & (clocks["busy_pct"] >= BUSY_PCT)]
    return float(inside["sm_mhz"].median()) if len(inside) else None


def with_peak_share(rows: pd.DataFrame, clocks: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``sm_clock_mhz`` (sampled during the row's timed calls), ``peak_tflops_at_clock``
    and ``pct_of_peak`` (TFLOP/s over that peak, %); missing where no sample or no known peak."""
    out = rows.copy()
    clock, peak = [], []
    for r in out.itertuples(index=False):
        mhz = None
        if isinstance(getattr(r, "timed_at", None), str) and pd.notna(getattr(r, "time_wall_s", None)):
            end = pd.Timestamp(r.timed_at).tz_convert("UTC")
            # Every window the truncation allows: from the earliest start to the latest end.
            mhz = clock_during(clocks, end - timedelta(seconds=float(r.time_wall_s)), end + SLACK)
        clock.append(mhz)
        peak.append(peak_tflops(r.device_name, r.dtype, mhz) if mhz else None)
    out["sm_clock_mhz"] = pd.array(clock, dtype="Float64")
    out["peak_tflops_at_clock"] = pd.array(peak, dtype="Float64")
    out["pct_of_peak"] = 100 * out["tflops"].astype("Float64") / out["peak_tflops_at_clock"]
    return out
