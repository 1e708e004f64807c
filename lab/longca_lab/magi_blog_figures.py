"""The MagiAttention blog's H100 kernel figures as numbers, read off the bar charts' pixels.

    python lab/longca_lab/magi_blog_figures.py MAGI_REPO OUT.csv

The blog ("Long-Context Attention Benchmark", MagiAttention's docs/source/blog/cp_benchmark.md)
publishes its kernel-level H100 results only as images:
``assets/magi_attn/exp/kernel/h100/<mask>/<fwd|bwd>/flops_report.png`` in the repository
(github.com/SandAI-org/MagiAttention), one grouped bar chart per mask and direction, seqlens 1K–32K,
one bar per kernel, no value labels.  This reads each bar's height: the bars' colours (the charts'
legend) tell the kernels apart, the light-grey gridlines (every 100 TFLOPs/s) give the scale, and a
bar's top is the highest row where most of its width still has its colour (the series' line and
its diamond markers are thinner).  Checked by eye against the charts: within about ±3 TFLOPs/s.
A kernel the chart draws no bar for (out of memory, unsupported) gets no row.

MAGI_REPO is a clone (or bare mirror) of that repository; the images are read from its HEAD with
``git show``.  Writes ``figure, mask, direction, seqlen, kernel, tflops`` rows.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

# The charts' legend colours (RGB), and how far (sum of channel differences) a pixel may be from one.
PALETTE = {"fa2": (187, 172, 209), "fa3": (199, 95, 133), "cudnn": (255, 191, 171), "flex": (238, 216, 165),
           "flash_mask": (150, 199, 168), "sdpa": (83, 150, 159), "ffa": (71, 126, 184)}
COLOUR_TOLERANCE = 45
GRID_GREY, AXIS_GREY = 234, 244
GRID_STEP_TFLOPS = 100
SEQLENS = [1024, 2048, 4096, 8192, 16384, 32768]
# The blog's mask folders and the LongCA mask each one corresponds to (same name where the shape
# is the same; the document masks draw their documents from other length distributions).
MASKS = {"full_mask": "full", "causal_mask": "causal", "sw_causal_mask": "sliding_window_causal",
         "varlen_full_mask": "varlen_full", "varlen_causal_mask": "varlen_causal",
         "varlen_block_causal_mask": "varlen_block_causal"}

_NAMES = list(PALETTE)
_COLOURS = np.array([PALETTE[n] for n in _NAMES])


def kernel_of(pixels: np.ndarray) -> np.ndarray:
    """Per pixel (…, 3): the index of its legend colour, or -1."""
    distance = np.abs(pixels[..., None, :] - _COLOURS).sum(-1)
    best = distance.argmin(-1)
    return np.where(distance.min(-1) < COLOUR_TOLERANCE, best, -1)


def _runs(rows: list[int]) -> list[float]:
    """Centres of runs of consecutive row indices."""
    centres, start = [], rows[0]
    for prev, row in zip(rows, rows[1:] + [None]):
        if row != prev + 1:
            centres.append((start + prev) / 2)
            start = row
    return centres


# The charts' layout (all twelve share it, 11904 x 4704 px): six seqlen groups of seven bar slots,
# one per legend entry in legend order, measured on the full-mask forward chart.
FIRST_SLOT_X, SLOT_WIDTH, GROUP_PITCH = 1224, 207.7, 1732


def bars(image: np.ndarray) -> list[tuple[int, str, float]]:
    """``(seqlen, kernel, tflops)`` for every bar the chart draws."""
    height, width, _ = image.shape
    if (width, height) != (11904, 4704):
        raise ValueError(f"a {width} x {height} image: not laid out like the blog's kernel charts")
    column = image[:, FIRST_SLOT_X - 74]  # left of the first group: gridlines and axis only
    grid = _runs([y for y in range(height) if (np.abs(column[y] - GRID_GREY) <= 3).all()])
    axis = [y for y in range(height // 2, height) if (np.abs(column[y] - AXIS_GREY) <= 3).all()]
    if len(grid) < 2 or not axis:
        raise ValueError("no gridlines or axis found: not one of the blog's bar charts")
    base = (axis[0] + axis[-1]) / 2
    step = float(np.median(np.diff(grid)))  # pixels per GRID_STEP_TFLOPS
    probe = int(axis[0]) - 3  # just above the axis line: a bar of any height shows here
    out = []
    for g, seqlen in enumerate(SEQLENS):
        for k in range(len(_NAMES)):
            left = FIRST_SLOT_X + g * GROUP_PITCH + k * SLOT_WIDTH
            xs = np.arange(int(left) + 20, int(left + SLOT_WIDTH) - 20, 4)
            # A series' line may run along the axis across other bars: look a little higher too.
            shown = [y for y in range(probe, probe - 80, -4) if (kernel_of(image[y, xs]) == k).mean() > 0.6]
            if not shown:
                continue  # no bar: the chart marks E (out of memory) or X (unsupported) there
            top, gap = shown[0], 0
            for y in range(shown[0], 0, -1):
                if (kernel_of(image[y, xs]) == k).mean() > 0.6:
                    top, gap = y, 0
                else:
                    gap += 1
                    if gap > 40:  # past the lines that cross the bar: it has ended
                        break
            out.append((seqlen, _NAMES[k], (base - top) / step * GRID_STEP_TFLOPS))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    repo, out = Path(argv[0]), Path(argv[1])
    rows = []
    for folder, mask in MASKS.items():
        for direction in ("fwd", "bwd"):
            path = f"assets/magi_attn/exp/kernel/h100/{folder}/{direction}/flops_report.png"
            png = subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], capture_output=True, check=True)
            image = np.asarray(Image.open(io.BytesIO(png.stdout)).convert("RGB")).astype(np.int16)  # 0.3 GB, not 1.3
            rows += [(path, mask, direction, s, k, round(t)) for s, k, t in bars(image)]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["figure", "mask", "direction", "seqlen", "kernel", "tflops"])
        writer.writerows(rows)
    print(f"{len(rows)} bars from {len(MASKS) * 2} charts -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
