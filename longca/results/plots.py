"""Figures from the results tables (matplotlib, headless).

Every builder takes the tables as pandas DataFrames and returns a ``matplotlib.figure.Figure``;
``save`` writes it atomically.  Kernel figures come from ``results/kernels.parquet``, CP figures
from ``results/cp.parquet`` (plus the kernel table for the single-GPU baseline), machine ceilings
from ``results/ceilings.json`` (``longca.execution.measure.ceilings``).  A cell that did not produce a number is
drawn as its status's marker (``STATUS_MARKERS``): at its point's x, below the lines; a wrong result
is never drawn as a speed.  What is drawn (best values, CP efficiency, markers, labels) comes from
``tables``, the same tables the report shows; this module only draws.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory
from PIL import Image  # matplotlib's own dependency

from ..execution.measure.ceilings import matmul_ceiling  # noqa: E402
from . import tables  # noqa: E402
from .figures import FIGURES, masks_of  # noqa: E402
from .tables import (  # noqa: E402
    DIRECTION_TITLES,
    STATUS_LABELS,
    STATUS_MARKERS,
    best_per_kernel_mask,
    cp_efficiency,
    devices_text,
    has_peak_memory,
    ok_rows,
    seqlen_label,
    status_marker,
    tokens_per_rank,
)

DPI = 110


def series_colors(names: Iterable[str]) -> dict[str, Any]:
    """One stable colour per name (sorted), the same in every figure of a report."""
    names = sorted(set(names))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _panel_title(mask: str | None, direction: str, dtype: str, many_dtypes: bool) -> str:
    parts = [mask] if mask else []
    parts.append(DIRECTION_TITLES.get(direction, direction))
    if many_dtypes:
        parts.append(dtype)
    return " — ".join(parts)


def marker_legend_handles() -> list[Line2D]:
    """Legend entries for the status markers (every status, so every figure's legend is the same)."""
    return [Line2D([], [], linestyle="none", marker=f"${m}$", markersize=9, color="0.2",
                   label=f"{m} = {STATUS_LABELS[s]}") for s, m in STATUS_MARKERS.items()]


def _ceiling_line(ax, ceilings: dict | None, dtype: str, *, per: str = "") -> float | None:
    entry = matmul_ceiling(ceilings, dtype)
    if not entry:
        return None
    ax.axhline(entry["tflops"], color="0.25", linestyle="--", linewidth=1.2, zorder=1,
               label=f"matmul ceiling{per}, {dtype}: {entry['tflops']:.3g} TFLOPs/s")
    return float(entry["tflops"])


def _empty_figure(message: str, title: str = "") -> Figure:
    fig = plt.figure(figsize=(6, 2.2))
    if title:
        fig.suptitle(title)
    fig.text(0.5, 0.5, message, ha="center", va="center", wrap=True, color="0.3")
    return fig


def _finish(fig: Figure, series: list) -> None:
    """Legends to the right of the panels: the series (and ceiling lines) on top, the status markers
    below (every status, so each figure's marker legend is the same)."""
    fig.tight_layout()
    if series:
        fig.add_artist(fig.legend(handles=series, loc="upper left", bbox_to_anchor=(1.0, 0.98), frameon=False,
                                  fontsize=8))
    fig.legend(handles=marker_legend_handles(), loc="lower left", bbox_to_anchor=(1.0, 0.02), frameon=False,
               fontsize=8, title="cell without a number", title_fontsize=8, alignment="left")


# --- kernels ---------------------------------------------------------------------------------


# Line markers per kernel (in the kernel's colour), so 14 lines stay apart where colours are close.
LINE_MARKERS = ["o", "s", "^", "D", "v", "P", "<", ">", "h", "p", "*", "d", "8", "H"]


def series_markers(names: Iterable[str]) -> dict[str, str]:
    """One stable line marker per name (sorted), like ``series_colors``."""
    return {name: LINE_MARKERS[i % len(LINE_MARKERS)] for i, name in enumerate(sorted(set(names)))}


def _status_band(ax, failed: list[tuple[float, str, str, Any]], top: float) -> None:
    """Status markers at the bottom of a panel, in a band below zero: ``failed`` are ``(x, kernel,
    status, colour)``; each kernel with a marker in the panel has its own row of the band (kernel
    order, first at the top), so one kernel's markers line up across the lengths."""
    kernels = sorted({k for _, k, _, _ in failed})
    ax.set_ylim(0, top * 1.12)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6))
    if not kernels:
        return
    ticks = [t for t in ax.get_yticks() if 0 <= t <= top * 1.12]
    band = min(0.05 * len(kernels) + 0.02, 0.4)
    ax.set_ylim(-band * top * 1.12 / (1 - band), top * 1.12)
    ax.set_yticks(ticks)
    ax.axhline(0, color="0.6", linewidth=0.8, zorder=1)
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for x, kernel, status, color in failed:
        slot = len(kernels) - 1 - kernels.index(kernel)
        ax.text(x, band * (slot + 0.5) / len(kernels), status_marker(status), transform=trans, ha="center",
                va="center", color=color, fontweight="bold", fontsize=9, zorder=3, gid=f"marker-{status}")


