"""One self-contained HTML report that answers "which kernel, which CP strategy?".

The first screen holds the answer (the fastest kernel per mask and sequence length, forward and
backward, with its margin over the runner-up and the kernels that cannot run or ran out of memory
there; the best kernel per mask and direction; the best CP strategy per mask and CP size); below it
every figure with a caption saying what was measured and how, every row in sortable, filterable
tables, every failed cell with its reason, the methodology, the environment and the resolved
configuration. Figures are embedded as data URIs and the page loads nothing from anywhere else, so
the one file can be shared and read offline. Everything that comes from config, the environment or
error messages goes through Jinja's autoescape. The tables come from ``tables`` (the same the
figures draw); this module formats and lays them out.
"""

from __future__ import annotations

import base64
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import jinja2
import numpy as np
import pandas as pd
import yaml

from .. import shapes
from . import figure_captions, memory_model, reproduce, sparse, tables
from .figures import FIGURES as FIGURE_SPECS
from .tables import DIRECTION_TITLES, STATUS_LABELS, STATUS_MARKERS, seqlen_label

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"  # package data (pyproject.toml)
REPORT_PACKAGES = ("longca", "torch", "snakemake", "pandas", "pyarrow", "matplotlib", "jinja2")


# --- formatting ------------------------------------------------------------------------------


def _missing(value) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # lists, arrays
        return False


def fmt_number(value, digits: int = 4) -> str:
    if _missing(value):
        return ""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e7):
        return f"{value:.{max(digits - 1, 1)}e}"
    return f"{value:.{digits}g}"


def fmt_mib(value) -> str:
    return "" if _missing(value) else f"{float(value) / 2 ** 20:.1f}"


def fmt_text(value) -> str:
    if _missing(value):
        return ""
    if isinstance(value, (list, tuple, np.ndarray)):
        return ", ".join(fmt_text(v) for v in value)
    return str(value)


def fmt_libraries(value) -> str:
    """``{"triton": "3.5.0"}`` (a JSON string in the tables) → ``triton 3.5.0``."""
    if _missing(value):
        return ""
    try:
        libs = json.loads(value) if isinstance(value, str) else dict(value)
    except (ValueError, TypeError):
        return str(value)
    return ", ".join(f"{k} {v}" for k, v in sorted(libs.items())) or "none"


