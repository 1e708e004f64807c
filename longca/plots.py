"""Figures from the results table (matplotlib, headless)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

# What a missing bar means, drawn where the bar would be.
STATUS_MARKERS = {"unsupported": "X", "oom": "E", "wrong": "W", "error": "!", "timeout": "T"}
DIRECTION_TITLES = {"fwd": "forward", "bwd": "backward"}


def _seqlen_label(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def kernel_throughput_figure(df: pd.DataFrame, mask: str, out: str | os.PathLike) -> Path:
    """TFLOPs/s by seqlen for one mask: grouped bars per kernel, forward and backward side by side."""
    sub = df[df["mask"] == mask]
    directions = [d for d in DIRECTION_TITLES if d in set(sub["direction"])] or ["fwd"]
    kernels = sorted(sub["kernel"].unique())
    seqlens = sorted(sub["seqlen"].unique())
    fig, axes = plt.subplots(1, len(directions), figsize=(5.5 * len(directions), 3.8), squeeze=False)
    width = 0.8 / max(len(kernels), 1)
    x = np.arange(len(seqlens))
    for ax, direction in zip(axes[0], directions):
        rows = sub[sub["direction"] == direction]
        top = max(rows.loc[rows["status"] == "ok", "tflops"].max(skipna=True) if len(rows) else 0, 0) or 1.0
        for i, kernel in enumerate(kernels):
            offset = x - 0.4 + width * (i + 0.5)
            for xi, seqlen in zip(offset, seqlens):
                cell = rows[(rows["kernel"] == kernel) & (rows["seqlen"] == seqlen)]
                if cell.empty:
                    continue
                r = cell.iloc[0]
                if r["status"] == "ok":
                    lo, hi = r["tflops"] - r["tflops_p20"], r["tflops_p80"] - r["tflops"]
                    ax.bar(xi, r["tflops"], width, color=f"C{i}", yerr=[[max(lo, 0)], [max(hi, 0)]],
                           capsize=2, label=kernel if seqlen == seqlens[0] else None)
                else:
                    ax.text(xi, top * 0.03, STATUS_MARKERS.get(r["status"], "?"), ha="center",
                            va="bottom", color=f"C{i}", fontweight="bold")
            ax.bar([], [], color=f"C{i}", label=None)
        ax.set_xticks(x, [_seqlen_label(s) for s in seqlens])
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOPs/s (median, bars: p20–p80)")
        ax.set_title(f"{mask} — {DIRECTION_TITLES[direction]}")
        ax.set_ylim(0, top * 1.15)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend_text = "  ".join(f"{m} = {s}" for s, m in STATUS_MARKERS.items())
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6) or 1, frameon=False)
    fig.text(0.5, 0.005, f"markers: {legend_text}", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 0.9))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