def kernel_throughput_figure(df: pd.DataFrame, mask: str, ceilings: dict | None = None,
                             colors: dict | None = None) -> Figure:
    """TFLOPs/s against sequence length for one mask (log2-spaced lengths): a line with markers per
    kernel; a panel per direction (and a row of panels per dtype).

    Points are the median, error bars the p20–p80 spread; where a kernel has no number at a length,
    its status marker (X unsupported, E out of memory, …) is drawn in the kernel's colour at the
    bottom of the panel, below zero; the dashed line is the measured matmul ceiling of the dtype."""
    sub = df[df["mask"] == mask]
    if sub.empty:
        return _empty_figure(f"no kernel cells for mask {mask}", title=mask)
    colors = colors or series_colors(df["kernel"])
    shapes = series_markers(df["kernel"])
    kernels = sorted(sub["kernel"].unique())
    seqlens = sorted(int(s) for s in sub["seqlen"].unique())
    directions, dtypes = tables.directions(sub), tables.dtypes(sub)
    ncols, nrows = len(directions), len(dtypes)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(5.5, 0.8 * len(seqlens) + 2.5) * ncols, 4.2 * nrows + 0.6),
                             squeeze=False)
    ceiling_handles = {}
    for r, dtype in enumerate(dtypes):
        for c, direction in enumerate(directions):
            ax = axes[r][c]
            rows = sub[(sub["direction"] == direction) & (sub["dtype"] == dtype)]
            ok = ok_rows(rows)
            ceiling = _ceiling_line(ax, ceilings, dtype)
            top = max([float(ok["tflops_p80"].max()) if ok["tflops_p80"].notna().any() else 0.0,
                       float(ok["tflops"].max()) if len(ok) else 0.0, ceiling or 0.0]) or 1.0
            failed = []
            for kernel in kernels:
                kr = rows[rows["kernel"] == kernel]
                pts = ok_rows(kr).drop_duplicates("seqlen").set_index("seqlen").sort_index()
                if len(pts):  # a length without a number between two with one breaks the line
                    span = [s for s in seqlens if pts.index[0] <= s <= pts.index[-1]]
                    pts = pts.reindex(pd.Index(span, name="seqlen")).reset_index()
                    lo = (pts["tflops"] - pts["tflops_p20"]).clip(lower=0).fillna(0)
                    hi = (pts["tflops_p80"] - pts["tflops"]).clip(lower=0).fillna(0)
                    bars = ax.errorbar(pts["seqlen"].astype(float), pts["tflops"], yerr=[lo, hi],
                                       color=colors[kernel], marker=shapes[kernel], markersize=4.5, linewidth=1.4,
                                       capsize=2, elinewidth=0.8, zorder=2, label=kernel)
                    bars.lines[0].set_gid(f"kernel-{kernel}")
                failed += [(float(row.seqlen), kernel, row.status, colors[kernel])
                           for row in kr.itertuples(index=False) if row.status != "ok"]
            _status_band(ax, failed, top)
            ax.set_xscale("log", base=2)
            ax.set_xticks([float(s) for s in seqlens], [seqlen_label(s) for s in seqlens])
            ax.minorticks_off()
            ax.set_xlim(seqlens[0] / 2 ** 0.4, seqlens[-1] * 2 ** 0.4)
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel("TFLOPs/s (median; bars p20–p80)")
            ax.set_title(_panel_title(mask, direction, dtype, nrows > 1), fontsize=10)
            ax.grid(alpha=0.3, zorder=0)
            for h in ax.get_lines():
                if h.get_label().startswith("matmul ceiling"):
                    ceiling_handles.setdefault(h.get_label(), h)
    handles = [Line2D([], [], color=colors[k], marker=shapes[k], markersize=5, label=k) for k in kernels]
    _finish(fig, handles + list(ceiling_handles.values()))
    return fig