def _sort_key(value) -> str:
    """The raw value the page's sorter compares (numbers as numbers, text as text, missing as '')."""
    if _missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(int(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return repr(float(value))
    return fmt_text(value)


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str] = fmt_text
    title: str = ""
    numeric: bool = False
    wrap: bool = False  # long free text (reasons, JSON): wrapped within a bounded width


KERNEL_COLUMNS = [
    Column("cell_id", "cell_id", title="kernel/mask/dtype_direction_seqlen; the cell's row file and log are named so"),
    Column("kernel", "kernel"), Column("mask", "mask"), Column("pattern", "pattern"),
    Column("model", "model", title="the model presets (config models) whose shape and mask this cell is"),
    Column("seqlen", "seqlen", fmt_number, numeric=True), Column("direction", "direction"), Column("dtype", "dtype"),
    Column("heads_q", "heads q", fmt_number, numeric=True), Column("heads_kv", "heads kv", fmt_number, numeric=True),
    Column("head_dim", "head dim", fmt_number, numeric=True), Column("batch", "batch", fmt_number, numeric=True),
    Column("status", "status"),
    Column("tflops", "TFLOPs/s", fmt_number, "masked FLOPs / median time", True),
    Column("tflops_p20", "TFLOPs/s p20", fmt_number, "throughput at the 80th percentile time", True),
    Column("tflops_p80", "TFLOPs/s p80", fmt_number, "throughput at the 20th percentile time", True),
    Column("median_ms", "median ms", fmt_number, numeric=True),
    Column("p20_ms", "p20 ms", fmt_number, numeric=True), Column("p80_ms", "p80 ms", fmt_number, numeric=True),
    Column("peak_mem_bytes", "peak MiB", fmt_mib, "peak allocated device memory (GPU only)", True),
    Column("area", "area", fmt_number, "attended (query, key) pairs of the mask", True),
    Column("density", "density", fmt_number, "area / seqlen²", True),
    Column("flops", "FLOPs", fmt_number, "2 · area · heads_q · (d_qk + d_v) · batch, i.e. 4 · area · heads_q · head_dim · batch where v has the same head dim (backward: 2 · area · heads_q · (3 d_qk + 2 d_v) · batch, × 2.5)", True),
    Column("gate_error", "gate error", fmt_number, "worst relative L2 error vs the float64 reference", True),
    Column("gate_tolerance", "gate tol.", fmt_number, numeric=True),
    Column("wall_s", "cell wall s", fmt_number, "wall time of the whole cell (build, gate, timing)", True),
    Column("notes", "notes", wrap=True), Column("kernel_options", "options", wrap=True),
    Column("reason", "reason", wrap=True),
    Column("reproduce", "reproduce", wrap=True,
           title="the one command that measures this cell alone; in the run's directory it writes the cell's row file"),
]

CP_COLUMNS = [
    Column("cell_id", "cell_id", title="strategy/cp_size/mask/dtype_direction_seqlen"),
    Column("strategy", "strategy"), Column("local_kernel", "local kernel"),
    Column("cp_size", "cp_size", fmt_number, numeric=True), Column("nodes", "nodes", fmt_number, numeric=True),
    Column("mask", "mask"), Column("seqlen", "seqlen", fmt_number, "tokens in all (every rank)", True),
    Column("tokens_per_rank", "tokens/rank", fmt_number, numeric=True),
    Column("direction", "direction"), Column("dtype", "dtype"), Column("status", "status"),
    Column("tflops_per_gpu", "TFLOPs/s per GPU", fmt_number, "flops / median / cp_size", True),
    Column("tflops_per_gpu_p20", "p20", fmt_number, numeric=True),
    Column("tflops_per_gpu_p80", "p80", fmt_number, numeric=True),
    Column("layouts", "layouts", fmt_number,
           "document layouts averaged (config cp_layouts): the figures are their mean", True),
    Column("layout_min", "layout min", fmt_number, "the slowest layout's per-GPU TFLOPs/s", True),
    Column("layout_max", "layout max", fmt_number, "the fastest layout's per-GPU TFLOPs/s", True),
    Column("layout_std", "layout std", fmt_number,
           "standard deviation of the layouts' per-GPU TFLOPs/s (sample; none for one layout)", True),
    Column("scaling", "scaling", fmt_number,
           "per-GPU TFLOPs/s ÷ the same strategy and local kernel's at cp_size 1 and the same tokens/rank", True),
    Column("vs_one_gpu", "vs best 1 GPU", fmt_number,
           "per-GPU TFLOPs/s ÷ the fastest single-GPU kernel's on the same total problem", True),
    Column("one_gpu_kernel", "best 1-GPU kernel"),
    Column("one_gpu_tflops", "1-GPU TFLOPs/s", fmt_number, numeric=True),
    Column("scaling_note", "scaling note", wrap=True), Column("one_gpu_note", "1-GPU note", wrap=True),
    Column("median_ms", "median ms", fmt_number, "slowest rank per iteration, median over reps", True),
    Column("peak_mem_bytes", "peak MiB", fmt_mib, "largest per-rank peak", True),
    Column("comm_bytes", "comm MiB", fmt_mib, "most bytes any rank sent per step", True),
    Column("imbalance", "area max/mean", fmt_number, "max over mean of each rank's attended pairs", True),
    Column("gate_error", "gate error", fmt_number, numeric=True),
    Column("layout", "layout", wrap=True), Column("strategy_options", "options", wrap=True),
    Column("backend", "backend"), Column("reason", "reason", wrap=True),
]


def table_rows(df: pd.DataFrame, columns: list[Column], *, id_prefix: str) -> tuple[list[Column], list[dict]]:
    cols = [c for c in columns if c.key in df.columns]
    rows = []
    for i, rec in enumerate(df[[c.key for c in cols]].itertuples(index=False, name=None)):
        cells = []
        for col, value in zip(cols, rec):
            cells.append({"text": col.fmt(value), "sort": _sort_key(value), "numeric": col.numeric,
                          "wrap": col.wrap, "status": value if col.key == "status" else None})
        rows.append({"id": f"{id_prefix}-{i}", "cells": cells})
    return cols, rows


# --- the answer ------------------------------------------------------------------------------


def kernel_answer(e: dict, row_ids: dict[str, str] | None = None) -> dict:
    """A ``tables.best_kernels`` entry as the answer table shows it (numbers formatted, rows linked)."""
    row_ids = row_ids or {}
    shown = {k: e[k] for k in ("mask", "direction", "dtype", "kernel", "longest_grid", "note") if k in e}
    if e["kernel"] is None:
        return shown
    shown.update(seqlen=e["seqlen"], seqlen_label=seqlen_label(e["seqlen"]), tflops=fmt_number(e["tflops"]),
                 tflops_value=e["tflops"],
                 spread=f"{fmt_number(e['tflops_p20'], 3)}–{fmt_number(e['tflops_p80'], 3)}",
                 row_id=row_ids.get(e["cell_id"]), wins=e["wins"], lengths=e["lengths"])
    if "runner_up" in e:
        shown.update(runner_up=e["runner_up"], runner_up_tflops=fmt_number(e["runner_up_tflops"]),
                     ratio=f"{e['ratio']:.2f}" if e["ratio"] is not None else None,
                     runner_up_row_id=row_ids.get(e["runner_up_cell_id"]), margin=margin_text(e))
    return shown


def sparse_answer(e: dict, row_ids: dict[str, str] | None = None) -> dict:
    """A ``sparse.answers`` entry as the sparse table shows it (numbers formatted, rows linked)."""
    shown = {k: e[k] for k in ("tiles", "block", "kept", "seqlen", "direction", "dtype", "kernel", "failed")}
    shown.update(kept_actual=f"{e['kept_actual']:.3f}", seqlen_label=seqlen_label(e["seqlen"]),
                 block_label=sparse.block_label(e["tiles"], e["block"]))
    if e["kernel"] is None:
        return shown
    shown.update(tflops=fmt_number(e["tflops"]), ms=fmt_number(e["median_ms"], 3),
                 row_id=(row_ids or {}).get(e["cell_id"]),
                 margin=margin_text(e) if e["runner_up"] else "the only sparse kernel with a number",
                 dense_kernel=e["dense_kernel"])
    if e["speedup"] is not None:
        shown.update(speedup=f"{e['speedup']:.2f}", dense_ms=fmt_number(e["dense_ms"], 3), pays=e["speedup"] > 1.0)
    return shown


def margin_text(e: dict) -> str:
    """A ``tables.seqlen_winners`` (or ``best_kernels``) entry's margin: ``1.18× over flex_flash``,
    ``tied with b, c (1.03×)`` when they are within the run-to-run spread, or ``only kernel with a
    number``; `` · unsteady`` when the winner's or runner-up's row is."""
    if e["runner_up"] is None:
        return "only kernel with a number"
    if e.get("tie"):
        names = ", ".join(e.get("tied") or [e["runner_up"]])
        text = f"tied with {names}" + (f" ({e['ratio']:.2f}×)" if e["ratio"] not in (None, 1.0) else "")
    else:
        text = f"{e['ratio']:.2f}× over {e['runner_up']}" if e["ratio"] is not None else f"over {e['runner_up']}"
    return text + (" · unsteady" if e.get("unsteady") else "")


def _status_names(pairs: list[tuple[str, list[str]]]) -> str:
    """``[("a", []), ("b", ["bwd"])]`` → ``a, b (backward only)``."""
    return ", ".join(k + (f" ({'/'.join(DIRECTION_TITLES.get(d, d) for d in ds)} only)" if ds else "")
                     for k, ds in pairs)


def seqlen_answer(cell: dict | None, row_ids: dict[str, str] | None = None) -> dict | None:
    """A ``tables.seqlen_winner_grid`` cell as the first screen shows it: per direction the
    winner, its TFLOPs/s and margin (or ``—`` and why), then the X and E kernel names."""
    if cell is None:
        return None
    row_ids = row_ids or {}
    lines = []
    for direction, e in cell["entries"].items():
        line = {"direction": DIRECTION_TITLES.get(direction, direction), "short": direction[0].upper()}
        if e is None:
            line.update(kernel=None, why="not measured")
        elif e["kernel"] is None:
            line.update(kernel=None, why="no kernel produced a number (" + e["failed"] + ")")
        else:
            line.update(kernel=e["kernel"], row_id=row_ids.get(e["cell_id"]), tflops=fmt_number(e["tflops"], 3),
                        margin=margin_text(e), title=(f"{e['kernel']} {fmt_number(e['tflops'])} TFLOPs/s"
                                                      + (f", {e['runner_up']} {fmt_number(e['runner_up_tflops'])}"
                                                         if e["runner_up"] else "")))
        lines.append(line)
    return {"seqlen_label": seqlen_label(cell["seqlen"]), "lines": lines,
            "unsupported": _status_names(cell["unsupported"]), "n_unsupported": len(cell["unsupported"]),
            "oom": _status_names(cell["oom"]), "n_oom": len(cell["oom"])}


def strategy_answer(e: dict, row_ids: dict[str, str] | None = None) -> dict:
    """A ``tables.best_strategies`` entry as the answer table shows it."""
    row_ids = row_ids or {}
    shown = {k: e[k] for k in ("mask", "cp_size", "direction", "dtype", "strategy", "note") if k in e}
    if e["strategy"] is None:
        return shown
    tpr = e["tokens_per_rank"]
    shown.update(local_kernel=e["local_kernel"], seqlen=e["seqlen"], seqlen_label=seqlen_label(e["seqlen"]),
                 tpr_label=seqlen_label(tpr) if tpr else None, tflops=fmt_number(e["tflops_per_gpu"]),
                 scaling=fmt_number(e["scaling"], 3) if pd.notna(e["scaling"]) else None,
                 vs_one_gpu=fmt_number(e["vs_one_gpu"], 3) if pd.notna(e["vs_one_gpu"]) else None,
                 one_gpu_kernel=e["one_gpu_kernel"], one_gpu_note=e["one_gpu_note"],
                 row_id=row_ids.get(e["cell_id"]))
    if "runner_up" in e:
        shown.update(runner_up=e["runner_up"], runner_up_tflops=fmt_number(e["runner_up_tflops"]),
                     tied=", ".join(e["tied"]), unsteady=e["unsteady"])
    return shown


# --- figures ---------------------------------------------------------------------------------


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", data[16:24])


@dataclass
class EmbeddedFigure:
    id: str
    title: str
    caption: str
    alt: str
    uri: str
    width: int | None = None
    height: int | None = None


def embed(path: str | os.PathLike, *, id: str, title: str, caption: str, alt: str) -> EmbeddedFigure:
    data = Path(path).read_bytes()
    size = _png_size(data)
    return EmbeddedFigure(id=id, title=title, caption=caption, alt=alt,
                          uri="data:image/png;base64," + base64.b64encode(data).decode("ascii"),
                          width=size[0] if size else None, height=size[1] if size else None)


def _timing_phrase(df: pd.DataFrame) -> str:
    devices = set(df["device"].dropna()) if len(df) and "device" in df else set()
    parts = []
    if "cuda" in devices:
        parts.append("CUDA events around each call with the L2 cache flushed before it (GPU)")
    if devices - {"cuda"}:
        parts.append("time.perf_counter around each call (CPU)")
    reps = "; ".join(f"{w} warm-up calls{f' (at least {m:g} ms)' if m else ''} then {r} timed calls"
                     for w, m, r in tables.timing_settings(df))
    return ", ".join(parts) + (f" — {reps}" if reps else "")


def _ceiling_phrase(ceilings: dict | None, dtypes: Iterable[str]) -> str:
    if not ceilings or not ceilings.get("matmul"):
        return "No machine ceiling was measured for this run, so no ceiling line is drawn."
    parts = [f"{e['dtype']}: {fmt_number(e['tflops'])} TFLOPs/s (n = {e['n']})"
             for e in ceilings["matmul"] if e.get("dtype") in set(dtypes)]
    if not parts:
        return "The measured ceilings do not cover this dtype, so no ceiling line is drawn."
    return (f"Ceiling on {ceilings.get('device_name') or ceilings.get('device')} (median of n×n @ n×n products, "
            "2n³ FLOPs each, after warm-up): " + "; ".join(parts) + ".")


def _kernel_caption_addition(kernels: pd.DataFrame, cp: pd.DataFrame, mask: str, ceilings: dict | None) -> str:
    sub = kernels[kernels["mask"] == mask]
    pattern = ", ".join(sorted(set(sub["pattern"].dropna()))) if "pattern" in sub else ""
    density = ""
    if len(sub) and sub["density"].notna().any():
        lo, hi = sub["density"].min(), sub["density"].max()
        density = f", density {fmt_number(lo, 3)}" + ("" if lo == hi else f"–{fmt_number(hi, 3)}")
    return (f"Pattern {pattern or '–'}{density}. Timing: {_timing_phrase(sub)}. "
            + _ceiling_phrase(ceilings, set(sub["dtype"])))


# What only the rows know, added to a figure's caption file in the HTML report (by figure name).
CAPTION_ADDITIONS: dict[str, Callable[[pd.DataFrame, pd.DataFrame, str, dict | None], str]] = {
    "throughput": _kernel_caption_addition,
    "cp_scaling": lambda kernels, cp, mask, ceilings: _ceiling_phrase(ceilings, set(cp[cp["mask"] == mask]["dtype"])),
}


def _memory_note(kernels: pd.DataFrame, mask: str) -> str | None:
    sub = kernels[kernels["mask"] == mask]
    if tables.has_peak_memory(sub):
        return None
    if not (sub["device"] == "cuda").any():
        return ("Peak memory is recorded on GPU only; these cells ran on "
                f"{tables.devices_text(sub)}, so there is no memory figure for this mask.")
    return ("No cell of this mask has a memory figure yet: they were measured before the memory probe "
            "(one call's need) existed.")


# Why a figure is left out of the HTML report for a mask, in its place (by figure name; None: shown).
def _memory_model_note(kernels: pd.DataFrame, mask: str) -> str | None:
    if tables.has_peak_memory(kernels[kernels["mask"] == mask]):
        return None
    return "No memory model for this mask: it is fitted to the peak memory of GPU cells, and none has one."


NOTES: dict[str, Callable[[pd.DataFrame, str], str | None]] = {"memory": _memory_note,
                                                                "memory_model": _memory_model_note}


def caption(name: str, kernels: pd.DataFrame, mask: str | None = None, ceilings: dict | None = None,
            cp: pd.DataFrame | None = None) -> str:
    """Figure ``name``'s caption in the HTML report: its caption file and what the rows add."""
    addition = CAPTION_ADDITIONS.get(name)
    more = addition(kernels, tables.empty_cp() if cp is None else cp, mask, ceilings) if addition else ""
    return figure_captions.text(name, mask) + (f" {more}" if more else "")


# --- environment -----------------------------------------------------------------------------


def _distinct(df: pd.DataFrame, columns: list[tuple[str, str, Callable]], count_label: str = "cells") -> dict:
    counts = tables.distinct_counts(df, columns, count_label)
    return {"headers": list(counts.columns), "rows": [[fmt_text(v) for v in r]
                                                       for r in counts.itertuples(index=False, name=None)]}


def report_software() -> list[tuple[str, str]]:
    versions = [("python", sys.version.split()[0]), ("platform", platform.platform())]
    for pkg in REPORT_PACKAGES:
        try:
            versions.append((pkg, importlib.metadata.version(pkg)))
        except importlib.metadata.PackageNotFoundError:
            versions.append((pkg, "not installed"))
    return versions


def _config_text(config: dict | None) -> str:
    if not config:
        return "(not given)"
    try:
        return yaml.safe_dump(json.loads(json.dumps(config, default=str)), sort_keys=False, width=100)
    except (TypeError, ValueError, yaml.YAMLError):
        return json.dumps(config, indent=2, sort_keys=True, default=str)


# --- render ----------------------------------------------------------------------------------


class Figures(dict):
    """Paths of the figures the workflow drew: figure name (``figures.FIGURES``) → mask (None for a
    figure drawn once) → PNG.  Any may be missing: the report says so."""


def _figure_entries(section: str | None, figures: Figures, mask: str | None, kernels: pd.DataFrame,
                    cp: pd.DataFrame, ceilings: dict | None) -> list[dict]:
    """The report's entries for the figures of one section (``FigureSpec.per``) and mask: each embedded,
    or the note said in its place, or nothing drawn."""
    entries = []
    for name, spec in FIGURE_SPECS.items():
        if spec.per != section:
            continue
        path = figures.get(name, {}).get(mask)
        note = NOTES[name](kernels, mask) if name in NOTES else None
        entry = {"name": name, "figure": None, "note": note,
                 "missing": f"No figure {spec.title.format(mask=mask)!r}."}
        if note is None and path and Path(path).exists():
            entry["figure"] = embed(path, id=spec.html_id(mask), title=spec.title.format(mask=mask),
                                    alt=spec.alt.format(mask=mask),
                                    caption=caption(name, kernels, mask, ceilings, cp))
        entries.append(entry)
    return entries


def context(kernels: pd.DataFrame, *, cp: pd.DataFrame | None = None, figures: Figures | None = None,
            ceilings: dict | None = None, config: dict | None = None, masks: list[str] | None = None,
            generated: str | None = None, not_measured: list | None = None) -> dict[str, Any]:
    """Everything the template shows, computed here so the template only lays it out.
    ``not_measured``: the grid's cells with no row (``tables.not_measured``), for a report rendered
    before its run finished."""
    figures = figures or Figures()
    # Every CP row as measured: a failed document layout is listed among the failed cells even where
    # another layout of its cell ran ok (the CP table shows one row per cell, over its layouts).
    cp_measured = tables.empty_cp() if cp is None else cp
    cp = tables.cp_table(cp, kernels)
    masks = tables.mask_order(kernels, masks)

    if config and len(kernels):  # each row's command to measure its cell alone (longca.results.reproduce)
        kernels = kernels.assign(reproduce=reproduce.commands(config, kernels))
    kernel_cols, kernel_rows = table_rows(kernels, KERNEL_COLUMNS, id_prefix="kernel-row")
    kernel_ids = {cid: r["id"] for cid, r in zip(kernels["cell_id"], kernel_rows)} if len(kernels) else {}
    cp_cols, cp_rows = table_rows(cp, CP_COLUMNS, id_prefix="cp-row")
    cp_ids = {cid: r["id"] for cid, r in zip(cp["cell_id"], cp_rows)} if len(cp) else {}

    kernel_combos = tables.combos(kernels)
    # Winners only beyond the run-to-run spread (config `tie_margin`); without a config, exact ties.
    tie_margin = float((config or {}).get("tie_margin", 0.0))
    grid = tables.seqlen_winner_grid(kernels, masks, tie_margin)
    by_seqlen = {"seqlens": [seqlen_label(s) for s in grid["seqlens"]],
                 "rows": [{"mask": r["mask"], "dtype": r["dtype"],
                           "cells": [seqlen_answer(c, kernel_ids) for c in r["cells"]]} for r in grid["rows"]]}
    best_k = [kernel_answer(e, kernel_ids) for e in tables.best_kernels(kernels, masks, tie_margin)]
    titles = {m.name: m.title for m in shapes.models(config or {})}
    by_model = [{**kernel_answer(e, kernel_ids), "model": e["model"], "title": titles.get(e["model"], e["model"]),
                 "model_mask": e["model_mask"], "shape": e["shape"]}
                for e in tables.model_answers(kernels, masks, tie_margin)]
    sparse_entries = [sparse_answer(e, kernel_ids) for e in sparse.answers(kernels, tie_margin)]
    cp_masks = tables.mask_order(cp, masks)
    best_cp = [strategy_answer(e, cp_ids) for e in tables.best_strategies(cp, masks, tie_margin)]
    cp_combos = tables.combos(cp)

    # Failed cells, kernel and CP, with their reason, log and the row behind them.
    failed = [{**f, "row_id": (kernel_ids if f["kind"] == "kernel" else cp_ids).get(f["cell_id"]),
               "reason": fmt_text(f["reason"])} for f in tables.failed_cells(kernels, cp_measured)]

    # Figures with captions, section by section.
    overview = _figure_entries(None, figures, None, kernels, cp, ceilings) if len(kernels) else []
    kernel_figs = [{"mask": mask, "figures": _figure_entries("mask", figures, mask, kernels, cp, ceilings)}
                   for mask in masks]
    cp_figs = [{"mask": mask, "figures": _figure_entries("cp_mask", figures, mask, kernels, cp, ceilings)}
               for mask in cp_masks]

    devices = sorted({fmt_text(v) for v in kernels.get("device_name", pd.Series(dtype=object)).dropna()})
    # Every row on a CPU (kernels and CP): the first screen says how far such timings go.
    kinds = set(kernels.get("device", pd.Series(dtype=object)).dropna()) | set(cp.get("device", pd.Series(dtype=object)).dropna())
    cpu_only = kinds == {"cpu"}

    # Methodology values taken from the rows themselves.
    areas = tables.mask_areas(kernels)
    area_rows = [{"mask": r.mask, "pattern": fmt_text(r.pattern), "seqlen": int(r.seqlen), "area": fmt_number(r.area),
                  "area_sort": _sort_key(r.area), "density": fmt_number(r.density),
                  "params": fmt_text(r.mask_params_resolved)} for r in areas.itertuples(index=False)]
    tolerances = tables.gate_tolerances(kernels)

    environment = {
        "devices": _distinct(kernels, [("device", "device", fmt_text), ("device_name", "device name", fmt_text),
                                       ("cpu_name", "CPU", fmt_text), ("cpu_threads", "CPU threads", fmt_text),
                                       ("hostname", "host", fmt_text), ("gpu_slot", "GPU slot", fmt_text)]),
        "software": _distinct(kernels, [("torch_version", "torch", fmt_text), ("cuda_version", "CUDA", fmt_text),
                                        ("driver_version", "driver", fmt_text),
                                        ("libraries", "kernel libraries", fmt_libraries)]),
        "cp": _distinct(cp, [("backend", "backend", fmt_text), ("device_name", "device name", fmt_text),
                             ("nodes", "nodes", fmt_text), ("hostnames", "hosts", fmt_text),
                             ("torch_version", "torch", fmt_text), ("nccl_version", "NCCL", fmt_text),
                             ("libraries", "kernel libraries", fmt_libraries)]),
        "report": report_software(),
    }
    ceiling_rows = [{"dtype": e.get("dtype"), "n": e.get("n"), "tflops": fmt_number(e.get("tflops")),
                     "spread": f"{fmt_number(e.get('tflops_p20'), 3)}–{fmt_number(e.get('tflops_p80'), 3)}",
                     "median_ms": fmt_number(e.get("median_ms")), "reps": e.get("reps")}
                    for e in (ceilings or {}).get("matmul", [])]

    return {
        "generated": generated or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "n_kernel_cells": len(kernels), "n_cp_cells": len(cp),
        "statuses": tables.status_counts(kernels),
        "cp_statuses": tables.status_counts(cp, unknown=False),
        "markers": [(m, s, STATUS_LABELS[s]) for s, m in STATUS_MARKERS.items()],
        "devices": devices,
        "cpu_only": cpu_only,
        "masks": masks,
        "by_seqlen": by_seqlen, "tie_margin": tie_margin, "unsteady_spread": tables.UNSTEADY_SPREAD,
        "kernel_combos": kernel_combos, "best_kernels": tables.answer_grid(best_k, ["mask"], kernel_combos),
        "best_kernel_list": best_k,
        "by_model": tables.answer_grid(by_model, ["title", "model_mask", "shape"], kernel_combos),
        "sparse": tables.answer_grid(sparse_entries, ["tiles", "block_label", "kept", "kept_actual", "seqlen_label"], kernel_combos),
        "kernel_many_dtypes": len({t for _, t in kernel_combos}) > 1,
        "cp_many_dtypes": len({t for _, t in cp_combos}) > 1,
        "cp_combos": cp_combos, "best_cp": tables.answer_grid(best_cp, ["mask", "cp_size"], cp_combos),
        "cp_config": {"strategies": (config or {}).get("cp_strategies") or [],
                      "sizes": (config or {}).get("cp_sizes") or [],
                      # [] (not null): every name in cp_masks was left out of masks (longca.config)
                      "no_masks": (config or {}).get("cp_masks") == []},
        "overview_figures": overview, "kernel_figures": kernel_figs, "cp_figures": cp_figs,
        "kernel_columns": kernel_cols, "kernel_rows": kernel_rows,
        "cp_columns": cp_cols, "cp_rows": cp_rows,
        "failed": failed,
        "area_rows": area_rows,
        "tolerances": [{"direction": r.direction, "dtype": r.dtype, "tolerance": fmt_number(r.gate_tolerance)}
                       for r in tolerances.itertuples(index=False)],
        "shapes": tables.problem_shapes(kernels),
        "timing": _timing_phrase(kernels),
        "gate_seqlens": tables.gate_seqlens(kernels),
        "provenance": tables.provenance_notes(kernels, ceilings, cp, tie_margin),
        "not_measured": [c.name for c in not_measured or []],
        "not_measured_per_kernel": tables.per_kernel(not_measured or []),
        "fits": _fits(kernels, masks),
        "ceilings": ceilings, "ceiling_rows": ceiling_rows,
        "environment": environment,
        "config_text": _config_text(config),
    }


def _fits(kernels: pd.DataFrame, masks: list[str] | None) -> list[dict]:
    """The "Does it fit?" table: each group's measured limits (``tables.longest_fits``) beside the
    memory model's predicted longest length and its held-out error (``memory_model.limits``)."""
    by = ("kernel", "mask", "direction", "dtype")
    predicted = {tuple(r[k] for k in by): r for r in memory_model.limits(kernels, masks).to_dict("records")}
    out = []
    for e in tables.longest_fits(kernels, masks):
        p = predicted.get(tuple(e[k] for k in by), {})
        held = p.get("held_out_error")
        out.append({**e, "longest_ok": seqlen_label(e["longest_ok"]) if e["longest_ok"] else "none",
                    "need": fmt_mib(e["peak_mem_bytes"]) if e["peak_mem_bytes"] is not None else "not measured",
                    "first_oom": seqlen_label(e["first_oom"]) if e["first_oom"] else
                    f"none up to {seqlen_label(e['largest_measured'])}",
                    # Whole K tokens, rounded down: the model says "up to", not a grid length.
                    "predicted": (seqlen_label(p["predicted_longest"] // 1024 * 1024)
                                  if p.get("predicted_longest") and pd.notna(p["predicted_longest"]) else "—"),
                    "terms": p.get("terms", "—"),
                    "held_out": f"{held:+.1%}" if held is not None and pd.notna(held) else "—"})
    return out


def environment(template_dir: Path = TEMPLATE_DIR) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["seqlen_label"] = seqlen_label
    env.globals["direction_title"] = lambda d: DIRECTION_TITLES.get(d, d)
    return env


def render(kernels: pd.DataFrame, out: str | os.PathLike, *, cp: pd.DataFrame | None = None,
           figures: Figures | None = None, ceilings: dict | None = None, config: dict | None = None,
           masks: list[str] | None = None, template: str = "report.html.j2", generated: str | None = None,
           not_measured: list | None = None) -> Path:
    """Write the report to ``out`` (atomically)."""
    ctx = context(kernels, cp=cp, figures=figures, ceilings=ceilings, config=config, masks=masks,
                  generated=generated, not_measured=not_measured)
    html = environment().get_template(template).render(**ctx)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out
