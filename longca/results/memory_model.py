"""What one call needs as a function of length, fitted on a table's measured peaks, and the longest
length a GPU's memory holds by it.

Per kernel × mask × direction × dtype × GPU model, the ok rows' ``peak_mem_bytes`` against ``seqlen``
are fitted by least squares on the relative error (a 1K row weighs as much as a 128K one):

    peak(n) = a + b·n              (inputs, outputs, gradients and statistics are linear in n)
    peak(n) = a + b·n + c·n²       where the linear fit misses a measured point by more than
                                   LINEAR_MISS and four or more points carry the quadratic term
                                   (a dense mask, a tile table: FlexAttention's BlockMask)

The longest length that fits a GPU is the largest n with peak(n) ≤ its memory (``gpus``).  The
model is checked twice on the rows themselves: held out (each group fitted without its longest ok
length, that length predicted; ``held_out_error``), and against the measured limits (the predicted
longest length between the longest ok and the first ``oom`` length, where the table has them:
``tables.longest_fits``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import gpus, tables

GROUP = ["kernel", "mask", "direction", "dtype", "device_name"]
# The linear fit "misses" when a measured point is this far off it (relative): peaks measured twice
# agree far closer than that, a quadratic term at the longest lengths does not.
LINEAR_MISS = 0.05
QUADRATIC_POINTS = 4  # three coefficients and one point to spare


@dataclass(frozen=True)
class MemoryFit:
    a: float
    b: float
    c: float
    lengths: tuple[int, ...]  # the lengths it was fitted on

    @property
    def terms(self) -> str:
        return "a + b·n + c·n²" if self.c else "a + b·n"

    def bytes(self, n: float) -> float:
        return self.a + self.b * n + self.c * n * n

    def longest(self, memory_bytes: float) -> int | None:
        """The largest length whose predicted need is within ``memory_bytes`` (None: not even one token)."""
        if self.bytes(1) > memory_bytes:
            return None
        if self.c > 0:
            root = (-self.b + math.sqrt(self.b ** 2 + 4 * self.c * (memory_bytes - self.a))) / (2 * self.c)
        elif self.b > 0:
            root = (memory_bytes - self.a) / self.b
        else:
            return None  # a need that does not grow with length: no limit this model can name
        return int(root)

    def extrapolated(self, n: int) -> bool:
        return n > max(self.lengths) or n < min(self.lengths)


def _solve(n: np.ndarray, y: np.ndarray, degree: int) -> np.ndarray:
    design = np.vander(n.astype(float), degree + 1, increasing=True) / y[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    return coef


def fit(seqlens, peaks) -> MemoryFit | None:
    """The memory model of one group's ok rows (lengths and their peaks); None under two lengths."""
    frame = pd.DataFrame({"n": seqlens, "y": peaks}).dropna()
    frame = frame[frame["y"] > 0].groupby("n", as_index=False)["y"].median()
    if len(frame) < 2:
        return None
    n, y = frame["n"].to_numpy(float), frame["y"].to_numpy(float)
    a, b = _solve(n, y, 1)
    miss = np.abs((a + b * n) / y - 1).max()
    if miss > LINEAR_MISS and len(frame) >= QUADRATIC_POINTS:
        a2, b2, c2 = _solve(n, y, 2)
        if c2 > 0:
            return MemoryFit(float(a2), float(b2), float(c2), tuple(int(x) for x in n))
    return MemoryFit(float(a), float(b), 0.0, tuple(int(x) for x in n))


def _ok_peaks(group: pd.DataFrame) -> pd.DataFrame:
    return group[(group["status"] == "ok") & group["peak_mem_bytes"].notna()]


def held_out_error(group: pd.DataFrame) -> tuple[int, float] | None:
    """(the group's longest ok length, the relative error of its peak predicted by the model fitted
    on the shorter lengths alone); None under three lengths with a peak."""
    ok = _ok_peaks(group)
    lengths = sorted(ok["seqlen"].unique())
    if len(lengths) < 3:
        return None
    last = lengths[-1]
    shorter = ok[ok["seqlen"] < last]
    model = fit(shorter["seqlen"], shorter["peak_mem_bytes"])
    measured = float(ok[ok["seqlen"] == last]["peak_mem_bytes"].median())
    return int(last), model.bytes(last) / measured - 1


def models(kernels: pd.DataFrame) -> dict[tuple, MemoryFit]:
    """Every group's model, keyed by ``GROUP``'s values (GPU rows only)."""
    gpu = _gpu_rows(kernels)
    out = {}
    for key, group in gpu.groupby(GROUP):
        ok = _ok_peaks(group)
        model = fit(ok["seqlen"], ok["peak_mem_bytes"])
        if model is not None:
            out[key] = model
    return out


def _gpu_rows(kernels: pd.DataFrame) -> pd.DataFrame:
    if not len(kernels) or "device" not in kernels or "peak_mem_bytes" not in kernels:
        return kernels.iloc[0:0]
    gpu = kernels[kernels["device"] == "cuda"].copy()
    if "device_name" not in gpu:
        gpu["device_name"] = "unknown"
    gpu["device_name"] = gpu["device_name"].fillna("unknown")
    return gpu


def limits(kernels: pd.DataFrame, masks: list[str] | None = None, memory_bytes: float | None = None) -> pd.DataFrame:
    """Per group: the model (its terms and coefficients), its held-out error, the longest length it
    predicts fits the group's GPU (``memory_bytes``, else the GPU model's own from ``gpus``), and the
    measured limits (``tables.longest_fits``: the longest ok length, the first ``oom`` length), with
    whether the prediction falls between them (``agrees``; None where the table brackets nothing)."""
    gpu = _gpu_rows(kernels)
    measured = {tuple(e[k] for k in GROUP): e for e in tables.longest_fits(gpu, masks, by=GROUP)}
    out = []
    for key, group in gpu.groupby(GROUP):
        ok = _ok_peaks(group)
        model = fit(ok["seqlen"], ok["peak_mem_bytes"])
        if model is None:
            continue
        memory = memory_bytes or gpus.memory_bytes(key[-1])
        longest = model.longest(memory) if memory else None
        e = measured.get(key, {})
        held = held_out_error(group)
        ok_len, oom_len = e.get("longest_ok"), e.get("first_oom")
        agrees = None
        if longest is not None and (ok_len or oom_len):
            agrees = (ok_len is None or longest >= ok_len) and (oom_len is None or longest < oom_len)
        out.append({**dict(zip(GROUP, key)), "terms": model.terms, "a": model.a, "b": model.b, "c": model.c,
                    "points": len(model.lengths), "held_out_seqlen": held[0] if held else None,
                    "held_out_error": held[1] if held else None, "memory_bytes": memory,
                    "predicted_longest": longest, "longest_ok": ok_len, "first_oom": oom_len, "agrees": agrees})
    order = {m: i for i, m in enumerate(tables.mask_order(gpu, masks))}
    out.sort(key=lambda e: (order.get(e["mask"], 1e9), e["direction"] != "fwd", e["kernel"], e["device_name"]))
    return pd.DataFrame(out)