def memory_model_figure(df: pd.DataFrame, mask: str, colors: dict | None = None) -> Figure:
    """Per kernel on one mask: the measured peaks (points), the memory model fitted on them
    (``memory_model``; a line out to the longest length it predicts fits), the GPU's memory (dashed)
    and that length (a tick on it); a panel per direction (and dtype), log-log."""
    from . import gpus, memory_model

    sub = df[df["mask"] == mask]
    fitted = memory_model.models(sub)
    if not fitted:
        return _empty_figure("no memory model: it is fitted on GPU rows' peak memory at two or more lengths",
                             title=f"{mask} — memory model")
    colors = colors or series_colors(df["kernel"])
    directions, dtypes = tables.directions(sub), tables.dtypes(sub)
    ncols, nrows = len(directions), len(dtypes)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 3.6 * nrows + 1), squeeze=False)
    shown: set[str] = set()
    for r, dtype in enumerate(dtypes):
        for c, direction in enumerate(directions):
            ax = axes[r][c]
            top = 0.0
            for (kernel, m, dirn, dt, device), model in sorted(fitted.items()):
                if (dirn, dt) != (direction, dtype):
                    continue
                memory = gpus.memory_bytes(device)
                longest = model.longest(memory) if memory else None
                end = max(longest or 0, max(model.lengths))
                xs = np.geomspace(min(model.lengths), end, 60)
                ax.plot(xs, [model.bytes(x) / 2**30 for x in xs], color=colors[kernel], lw=1.2, zorder=2)
                rows = sub[(sub["kernel"] == kernel) & (sub["direction"] == direction) & (sub["dtype"] == dtype)
                           & (sub["status"] == "ok") & sub["peak_mem_bytes"].notna()]
                ax.plot(rows["seqlen"], rows["peak_mem_bytes"] / 2**30, "o", color=colors[kernel], ms=4, zorder=3)
                if memory:
                    ax.axhline(memory / 2**30, color="0.4", ls="--", lw=0.8, zorder=1)
                    top = max(top, memory / 2**30)
                    if longest:
                        ax.plot([longest], [model.bytes(longest) / 2**30], "|", color=colors[kernel], ms=12, mew=2)
                shown.add(kernel)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            if top:
                ax.set_ylim(top=top * 1.5)
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel("one call's peak memory (GiB)")
            ax.set_title(_panel_title(mask, direction, dtype, nrows > 1), fontsize=10)
            ax.grid(alpha=0.3, which="both")
    _finish(fig, [Line2D([], [], color=colors[k], marker="o", label=k) for k in sorted(shown)])
    return fig


def kernel_memory_figure(df: pd.DataFrame, mask: str, colors: dict | None = None) -> Figure:
    """Peak device memory by seqlen per kernel for one mask; a panel per direction (and dtype).

    Peak memory is recorded on GPU only; a CPU run gets a figure that says so."""
    sub = df[df["mask"] == mask]
    if sub.empty:
        return _empty_figure(f"no kernel cells for mask {mask}", title=mask)
    if not has_peak_memory(sub):
        return _empty_figure(f"peak memory is recorded on GPU only; these cells ran on: {devices_text(sub)}",
                             title=f"{mask} — peak memory")
    colors = colors or series_colors(df["kernel"])
    kernels = sorted(sub["kernel"].unique())
    seqlens = sorted(int(s) for s in sub["seqlen"].unique())
    directions, dtypes = tables.directions(sub), tables.dtypes(sub)
    ncols, nrows = len(directions), len(dtypes)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 3.6 * nrows + 1), squeeze=False)
    x = np.arange(len(seqlens))
    for r, dtype in enumerate(dtypes):
        for c, direction in enumerate(directions):
            ax = axes[r][c]
            rows = sub[(sub["direction"] == direction) & (sub["dtype"] == dtype)]
            mem = rows.loc[rows["peak_mem_bytes"].notna(), "peak_mem_bytes"] / 2 ** 20
            low = float(mem.min()) if len(mem) else 1.0
            for i, kernel in enumerate(kernels):
                kr = rows[rows["kernel"] == kernel].set_index("seqlen")
                xs, ys = [], []
                for xi, seqlen in zip(x, seqlens):
                    if seqlen not in kr.index:
                        continue
                    row = kr.loc[seqlen]
                    row = row.iloc[0] if isinstance(row, pd.DataFrame) else row
                    if row["status"] == "ok" and pd.notna(row["peak_mem_bytes"]):
                        xs.append(xi)
                        ys.append(row["peak_mem_bytes"] / 2 ** 20)
                    elif row["status"] != "ok":
                        off = (i - (len(kernels) - 1) / 2) * 0.08
                        ax.text(xi + off, low / 1.6, status_marker(row["status"]), ha="center", va="center",
                                color=colors[kernel], fontweight="bold", fontsize=11,
                                gid=f"marker-{row['status']}")
                if xs:
                    ax.plot(xs, ys, marker="o", color=colors[kernel], label=kernel, zorder=2)
            ax.set_yscale("log")
            ax.set_ylim(low / 2.5, (float(mem.max()) if len(mem) else 1.0) * 2)
            ax.set_xticks(x, [seqlen_label(s) for s in seqlens])
            ax.set_xlim(-0.5, len(seqlens) - 0.5)
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel("peak allocated memory (MiB)")
            ax.set_title(_panel_title(mask, direction, dtype, nrows > 1), fontsize=10)
            ax.grid(alpha=0.3, which="both")
    _finish(fig, [Line2D([], [], color=colors[k], marker="o", label=k) for k in kernels])
    return fig


def kernel_mask_matrix_figure(df: pd.DataFrame, masks: list[str] | None = None) -> Figure:
    """Kernel × mask heatmap of the best TFLOPs/s over seqlens (a panel per direction and dtype).

    Each cell says the best value and the length it was reached at; below it, the markers of the
    lengths that produced no number.  A cell where nothing ran shows only its markers."""
    if df.empty:
        return _empty_figure("no kernel cells")
    best = best_per_kernel_mask(df)
    masks = [m for m in (masks or []) if m in set(df["mask"])] or list(dict.fromkeys(df["mask"]))
    kernels = sorted(df["kernel"].unique())
    directions, dtypes = tables.directions(df), tables.dtypes(df)
    ncols, nrows = len(directions), len(dtypes)
    cw, ch = max(0.95 * len(masks) + 2.6, 5.0), max(0.5 * len(kernels) + 1.6, 2.6)
    fig, axes = plt.subplots(nrows, ncols, figsize=(cw * ncols, ch * nrows + 0.6), squeeze=False)
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")
    for r, dtype in enumerate(dtypes):
        for c, direction in enumerate(directions):
            ax = axes[r][c]
            panel = best[(best["direction"] == direction) & (best["dtype"] == dtype)].set_index(["kernel", "mask"])
            grid = np.full((len(kernels), len(masks)), np.nan)
            for i, k in enumerate(kernels):
                for j, m in enumerate(masks):
                    if (k, m) in panel.index:
                        grid[i, j] = panel.loc[(k, m), "tflops"]
            finite = grid[np.isfinite(grid)]
            vmax = float(finite.max()) if finite.size else 1.0
            image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=vmax, aspect="auto")
            for i, k in enumerate(kernels):
                for j, m in enumerate(masks):
                    if (k, m) not in panel.index:
                        ax.text(j, i, "–", ha="center", va="center", color="0.5", fontsize=8)
                        continue
                    cell = panel.loc[(k, m)]
                    value, failed = grid[i, j], cell["failed"]
                    dark = np.isfinite(value) and value < 0.6 * vmax
                    color = "white" if dark else "black"
                    if np.isfinite(value):
                        text = f"{value:.3g}\n@{seqlen_label(cell['seqlen'])}" + (f"\n{failed}" if failed else "")
                        ax.text(j, i, text, ha="center", va="center", color=color, fontsize=7, linespacing=1.1)
                    else:
                        ax.text(j, i, failed or "?", ha="center", va="center", color="#a11", fontsize=11,
                                fontweight="bold", gid="marker-cell")
            ax.set_xticks(range(len(masks)), masks, rotation=35, ha="right", fontsize=8)
            ax.set_yticks(range(len(kernels)), kernels, fontsize=8)
            ax.set_title(f"best TFLOPs/s — {_panel_title(None, direction, dtype, True)}", fontsize=10)
            fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02).set_label("TFLOPs/s", fontsize=8)
    _finish(fig, [])
    return fig


def device_ratio_figure(ratios: pd.DataFrame, label_a: str, label_b: str,
                        masks: list[str] | None = None) -> Figure:
    """Mask × sequence-length heatmap of one machine's fastest kernel over another's
    (``tables.best_kernel_ratios``), a panel per direction and dtype; 1.0 is white, the second
    machine faster is blue.  A cell with no kernel measured ok on both shows "–"."""
    if ratios.empty:
        return _empty_figure(f"no kernel cell measured ok on both {label_a} and {label_b}")
    masks = [m for m in (masks or []) if m in set(ratios["mask"])] or list(dict.fromkeys(ratios["mask"]))
    seqlens = sorted(ratios["seqlen"].unique())
    directions, dtypes = tables.directions(ratios), tables.dtypes(ratios)
    spread = float(np.nanmax(np.abs(np.log(ratios["ratio"].to_numpy()))))
    limit = max(1.1, float(np.exp(spread)))  # symmetric on a log scale, at least ±10 %
    norm = LogNorm(vmin=1 / limit, vmax=limit)
    cmap = plt.get_cmap("RdBu").with_extremes(bad="#eeeeee")
    cw, ch = max(0.8 * len(seqlens) + 3.2, 5.0), max(0.36 * len(masks) + 1.4, 2.6)
    fig, axes = plt.subplots(len(dtypes), len(directions), figsize=(cw * len(directions), ch * len(dtypes) + 0.6),
                             squeeze=False)
    for r, dtype in enumerate(dtypes):
        for c, direction in enumerate(directions):
            ax = axes[r][c]
            panel = ratios[(ratios["direction"] == direction) & (ratios["dtype"] == dtype)]
            panel = panel.set_index(["mask", "seqlen"])["ratio"]
            grid = np.full((len(masks), len(seqlens)), np.nan)
            for i, m in enumerate(masks):
                for j, n in enumerate(seqlens):
                    if (m, n) in panel.index:
                        grid[i, j] = panel.loc[(m, n)]
            image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
            for i in range(len(masks)):
                for j in range(len(seqlens)):
                    value = grid[i, j]
                    text = f"{value:.2f}" if np.isfinite(value) else "–"
                    strong = np.isfinite(value) and abs(np.log(value)) > 0.6 * np.log(limit)
                    ax.text(j, i, text, ha="center", va="center", fontsize=7,
                            color="white" if strong else ("black" if np.isfinite(value) else "0.5"))
            ax.set_xticks(range(len(seqlens)), [seqlen_label(n) for n in seqlens], fontsize=8)
            ax.set_yticks(range(len(masks)), masks, fontsize=8)
            ax.set_title(f"{label_b} / {label_a}, fastest kernel — {_panel_title(None, direction, dtype, True)}",
                         fontsize=10)
            bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
            ticks = [t for t in (0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25) if 1 / limit <= t <= limit]
            bar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks], fontsize=7)
            bar.ax.minorticks_off()
            bar.set_label(f"{label_b} ÷ {label_a} TFLOPs/s", fontsize=8)
    fig.tight_layout()  # no marker legend: a cell without a ratio is "–", whatever its statuses
    return fig


# --- context parallelism ---------------------------------------------------------------------

def _series_key(row) -> str:
    return f"{row['strategy']} ({row['local_kernel']})"


def _cp_panels(sub: pd.DataFrame, value: str, ylabel: str, mask: str, *, colors: dict,
               ceilings: dict | None = None, unit_line: float | None = None) -> Figure:
    """Rows: direction (× dtype); columns: tokens per rank (the per-GPU work: the CP grid is weak
    scaling, seqlen = tokens_per_rank · cp_size); x: cp_size; a line per strategy (and local kernel)."""
    sub = sub.assign(tokens_per_rank=tokens_per_rank(sub))
    per_rank = sorted(int(s) for s in sub["tokens_per_rank"].dropna().unique())
    cp_sizes = sorted(int(s) for s in sub["cp_size"].unique())
    dtypes = tables.dtypes(sub)
    combos = tables.combos(sub)
    nrows, ncols = len(combos), max(len(per_rank), 1)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(3.6 * ncols, 5.5), 3.2 * nrows + 1.2), squeeze=False)
    x = {s: i for i, s in enumerate(cp_sizes)}
    keys = sub.apply(_series_key, axis=1)
    series = sorted(set(keys))
    extra = {}
    for r, (direction, dtype) in enumerate(combos):
        for c, tokens in enumerate(per_rank):
            ax = axes[r][c]
            here = (sub["direction"] == direction) & (sub["dtype"] == dtype) & (sub["tokens_per_rank"] == tokens)
            rows = sub[here]
            ceiling = _ceiling_line(ax, ceilings, dtype, per=" per GPU") if ceilings else None
            if unit_line is not None:
                ax.axhline(unit_line, color="0.25", linestyle="--", linewidth=1.2, zorder=1,
                           label="the best single-GPU kernel")
            vals = rows.loc[rows[value].notna(), value]
            top = max(float(vals.max()) if len(vals) else 0.0, ceiling or 0.0, unit_line or 0.0) or 1.0
            for k, name in enumerate(series):
                sr = rows[keys[here] == name]
                pts = ok_rows(sr, value).sort_values("cp_size")
                if len(pts):
                    if value == "tflops_per_gpu":
                        lo = (pts[value] - pts["tflops_per_gpu_p20"]).clip(lower=0).fillna(0)
                        hi = (pts["tflops_per_gpu_p80"] - pts[value]).clip(lower=0).fillna(0)
                        ax.errorbar([x[s] for s in pts["cp_size"]], pts[value], yerr=[lo, hi], marker="o",
                                    color=colors[name], capsize=2, zorder=2)
                    else:
                        ax.plot([x[s] for s in pts["cp_size"]], pts[value], marker="o", color=colors[name],
                                zorder=2)
                off = (k - (len(series) - 1) / 2) * 0.12
                for _, row in sr.iterrows():
                    if row["status"] != "ok":
                        ax.text(x[int(row["cp_size"])] + off, top * 0.03, status_marker(row["status"]),
                                ha="center", va="bottom", color=colors[name], fontweight="bold", fontsize=11,
                                gid=f"marker-{row['status']}")
                    elif pd.isna(row[value]):
                        ax.text(x[int(row["cp_size"])] + off, top * 0.03, "n/a", ha="center", va="bottom",
                                color=colors[name], fontsize=7)
            ax.set_xticks(range(len(cp_sizes)), [str(s) for s in cp_sizes])
            ax.set_xlim(-0.5, len(cp_sizes) - 0.5)
            ax.set_ylim(0, top * 1.15)
            ax.set_xlabel("cp_size (GPUs)")
            if c == 0:
                ax.set_ylabel(ylabel)
            title = f"{mask} — {DIRECTION_TITLES.get(direction, direction)}"
            title += f" {dtype}" if len(dtypes) > 1 else ""
            ax.set_title(f"{title}\n{seqlen_label(tokens)} tokens per GPU", fontsize=9)
            ax.grid(alpha=0.3)
            for h in ax.get_lines():
                if h.get_label().startswith(("matmul ceiling", "single-GPU")):
                    extra.setdefault(h.get_label(), h)
    handles = [Line2D([], [], color=colors[s], marker="o", label=s) for s in series]
    _finish(fig, handles + list(extra.values()))
    return fig


def cp_scaling_figure(cp: pd.DataFrame, mask: str, ceilings: dict | None = None) -> Figure:
    """Per-GPU TFLOPs/s against cp_size, a line per strategy (and local kernel), for one mask."""
    sub = cp[cp["mask"] == mask] if len(cp) else cp
    if sub.empty:
        return _empty_figure(f"no CP cells for mask {mask}", title=f"{mask} — CP scaling")
    colors = series_colors(cp.apply(_series_key, axis=1))
    return _cp_panels(sub, "tflops_per_gpu", "TFLOPs/s per GPU (median; p20–p80)", mask, colors=colors,
                      ceilings=ceilings)


def cp_efficiency_figure(cp: pd.DataFrame, kernels: pd.DataFrame, mask: str) -> Figure:
    """Per-GPU TFLOPs/s divided by the fastest single-GPU kernel's on the same total problem, for
    one mask: what CP buys over one GPU (``tables.cp_efficiency``'s ``vs_one_gpu``)."""
    sub = cp[cp["mask"] == mask] if len(cp) else cp
    if sub.empty:
        return _empty_figure(f"no CP cells for mask {mask}", title=f"{mask} — CP against one GPU")
    eff = cp_efficiency(sub, kernels)
    colors = series_colors(cp.apply(_series_key, axis=1))
    fig = _cp_panels(eff, "vs_one_gpu", "per-GPU TFLOPs/s ÷ best single GPU", mask, colors=colors, unit_line=1.0)
    if not eff["vs_one_gpu"].notna().any():
        fig.text(0.5, 0.5, "no single-GPU kernel cell on the same problem\n(see the CP table's 1-GPU note)",
                 ha="center", va="center", color="0.3", fontsize=10)
    return fig


# --- output ----------------------------------------------------------------------------------


# A chart has a few dozen colours plus their anti-aliased blends; 256 palette entries keep it
# visually the same and make the PNG about 3x smaller, which is most of a report's size (each
# figure is embedded in the HTML).
PALETTE_COLORS = 256


def compact_png(path: str | os.PathLike) -> None:
    """Rewrite an opaque PNG in place as a palette PNG (one with transparency is left as it is)."""
    with Image.open(path) as image:
        image.load()
    if image.mode == "RGBA":
        if image.getextrema()[3][0] < 255:
            return
        image = image.convert("RGB")
    elif image.mode != "RGB":
        return
    image.quantize(PALETTE_COLORS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, format="PNG", optimize=True)


def save(fig: Figure, out: str | os.PathLike, *, dpi: int = DPI) -> Path:
    """Write the figure as a (palette) PNG, atomically, and close it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        fig.savefig(tmp, dpi=dpi, format="png", bbox_inches="tight", pad_inches=0.15)
        compact_png(tmp)
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return out


def cp_model_figure(cp: pd.DataFrame, kernels: pd.DataFrame, mask: str) -> Figure:
    """``longca predict``'s model fitted on the run's own tables, drawn to larger GPU counts, with what it
    was fitted on and how it did on held-out cells written under it (or why there is no prediction)."""
    from .cp_model import report_prediction

    title = f"{mask}: CP at larger GPU counts, predicted"
    result = report_prediction(cp, kernels, mask)
    if "why" in result:
        return _empty_figure(result["why"], title)
    fig = cp_prediction_figure(result["predicted"], result["measured"], title)
    fig.set_size_inches(9, 5.4)
    fig.text(0.01, 0.01, result["caption"], fontsize=7, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def cp_prediction_figure(predicted: pd.DataFrame, measured: pd.DataFrame, title: str,
                         published: pd.DataFrame | None = None) -> Figure:
    """Predicted per-GPU TFLOPs/s against cp_size (dashed lines, labelled as predictions) with the
    measured points it was fitted and checked on (filled) and, where given, another source's published
    figures (open squares, in the colour of the strategy they compare with).  ``predicted`` /
    ``measured``: strategy, cp_size, tflops_per_gpu; ``published``: the same and ``label``."""
    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=DPI)
    colors = series_colors(set(predicted["strategy"]) | set(measured["strategy"]))
    for strategy, g in predicted.dropna(subset=["tflops_per_gpu"]).groupby("strategy"):
        g = g.sort_values("cp_size")
        ax.plot(g["cp_size"], g["tflops_per_gpu"], "--", color=colors[strategy], label=f"{strategy} (predicted)")
    for strategy, g in measured.groupby("strategy"):
        ax.plot(g["cp_size"], g["tflops_per_gpu"], "o", color=colors.get(strategy, "black"),
                label=f"{strategy} (measured)")
    if published is not None:
        for i, (strategy, g) in enumerate(published.groupby("strategy")):
            ax.plot(g["cp_size"], g["tflops_per_gpu"], "s", mfc="none", ms=8, color=colors.get(strategy, "black"),
                    label=g["label"].iloc[0] if i == 0 else None)
    sizes = sorted(set(predicted["cp_size"]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(p) for p in sizes])
    ax.set_xlabel("cp_size (GPUs)")
    ax.set_ylabel("TFLOPs/s per GPU (slowest rank)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


# --- the figures a run draws ------------------------------------------------------------------


class FigureData:
    """What a run's figures are drawn from: its tables, its ceilings and its mask order.  The CP table is
    taken over the mean of each cell's document layouts (``tables.layout_means``)."""

    def __init__(self, kernels: pd.DataFrame, cp: pd.DataFrame | None = None, ceilings: dict | None = None,
                 masks: list[str] | None = None):
        self.kernels = kernels
        self.cp = tables.layout_means(tables.empty_cp() if cp is None else cp)
        self.ceilings = ceilings
        self.masks = masks
        self.kernel_colors = series_colors(kernels["kernel"]) if len(kernels) else {}


# Each figure of ``figures.FIGURES``, drawn from a run's ``FigureData`` for one mask (None: drawn once).


def matrix_figure(d: FigureData, mask: None) -> Figure:
    return kernel_mask_matrix_figure(d.kernels, masks=d.masks)


def throughput_figure(d: FigureData, mask: str) -> Figure:
    return kernel_throughput_figure(d.kernels, mask, d.ceilings, colors=d.kernel_colors)


def memory_figure(d: FigureData, mask: str) -> Figure:
    return kernel_memory_figure(d.kernels, mask, colors=d.kernel_colors)


def memory_model_drawing(d: FigureData, mask: str) -> Figure:
    return memory_model_figure(d.kernels, mask, colors=d.kernel_colors)


def cp_scaling_drawing(d: FigureData, mask: str) -> Figure:
    return cp_scaling_figure(d.cp, mask, d.ceilings)


def cp_efficiency_drawing(d: FigureData, mask: str) -> Figure:
    return cp_efficiency_figure(d.cp, d.kernels, mask)


def cp_predicted_figure(d: FigureData, mask: str) -> Figure:
    return cp_model_figure(d.cp, d.kernels, mask)


def draw(name: str, data: FigureData, mask: str | None, out: str | os.PathLike) -> Path:
    """Draw figure ``name`` (of ``figures.FIGURES``) for ``mask`` into ``out``."""
    return save(globals()[FIGURES[name].drawing](data, mask), out)


def draw_all(data: FigureData, folder: str | os.PathLike, cp_masks: list[str]) -> dict[str, dict[str | None, Path]]:
    """Every figure of ``figures.FIGURES`` for ``data``'s masks (CP figures for ``cp_masks``) into
    ``folder``, named as the workflow names them: figure name → mask (None: drawn once) → PNG."""
    drawn: dict[str, dict[str | None, Path]] = {}
    for name, spec in FIGURES.items():
        for mask in masks_of(spec, data.masks or [], cp_masks):
            drawn.setdefault(name, {})[mask] = draw(name, data, mask, Path(folder) / f"{spec.file.format(mask=mask)}.png")
    return drawn
