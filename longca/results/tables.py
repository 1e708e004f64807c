"""The tables the report shows, shaped once from the result rows (pandas DataFrames of
``results/kernels.parquet`` and ``results/cp.parquet``) for the figures (``plots``), the HTML
(``report``) and the tests alike.

Pure data: no matplotlib, no HTML.  Values stay numbers (the report formats them, the figures draw
them); the only text made here is what a table holds as data: a status's marker letter, a sequence
length's label (``32K``) and the sentence saying why a table cell has no number.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from .. import run_dir
from ..cells import Shape, split_shape
from ..cells import tokens_per_rank as per_rank
from .parquet import MODEL_SEPARATOR

# Every status a cell can have, in the order the report counts them.
STATUS_ORDER = ["ok", "unsupported", "oom", "wrong", "error", "timeout"]
# What a missing bar means, drawn where the bar would be (and listed with the failed cells).
STATUS_MARKERS = {"unsupported": "X", "oom": "E", "wrong": "W", "error": "!", "timeout": "T"}
STATUS_LABELS = {"unsupported": "unsupported", "oom": "out of memory", "wrong": "failed correctness",
                 "error": "error / crashed", "timeout": "timed out"}
DIRECTION_TITLES = {"fwd": "forward", "bwd": "backward"}
# What a CP row and the rows it is compared with share (the one-GPU kernel cells: at the same total length).
BASELINE_KEYS = ["mask", "direction", "dtype", "batch", "heads_q", "heads_kv", "head_dim"]


# --- labels and statuses ---------------------------------------------------------------------


def seqlen_label(n: int) -> str:
    """``1024`` → ``1K``, ``2**20`` → ``1M``; a length that is no whole multiple stays a number."""
    n = int(n)
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)}M"
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def status_marker(status: str) -> str:
    return STATUS_MARKERS.get(status, "?")


def status_summary(statuses: Iterable[str]) -> str:
    """``3 oom, 1 error``: how many of each status, most frequent first."""
    counts = pd.Series(list(statuses)).value_counts()
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def status_counts(df: pd.DataFrame, *, unknown: bool = True) -> list[tuple[str, int]]:
    """``(status, count)`` in ``STATUS_ORDER``; statuses outside it follow when ``unknown``."""
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    known = [(s, counts[s]) for s in STATUS_ORDER if s in counts]
    return known + ([(s, n) for s, n in counts.items() if s not in STATUS_ORDER] if unknown else [])


def ok_rows(df: pd.DataFrame, value: str = "tflops") -> pd.DataFrame:
    """The rows that produced a number: status ``ok`` and ``value`` present."""
    return df[(df["status"] == "ok") & df[value].notna()]


# --- what a table spans ----------------------------------------------------------------------


# A row whose p80/p20 spread exceeds this is flagged unsteady in the report.
UNSTEADY_SPREAD = 1.10


def tied_with_best(value, best, tie_margin: float):
    """Whether ``value`` (higher is better) is tied with ``best``: within the run-to-run spread
    ``tie_margin`` of it, ``value × (1 + tie_margin) ≥ best`` (0.05: within ×1.05), so a second run
    could order them either way and ``best`` does not beat it.  The one tie rule of every table and
    check; element-wise on arrays and Series."""
    return value * (1.0 + tie_margin) >= best


def tied_with(ranked: pd.DataFrame, value: str, name: str, tie_margin: float) -> list[str]:
    """The names after the first of ``ranked`` (sorted fastest first) whose ``value`` is tied with
    the first's (``tied_with_best``; the config's ``tie_margin`` is the measured run-to-run spread)."""
    top = float(ranked.iloc[0][value])
    return [str(n) for n, v in zip(ranked[name].iloc[1:], ranked[value].iloc[1:])
            if tied_with_best(float(v), top, tie_margin)]


def contest(ranked: pd.DataFrame, value: str, name: str, tie_margin: float) -> dict:
    """How the first of ``ranked`` (fastest first, at least two rows) stands against the rest:
    ``tied`` (``tied_with``), ``tie`` and ``unsteady`` (the winner's or the runner-up's row is)."""
    tied = tied_with(ranked, value, name, tie_margin)
    return {"tied": tied, "tie": bool(tied),
            "unsteady": unsteady(ranked.iloc[0], value) or unsteady(ranked.iloc[1], value)}


def unsteady(row: pd.Series, value: str = "tflops") -> bool:
    """A row whose figure is shaky: its warm-up never became steady, or its p80/p20 exceeds
    ``UNSTEADY_SPREAD``."""
    low, high = row.get(f"{value}_p20"), row.get(f"{value}_p80")
    spread = float(high) / float(low) if pd.notna(low) and pd.notna(high) and float(low) > 0 else 1.0
    steady = row.get("warmup_steady")
    never_steady = steady is not None and not pd.isna(steady) and not bool(steady)
    return bool(never_steady or spread > UNSTEADY_SPREAD)


def directions(df: pd.DataFrame) -> list[str]:
    """Directions present: forward, backward, then any other (sorted)."""
    present = set(df["direction"]) if len(df) else set()
    return [d for d in DIRECTION_TITLES if d in present] + sorted(present - set(DIRECTION_TITLES))


def dtypes(df: pd.DataFrame) -> list[str]:
    return sorted(set(df["dtype"])) if len(df) else []


def combos(df: pd.DataFrame) -> list[tuple[str, str]]:
    """``(direction, dtype)`` pairs, by dtype then direction: the answer tables' columns and the CP
    figures' rows of panels."""
    return [(d, t) for t in dtypes(df) for d in directions(df)]


def mask_order(df: pd.DataFrame, masks: list[str] | None) -> list[str]:
    """The masks present, in the given (config) order first, then the others as they appear."""
    present = list(dict.fromkeys(df["mask"])) if len(df) else []
    ordered = [m for m in (masks or []) if m in present]
    return ordered + [m for m in present if m not in ordered]


def has_peak_memory(df: pd.DataFrame) -> bool:
    """Whether any row recorded peak memory (GPU only)."""
    return bool(df["peak_mem_bytes"].notna().any())


def devices_text(df: pd.DataFrame) -> str:
    """The devices the rows ran on, e.g. ``cpu`` (``unknown`` when none is recorded)."""
    return ", ".join(sorted(set(df["device"].dropna()))) or "unknown"


# --- kernels ---------------------------------------------------------------------------------


def best_per_kernel_mask(df: pd.DataFrame) -> pd.DataFrame:
    """Per (direction, dtype, kernel, mask): the best TFLOPs/s over seqlens, the seqlen it was at,
    and the statuses of the cells that produced no number (``failed``: marker letters, sorted)."""
    records = []
    for (direction, dtype, kernel, mask), g in df.groupby(["direction", "dtype", "kernel", "mask"], sort=False):
        ok = ok_rows(g)
        best = ok.loc[ok["tflops"].idxmax()] if len(ok) else None
        failed = "".join(sorted({status_marker(s) for s in g["status"] if s != "ok"}))
        records.append({"direction": direction, "dtype": dtype, "kernel": kernel, "mask": mask,
                        "tflops": float(best["tflops"]) if best is not None else np.nan,
                        "seqlen": int(best["seqlen"]) if best is not None else None,
                        "failed": failed, "n_cells": len(g)})
    return pd.DataFrame(records, columns=["direction", "dtype", "kernel", "mask", "tflops", "seqlen", "failed",
                                          "n_cells"])


def _at_longest(group: pd.DataFrame, ok: pd.DataFrame, value: str, name: str,
                tie_margin: float) -> tuple[pd.DataFrame, dict]:
    """The ``ok`` rows at the longest length any has a number, best first, and what an entry of
    ``best_kernels`` / ``best_strategies`` says of them: the runner-up and the contest (when there is
    one), and a ``note`` when longer lengths of ``group`` have no number."""
    longest = int(ok["seqlen"].max())
    at = ok[ok["seqlen"] == longest].sort_values(value, ascending=False)
    said: dict = {}
    if len(at) > 1:
        second = at.iloc[1]
        said.update(runner_up=second[name], runner_up_tflops=second[value], **contest(at, value, name, tie_margin))
    if longest < int(group["seqlen"].max()):
        failed = group[group["seqlen"] > longest]
        said["note"] = (f"no {name} produced a number above {seqlen_label(longest)} ("
                        + status_summary(failed["status"]) + ")")
    return at, said


def best_kernels(df: pd.DataFrame, masks: list[str] | None = None, tie_margin: float = 0.0) -> list[dict]:
    """The fastest correct kernel per (mask, direction, dtype), at the longest seqlen where any
    kernel produced a number; with the runner-up there, and at how many lengths it was fastest.

    An entry always has ``mask``, ``direction``, ``dtype``, ``kernel`` (``None`` when no kernel
    produced a number) and ``longest_grid``; with a winner also ``seqlen``, ``tflops``,
    ``tflops_p20``, ``tflops_p80``, ``cell_id``, ``wins`` and ``lengths``, and, when another kernel
    has a number there, ``runner_up``, ``runner_up_tflops``, ``runner_up_cell_id``, ``ratio``, ``tied``
    (``tied_with``) and ``tie``; ``unsteady`` when the winner's or runner-up's row is (``unsteady``);
    ``note`` says why longer lengths (or all) have no number.  Entries follow ``mask_order``."""
    best = []
    for (mask, direction, dtype), group in df.groupby(["mask", "direction", "dtype"], sort=False):
        ok = ok_rows(group)
        entry = {"mask": mask, "direction": direction, "dtype": dtype, "kernel": None,
                 "longest_grid": int(group["seqlen"].max())}
        if ok.empty:
            entry["note"] = "no kernel produced a number (" + status_summary(group["status"]) + ")"
            best.append(entry)
            continue
        at, contested = _at_longest(group, ok, "tflops", "kernel", tie_margin)
        top = at.iloc[0]
        winners = ok.loc[ok.groupby("seqlen")["tflops"].idxmax(), "kernel"]
        entry.update(kernel=top["kernel"], seqlen=int(top["seqlen"]), tflops=float(top["tflops"]),
                     tflops_p20=top["tflops_p20"], tflops_p80=top["tflops_p80"], cell_id=top["cell_id"],
                     wins=int((winners == top["kernel"]).sum()), lengths=len(winners), **contested)
        if len(at) > 1:
            second = at.iloc[1]
            entry.update(runner_up_cell_id=second["cell_id"],
                         ratio=float(top["tflops"]) / float(second["tflops"]) if second["tflops"] else None)
        best.append(entry)
    order = mask_order(df, masks)
    best.sort(key=lambda e: order.index(e["mask"]))
    return best


def shape_label(rows: pd.DataFrame, mask: str) -> str:
    """The shape of ``mask``'s cells as a reader says it, ``64:8 · d128 · batch 1`` (``128:128 ·
    d192/128 · batch 1`` with v's own head dim): from its rows'
    columns, else from the mask's mark (a row that could not be read has no shape columns)."""
    known = rows[rows["mask"] == mask].dropna(subset=["heads_q", "heads_kv", "head_dim", "batch"])
    shape = Shape.of(known.iloc[0]) if len(known) else split_shape(mask)[1]
    if shape is None:
        return ""
    dims = f"d{shape.head_dim}" if shape.head_dim_v is None else f"d{shape.head_dim}/{shape.head_dim_v}"
    return f"{shape.heads_q}:{shape.heads_kv} · {dims} · batch {shape.batch}"


def model_answers(df: pd.DataFrame, masks: list[str] | None = None, tie_margin: float = 0.0) -> list[dict]:
    """``best_kernels`` per model preset (the rows' ``model`` column): which kernel for each model's
    masks at its shape.  Each entry adds ``model``, ``model_mask`` (the config's mask name, without
    the shape's mark) and ``shape`` (``shape_label``); a row of several presets counts for each."""
    if "model" not in df or not df["model"].notna().any():
        return []
    rows = df[df["model"].notna() & (df["model"] != "")]
    rows = rows.assign(model=rows["model"].str.split(MODEL_SEPARATOR)).explode("model")
    out = []
    for model, group in rows.groupby("model", sort=False):
        for e in best_kernels(group.drop(columns="model"), masks, tie_margin):
            out.append({**e, "model": model, "model_mask": split_shape(e["mask"])[0],
                        "shape": shape_label(group, e["mask"])})
    return out


def seqlen_winners(df: pd.DataFrame, tie_margin: float = 0.0) -> list[dict]:
    """Per (mask, dtype, direction, seqlen): the fastest ``ok`` kernel there and its margin over the
    runner-up, and which kernels cannot run the cell (``unsupported``) or ran out of memory (``oom``).

    An entry has ``mask``, ``dtype``, ``direction``, ``seqlen``, ``kernel`` (``None`` when no kernel
    produced a number), ``unsupported``, ``oom`` and ``measured`` (kernel names with that status / with
    a row there, sorted) and ``failed`` (a
    ``status_summary`` of every row without a number, ``""`` when none); with a winner also
    ``tflops`` and ``cell_id``, and ``runner_up``, ``runner_up_tflops`` and ``ratio`` (winner ÷
    runner-up; ``None`` where there is no other number).  ``tied`` names the kernels within
    ``tie_margin`` of the winner (``tied_with``) and ``tie`` is True when there are any; ``unsteady``
    when the winner's or runner-up's row is (``unsteady``)."""
    entries = []
    for (mask, dtype, direction, seqlen), g in df.groupby(["mask", "dtype", "direction", "seqlen"], sort=True):
        ok = ok_rows(g).sort_values(["tflops", "kernel"], ascending=[False, True])
        failed = g[g["status"] != "ok"]
        e = {"mask": mask, "dtype": dtype, "direction": direction, "seqlen": int(seqlen), "kernel": None,
             "unsupported": sorted(set(g.loc[g["status"] == "unsupported", "kernel"])),
             "oom": sorted(set(g.loc[g["status"] == "oom", "kernel"])), "measured": sorted(set(g["kernel"])),
             "failed": status_summary(failed["status"]) if len(failed) else "",
             "runner_up": None, "runner_up_tflops": None, "ratio": None, "tie": False, "tied": [],
             "unsteady": False}
        if len(ok):
            top = ok.iloc[0]
            e.update(kernel=top["kernel"], tflops=float(top["tflops"]), cell_id=top["cell_id"])
        if len(ok) > 1:
            second = ok.iloc[1]
            e.update(runner_up=second["kernel"], runner_up_tflops=float(second["tflops"]),
                     ratio=float(top["tflops"]) / float(second["tflops"]) if second["tflops"] else None,
                     **contest(ok, "tflops", "kernel", tie_margin))
        entries.append(e)
    return entries


def seqlen_winner_grid(df: pd.DataFrame, masks: list[str] | None = None, tie_margin: float = 0.0) -> dict:
    """``seqlen_winners`` laid out as the first screen's table: ``seqlens`` (the columns, sorted),
    ``directions`` and ``rows``, one per (mask, dtype) in ``mask_order``, each ``{"mask", "dtype",
    "cells"}`` with a cell per seqlen: ``None`` where that mask was not measured at that length,
    else ``{"seqlen", "entries": {direction: entry or None}, "unsupported", "oom"}`` where
    ``unsupported`` / ``oom`` are ``(kernel, directions)`` pairs, ``directions`` empty when the
    kernel has that status in every direction it was measured in there."""
    if df.empty:
        return {"seqlens": [], "directions": [], "rows": []}
    seqlens = sorted(int(s) for s in df["seqlen"].unique())
    dirs = directions(df)
    by_key: dict[tuple, dict] = {}
    for e in seqlen_winners(df, tie_margin):
        by_key.setdefault((e["mask"], e["dtype"], e["seqlen"]), {})[e["direction"]] = e
    rows = []
    for mask in mask_order(df, masks):
        for dtype in dtypes(df[df["mask"] == mask]):
            cells = []
            for seqlen in seqlens:
                here = by_key.get((mask, dtype, seqlen))
                if here is None:
                    cells.append(None)
                    continue
                cell = {"seqlen": seqlen, "entries": {d: here.get(d) for d in dirs}}
                for status in ("unsupported", "oom"):
                    names = sorted({k for e in here.values() for k in e[status]})
                    cell[status] = [(k, [] if all(k in e[status] for e in here.values() if k in e["measured"])
                                     else [d for d in dirs if d in here and k in here[d][status]]) for k in names]
                cells.append(cell)
            rows.append({"mask": mask, "dtype": dtype, "cells": cells})
    return {"seqlens": seqlens, "directions": dirs, "rows": rows}


# --- two machines side by side ---------------------------------------------------------------

CELL_KEYS = ["kernel", "mask", "seqlen", "direction", "dtype"]


def ok_on_both(a: pd.DataFrame, b: pd.DataFrame, keys: list[str] = CELL_KEYS, value: str = "tflops") -> pd.DataFrame:
    """The cells (matched on ``keys``) with a ``value`` on both machines, columns suffixed ``_a`` and
    ``_b``; the problem shape must be the same on both sides (a mismatch raises: a ratio would mean
    nothing)."""
    shape = ["batch", "heads_q", "heads_kv", "head_dim"]
    both = ok_rows(a, value).merge(ok_rows(b, value), on=keys, suffixes=("_a", "_b"))
    differ = [c for c in shape if c + "_a" in both and (both[c + "_a"] != both[c + "_b"]).any()]
    if differ:
        raise ValueError(f"the two runs measured different problem shapes ({', '.join(differ)}): no ratio")
    return both


def device_ratios(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per kernel cell measured ok on both machines: ``tflops_a``, ``tflops_b`` and ``ratio`` (b / a).

    Cells are matched by kernel, mask, length, direction and dtype; the problem shape must be the
    same on both sides (a mismatch raises: the ratio would mean nothing)."""
    both = ok_on_both(a, b)
    out = both[CELL_KEYS + ["tflops_a", "tflops_b"]].copy()
    out["ratio"] = out["tflops_b"] / out["tflops_a"]
    return out.reset_index(drop=True)


def memory_ratios(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per kernel cell ok on both machines with a memory figure on both: ``mem_a``, ``mem_b`` (bytes)
    and ``ratio`` (b / a).  One call's need is a property of the cell, not of the GPU: on two GPUs of
    one architecture and the same software, the ratio should be 1."""
    both = ok_on_both(a, b)
    both = both[both["peak_mem_bytes_a"].notna() & both["peak_mem_bytes_b"].notna()]
    out = both[CELL_KEYS].copy()
    out["mem_a"], out["mem_b"] = both["peak_mem_bytes_a"].astype(float), both["peak_mem_bytes_b"].astype(float)
    out["ratio"] = out["mem_b"] / out["mem_a"]
    return out.reset_index(drop=True)


def memory_agreement(ratios: pd.DataFrame, within: float = 0.05) -> dict:
    """From ``memory_ratios``: how many cells agree within ``within`` (relative), and the spread."""
    if ratios.empty:
        return {"cells": 0, "agree": 0, "share": None, "median": None, "min": None, "max": None}
    agree = int(((ratios["ratio"] - 1).abs() <= within).sum())
    return {"cells": len(ratios), "agree": agree, "share": agree / len(ratios),
            "median": float(ratios["ratio"].median()), "min": float(ratios["ratio"].min()),
            "max": float(ratios["ratio"].max())}


def best_kernel_ratios(pairs: pd.DataFrame) -> pd.DataFrame:
    """From ``device_ratios``: per mask, length, direction and dtype, the fastest kernel on each
    machine and ``ratio`` (b's best over a's best), among the kernels measured ok on both, so a kernel
    missing on one side (not run, not installed) does not make the other look faster."""
    keys = ["mask", "seqlen", "direction", "dtype"]
    rows = []
    for key, group in pairs.groupby(keys, sort=False):
        best_a, best_b = group.loc[group["tflops_a"].idxmax()], group.loc[group["tflops_b"].idxmax()]
        rows.append({**dict(zip(keys, key)), "kernel_a": best_a["kernel"], "tflops_a": best_a["tflops_a"],
                     "kernel_b": best_b["kernel"], "tflops_b": best_b["tflops_b"],
                     "ratio": best_b["tflops_b"] / best_a["tflops_a"], "kernels": len(group)})
    return pd.DataFrame(rows, columns=keys + ["kernel_a", "tflops_a", "kernel_b", "tflops_b", "ratio", "kernels"])


def mask_areas(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per (mask, seqlen): its pattern, exact area, density and resolved parameters."""
    if not len(kernels):
        return pd.DataFrame()
    return (kernels.drop_duplicates(["mask", "seqlen"])
            [["mask", "pattern", "seqlen", "area", "density", "mask_params_resolved"]]
            .sort_values(["mask", "seqlen"]))


def gate_tolerances(kernels: pd.DataFrame) -> pd.DataFrame:
    """The correctness tolerance per (direction, dtype), as the rows record it."""
    if not len(kernels):
        return pd.DataFrame(columns=["direction", "dtype", "gate_tolerance"])
    return (kernels.dropna(subset=["gate_tolerance"]).drop_duplicates(["direction", "dtype"])
            [["direction", "dtype", "gate_tolerance"]].sort_values(["dtype", "direction"]))


def problem_shapes(kernels: pd.DataFrame) -> list[dict]:
    """The distinct (batch, heads_q, heads_kv, head_dim) the rows measured."""
    if not len(kernels):
        return []
    return kernels.drop_duplicates(["batch", "heads_q", "heads_kv", "head_dim"])[
        ["batch", "heads_q", "heads_kv", "head_dim"]].to_dict("records")


def gate_seqlens(kernels: pd.DataFrame) -> list[int]:
    return sorted({int(v) for v in kernels["gate_seqlen"].dropna()}) if len(kernels) else []


def timing_settings(df: pd.DataFrame) -> list[tuple[int, float, int]]:
    """The distinct ``(warmup calls, warm-up ms (0 when none), timed reps)`` the rows record."""
    if not (len(df) and "warmup" in df):
        return []
    ms = df["warmup_ms"] if "warmup_ms" in df else pd.Series([None] * len(df), index=df.index)
    return sorted({(int(w), float(m) if pd.notna(m) else 0.0, int(r))
                   for w, m, r in zip(df["warmup"], ms, df["reps"]) if pd.notna(w) and pd.notna(r)})


# --- context parallelism ---------------------------------------------------------------------


def empty_cp() -> pd.DataFrame:
    """A CP table without rows (every column of the schema)."""
    from .parquet import CP_SCHEMA

    return CP_SCHEMA.empty_table().to_pandas()


def tokens_per_rank(cp: pd.DataFrame) -> pd.Series:
    """``tokens_per_rank`` where the table has it, else ``seqlen // cp_size``."""
    derived = (per_rank(cp["seqlen"], cp["cp_size"]).astype("Int64") if len(cp)
               else pd.Series([], dtype="Int64"))
    if "tokens_per_rank" in cp.columns:
        return cp["tokens_per_rank"].astype("Int64").fillna(derived)
    return derived


def _norm(value):
    """A missing value matches a missing value (NaN != NaN)."""
    return None if value is None or (isinstance(value, float) and np.isnan(value)) else value


def cp_efficiency(cp: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """CP rows with the two numbers a reader weighs them by, each with a note where it is missing:

    * ``scaling`` (``scaling_note``): per-GPU TFLOPs/s ÷ the same strategy's at cp_size 1 with the
      same local kernel, options, mask, direction, dtype, shapes and tokens per rank, from the same
      CP table (weak scaling: 1.0 is perfect);
    * ``vs_one_gpu`` (``one_gpu_kernel``, ``one_gpu_tflops``, ``one_gpu_cell_id``, ``one_gpu_note``):
      per-GPU TFLOPs/s ÷ the fastest ok kernel cell of the kernel table on the *same total problem*
      (``seqlen``, mask, direction, dtype, shapes) on one GPU: what CP buys a user over one GPU.
      Above 1 it compares two measurements (other runs, other calls), not a gain.

    Also adds ``tokens_per_rank``."""
    out = cp.copy()
    out["tokens_per_rank"] = tokens_per_rank(cp)
    for column, empty in (("scaling", np.nan), ("scaling_note", None), ("vs_one_gpu", np.nan),
                          ("one_gpu_kernel", None), ("one_gpu_tflops", np.nan), ("one_gpu_cell_id", None),
                          ("one_gpu_note", None)):
        out[column] = empty
    if out.empty:
        return out
    keys = [k for k in BASELINE_KEYS if k in out.columns and k in kernels.columns]
    best: dict = {}  # (seqlen, keys...) → the fastest ok kernel row, or the statuses seen
    for row in kernels.itertuples(index=False):
        key = (int(row.seqlen),) + tuple(_norm(getattr(row, k)) for k in keys)
        have = best.get(key)
        if row.status == "ok" and pd.notna(row.tflops) and (have is None or row.tflops > have.tflops):
            best[key] = row
        else:
            best.setdefault(key, None)
    run_keys = [k for k in BASELINE_KEYS + ["strategy", "strategy_options", "local_kernel", "tokens_per_rank"]
                if k in out.columns]
    single = {tuple(_norm(r[k]) for k in run_keys): r for _, r in out[out["cp_size"] == 1].iterrows()}
    for i, row in out.iterrows():
        ok = row["status"] == "ok" and pd.notna(row["tflops_per_gpu"])
        one = single.get(tuple(_norm(row[k]) for k in run_keys))
        if one is None:
            out.at[i, "scaling_note"] = "no cp_size-1 cell of this strategy and local kernel at these tokens per rank"
        elif one["status"] != "ok" or pd.isna(one["tflops_per_gpu"]):
            out.at[i, "scaling_note"] = f"cp_size-1 cell {one['cell_id']} is {one['status']}"
        elif ok:
            out.at[i, "scaling"] = float(row["tflops_per_gpu"]) / float(one["tflops_per_gpu"])
        key = (int(row["seqlen"]),) + tuple(_norm(row[k]) for k in keys)
        if key not in best:
            out.at[i, "one_gpu_note"] = (f"no single-GPU kernel cell at {int(row['seqlen'])} tokens with the same mask, "
                                         "direction, dtype and shapes")
        elif best[key] is None:
            out.at[i, "one_gpu_note"] = f"no single-GPU kernel ran ok at {int(row['seqlen'])} tokens"
        else:
            base = best[key]
            out.at[i, "one_gpu_kernel"], out.at[i, "one_gpu_cell_id"] = base.kernel, base.cell_id
            out.at[i, "one_gpu_tflops"] = float(base.tflops)
            if ok:
                out.at[i, "vs_one_gpu"] = float(row["tflops_per_gpu"]) / float(base.tflops)
        if not ok:
            note = f"the CP cell is {row['status']}"
            for column in ("scaling_note", "one_gpu_note"):
                out.at[i, column] = out.at[i, column] or note
    return out


def layout_means(cp: pd.DataFrame) -> pd.DataFrame:
    """One row per CP cell measured on several document layouts (config ``cp_layouts``: cells
    ``<mask>~layout<i>``): named as layout 0's cell, its per-GPU TFLOPs/s (and p20/p80, median_ms,
    FLOPs) the mean over the layouts that ran ok, with ``layouts`` (how many), ``layout_min`` /
    ``layout_max`` and ``layout_std`` (their per-GPU TFLOPs/s; the sample standard deviation, NaN
    for one layout); ok when any layout is, but ``wrong`` when any layout is wrong (the reason
    names it): a strategy wrong on one draw of documents is wrong, whatever it does on the others.
    A layout that failed otherwise (error, timeout) stays out of the mean and among the failed
    cells.  A table without such cells is returned as it is (no new columns)."""
    from ..cells import split_layout

    if cp is None or cp.empty or "mask" not in cp.columns:
        return cp
    split = [split_layout(m) for m in cp["mask"]]
    if not any(layout for _, layout in split):
        return cp
    out = cp.copy()
    out["mask"] = [base for base, _ in split]
    out["cell_id"] = [cid.replace(mask, base, 1) for cid, mask, (base, _) in zip(cp["cell_id"], cp["mask"], split)]
    out["_layout"] = [layout for _, layout in split]
    rows = []
    for _, group in out.sort_values("_layout").groupby("cell_id", sort=False):
        row = group.iloc[0].copy()
        ok = group[(group["status"] == "ok") & group["tflops_per_gpu"].notna()]
        row["layouts"] = len(ok)
        row["layout_min"] = ok["tflops_per_gpu"].min() if len(ok) else np.nan
        row["layout_max"] = ok["tflops_per_gpu"].max() if len(ok) else np.nan
        row["layout_std"] = ok["tflops_per_gpu"].std() if len(ok) > 1 else np.nan
        if len(ok):
            first = ok.iloc[0]
            for column in ("tflops_per_gpu", "tflops_per_gpu_p20", "tflops_per_gpu_p80", "median_ms", "flops"):
                if column in ok.columns:
                    row[column] = ok[column].mean()
            for column in ("status", "reason"):
                row[column] = first[column]
        wrong = group[group["status"] == "wrong"]
        if len(wrong):
            row["status"] = "wrong"
            row["reason"] = "; ".join(f"layout {layout}: {reason}"
                                      for layout, reason in zip(wrong["_layout"], wrong["reason"]))
        rows.append(row)
    return pd.DataFrame(rows).drop(columns="_layout").reset_index(drop=True)


def rank_imbalance(rank_area: Iterable) -> list[float]:
    """Per row: max over mean of the ranks' attended pairs (NaN where not recorded or all zero)."""
    return [max(a) / (sum(a) / len(a)) if isinstance(a, (list, np.ndarray)) and len(a) and sum(a) else np.nan
            for a in rank_area]


def cp_table(cp: pd.DataFrame | None, kernels: pd.DataFrame) -> pd.DataFrame:
    """The CP table the report shows: ``cp_efficiency`` (over ``layout_means``) plus ``imbalance``
    (``rank_imbalance``)."""
    cp = cp_efficiency(empty_cp() if cp is None else layout_means(cp), kernels)
    if len(cp) and "rank_area" in cp.columns:
        cp["imbalance"] = rank_imbalance(cp["rank_area"])
    return cp


def best_strategies(cp: pd.DataFrame, masks: list[str] | None = None, tie_margin: float = 0.0) -> list[dict]:
    """The fastest correct CP strategy per (mask, cp_size, direction, dtype) by per-GPU TFLOPs/s, at
    the longest global seqlen where any strategy produced a number; ``cp`` comes from
    ``cp_efficiency`` (it has ``tokens_per_rank``, ``scaling`` and ``vs_one_gpu`` with their notes).

    An entry always has ``mask``, ``cp_size``, ``direction``, ``dtype`` and ``strategy`` (``None``
    when no strategy produced a number); with a winner also ``local_kernel``, ``seqlen``,
    ``tokens_per_rank`` (or ``None``), ``tflops_per_gpu``, ``scaling``, ``vs_one_gpu``, ``one_gpu_kernel``,
    ``one_gpu_note`` and
    ``cell_id``, and ``runner_up`` / ``runner_up_tflops`` / ``tied`` / ``tie`` / ``unsteady`` (as in
    ``best_kernels``) when another strategy has a number there; ``note`` as in ``best_kernels``.  Entries follow ``mask_order``, then cp_size."""
    best = []
    if cp.empty:
        return best
    for (mask, cp_size, direction, dtype), group in cp.groupby(["mask", "cp_size", "direction", "dtype"],
                                                               sort=False):
        ok = ok_rows(group, "tflops_per_gpu")
        entry = {"mask": mask, "cp_size": int(cp_size), "direction": direction, "dtype": dtype, "strategy": None}
        if ok.empty:
            entry["note"] = "no strategy produced a number (" + status_summary(group["status"]) + ")"
            best.append(entry)
            continue
        at, contested = _at_longest(group, ok, "tflops_per_gpu", "strategy", tie_margin)
        top = at.iloc[0]
        tpr = top["tokens_per_rank"] if "tokens_per_rank" in top and pd.notna(top["tokens_per_rank"]) else None
        entry.update(strategy=top["strategy"], local_kernel=top["local_kernel"], seqlen=int(top["seqlen"]),
                     tokens_per_rank=tpr, tflops_per_gpu=top["tflops_per_gpu"], scaling=top["scaling"],
                     vs_one_gpu=top["vs_one_gpu"], one_gpu_kernel=top["one_gpu_kernel"],
                     one_gpu_note=top["one_gpu_note"], cell_id=top["cell_id"], **contested)
        best.append(entry)
    order = mask_order(cp, masks)
    best.sort(key=lambda e: (order.index(e["mask"]), e["cp_size"]))
    return best


# --- both ------------------------------------------------------------------------------------


def answer_grid(entries: list[dict], row_keys: list[str], columns: list[tuple[str, str]]) -> list[dict]:
    """Entries laid out as rows (by ``row_keys``, first-seen order) × columns ((direction, dtype)
    pairs, e.g. ``combos``); a missing pair is ``None``."""
    rows: dict[tuple, dict] = {}
    for e in entries:
        key = tuple(e[k] for k in row_keys)
        rows.setdefault(key, {"key": dict(zip(row_keys, key)), "cells": {}})["cells"][(e["direction"], e["dtype"])] = e
    return [{"key": r["key"], "cells": [r["cells"].get(c) for c in columns]} for r in rows.values()]


def failed_cells(kernels: pd.DataFrame, cp: pd.DataFrame) -> list[dict]:
    """Every kernel and CP cell without a number: ``kind``, ``cell_id``, ``status``, ``marker``,
    ``reason`` and ``log`` (the workflow names each cell's log after its cell_id)."""
    failed = []
    for kind, df in (("kernel", kernels), ("cp", cp)):
        if df.empty:
            continue
        for rec in df[df["status"] != "ok"].itertuples(index=False):
            failed.append({"kind": kind, "cell_id": rec.cell_id, "status": rec.status,
                           "marker": status_marker(rec.status), "reason": rec.reason,
                           "log": run_dir.cell_log(kind, rec.cell_id)})
    return failed


def not_measured(kernels: pd.DataFrame, grid_cells: Iterable) -> list:
    """The grid's kernel cells (``longca.config.KernelCell``) that have no row (a run not finished
    yet), sorted by name."""
    have = set(kernels["cell_id"]) if "cell_id" in kernels else set()
    return sorted((c for c in grid_cells if c.name not in have), key=lambda c: c.name)


def per_kernel(cells: Iterable) -> list[tuple[str, int]]:
    """How many of these cells each kernel has, most first."""
    counts = collections.Counter(c.kernel for c in cells)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def distinct_counts(df: pd.DataFrame, columns: list[tuple[str, str, Callable[[Any], str]]],
                    count_label: str = "cells") -> pd.DataFrame:
    """How many rows share each combination of the given columns' values, as text: ``columns`` are
    ``(key, header, to_text)``; a column missing from the table or empty in every row is left out."""
    cols = [(k, h, f) for k, h, f in columns if k in df.columns]
    if df.empty or not cols:
        return pd.DataFrame()
    view = pd.DataFrame({h: [f(v) for v in df[k]] for k, h, f in cols})
    view = view[[h for h in view.columns if (view[h] != "").any()]]
    if view.columns.empty:
        return pd.DataFrame()
    return view.groupby(list(view.columns), dropna=False, sort=True).size().reset_index(name=count_label)


def _distinct(df: pd.DataFrame, column: str) -> list:
    return sorted({v for v in df[column].dropna()}) if column in df else []


def _numbers(rows: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(rows[name], errors="coerce").fillna(0.0) if name in rows else pd.Series(0.0, index=rows.index)


def timed_calls_s(rows: pd.DataFrame) -> pd.Series:
    """Each ok row's timed calls in seconds (``reps`` x ``median_ms``); 0 for any other row."""
    return (_numbers(rows, "reps") * _numbers(rows, "median_ms") / 1e3).where(rows["status"] == "ok", 0.0)


def gpu_work_s(rows: pd.DataFrame) -> pd.Series:
    """Each row's GPU work in seconds: what an ok cell's timing exists for, its warm-up
    (``warmup_spent_ms``) and its timed calls (``timed_calls_s``); 0 for any other row.
    Everything else a cell's wall holds (the gate, inputs and ``prepare``, the eager calls before
    capture, the memory part, building the problem) is what measuring costs beyond it."""
    warm_up = (_numbers(rows, "warmup_spent_ms") / 1e3).where(rows["status"] == "ok", 0.0)
    return warm_up + timed_calls_s(rows)


def measured_whole(rows: pd.DataFrame) -> pd.Series:
    """Rows whose every part was measured by their own job (none taken from the store, and an ok
    row's timing wall recorded): what a cell costs from nothing."""
    if "parts_reused" not in rows or "wall_s" not in rows or "time_wall_s" not in rows:
        return pd.Series(False, index=rows.index)
    timed = rows["time_wall_s"].notna() | (rows["status"] != "ok")
    return rows["parts_reused"].isna() & rows["wall_s"].notna() & timed


def cost_note(kernels: pd.DataFrame) -> str | None:
    """What the table's cells cost to measure, from the rows measured whole: their count, mean wall
    and GPU work, and how many rows are left out (None: no ok row measured whole)."""
    whole = kernels[measured_whole(kernels)]
    ok = whole[whole["status"] == "ok"]
    if not len(ok):
        return None
    wall, gpu = whole["wall_s"].astype(float), gpu_work_s(ok)
    left_out = len(kernels) - len(whole)
    # The device the timed calls ran on names the work: a CPU run's cells did no GPU work.
    work = "GPU work" if "device" in ok and (ok["device"] == "cuda").any() else "timed CPU work"
    ratio = f" ({wall.sum() / gpu.sum():.2f}× their {work})" if gpu.sum() > 0 else ""
    return (f"What measuring cost: {len(whole)} cells were measured whole ({len(ok)} ok), {wall.mean():.2f} s "
            f"of wall a cell on average, {wall.sum():.0f} s in all{ratio}; an ok cell's {work} is its "
            f"warm-up and timed calls ({gpu.mean():.2f} s on average)."
            + (f" Rows not counted (parts taken from the store, or measured before rows recorded each part's "
               f"wall): {left_out}." if left_out else ""))


def provenance_notes(kernels: pd.DataFrame, ceilings: dict | None = None, cp: pd.DataFrame | None = None,
                     tie_margin: float = 0.0) -> list[str]:
    """Where the ok rows of a table come from different runs or conditions, one sentence each:
    the report shows them above its answers, so a reader compares only what is comparable.
    ``cp``: the CP table with its efficiencies (``cp_table``)."""
    notes = _cp_efficiency_notes(cp, tie_margin)
    cost = cost_note(kernels) if len(kernels) else None
    notes += [cost] if cost else []
    ok = kernels[kernels["status"] == "ok"] if len(kernels) else kernels
    if not len(ok):
        return notes
    devices = _distinct(ok, "device_name")
    if len(devices) > 1:
        notes.append(f"Rows were measured on {len(devices)} devices ({', '.join(devices)}): compare kernels "
                     "only within one device.")
    hosts = _distinct(ok, "timed_on") or _distinct(ok, "hostname")
    # Machines may share a name (every cloud box a "vm"): the days the rows were timed on tell runs apart too.
    days = sorted({str(at)[:10] for at in ok["timed_at"].dropna()}) if "timed_at" in ok else []
    if len(hosts) > 1 or len(days) > 1:
        where = []
        if len(hosts) > 1:
            where.append(f"{len(hosts)} machines ({', '.join(map(str, hosts[:4]))}{', …' if len(hosts) > 4 else ''})")
        if len(days) > 1:
            where.append(f"{len(days)} days ({days[0]} to {days[-1]})")
        loads = ok["timed_load_1m"].dropna() if "timed_load_1m" in ok else pd.Series(dtype=float)
        load = (f"; the host's 1-minute load average when timed ranged {loads.min():.1f}–{loads.max():.1f}"
                if len(loads) > 1 and loads.max() > loads.min() else "")
        notes.append(f"Timings come from more than one run, on {' and '.join(where)}{load}: "
                     "re-timing a stage on another machine moved cells by up to a few percent "
                     "(docs/results/README.md), which is why close calls are ties.")
    if "kernel_library" in ok:
        for kernel, group in ok.groupby("kernel"):
            versions = _distinct(group, "kernel_library")
            if len(versions) > 1:
                notes.append(f"{kernel}'s rows were measured with different library versions: {'; '.join(versions)}.")
    on_gpu = ok[ok["device"] == "cuda"] if "device" in ok else ok.iloc[0:0]
    if len(on_gpu) and "peak_mem_bytes" in on_gpu:
        measured = int(on_gpu["peak_mem_bytes"].notna().sum())
        if measured < len(on_gpu):
            notes.append(f"Peak memory (what one call needs) was measured for {measured} of {len(on_gpu)} ok rows; "
                         "the others were timed before the memory probe existed and show none.")
    if "gate_area" in ok:
        structured = int(ok["gate_area"].notna().sum())
        if structured < len(ok):
            earlier = ("which rebuilt the mask at the gate's length with default parameters (several patterns "
                       "were then plain full or causal)")
            notes.append(f"{len(ok) - structured} of {len(ok)} ok rows passed the earlier correctness gate, {earlier}; "
                         + (f"the other {structured} passed the gate that keeps each mask's structure (gate_area)."
                            if structured else "none has been gated with its mask's structure kept yet."))
    for entry in (ceilings or {}).get("matmul", []):
        above = ok[(ok["dtype"] == entry.get("dtype")) & (ok["tflops"] > entry.get("tflops", float("inf")))]
        if len(above):
            notes.append(f"{len(above)} {entry.get('dtype')} rows exceed the matmul ceiling measured for this report "
                         f"({entry.get('tflops'):.3g} TFLOPs/s): the ceiling and those rows ran under different "
                         "conditions (load, clocks), so neither bounds the other here.")
    return notes


def _cp_efficiency_notes(cp: pd.DataFrame | None, tie_margin: float) -> list[str]:
    """CP rows faster per GPU than the best one-GPU kernel on the same problem beyond the tie margin:
    flagged, not published as a win (no parallel gain explains it)."""
    if cp is None or "vs_one_gpu" not in cp or not len(cp):
        return []
    above = cp[cp["vs_one_gpu"].notna() & ~tied_with_best(1.0, cp["vs_one_gpu"], tie_margin)]
    if not len(above):
        return []
    top = above.loc[above["vs_one_gpu"].idxmax()]
    return [f"CP rows faster per GPU than the best one-GPU kernel on the same problem: {len(above)} (up to "
            f"{top['vs_one_gpu']:.2f}×, {top['cell_id']} against {top['one_gpu_kernel']}). Parallelism cannot do "
            "that, so the CP cell and the kernel cell ran under different conditions (another run, other load) or "
            "as other calls (the strategy's blocks against one call); read it as a comparison of two "
            "measurements, not as a win."]


def longest_fits(kernels: pd.DataFrame, masks: list[str] | None = None,
                 by: list[str] | tuple[str, ...] = ("kernel", "mask", "direction", "dtype")) -> list[dict]:
    """Per kernel × mask × direction (× dtype; ``by``: those and more, e.g. ``device_name`` for a
    table of several GPU models) on a GPU: the longest length measured ok, what one call needed
    there (``peak_mem_bytes``, where the memory part measured it), and the shortest length that ran
    out of memory, if any: "does my length fit on this GPU with this kernel?", as measured
    (``memory_model`` predicts it from the peaks)."""
    gpu = kernels[kernels["device"] == "cuda"] if len(kernels) and "device" in kernels else kernels.iloc[0:0]
    out = []
    for key, group in gpu.groupby(list(by)):
        ok = group[group["status"] == "ok"]
        oom = group[group["status"] == "oom"]
        if not len(ok) and not len(oom):
            continue
        # By position: tables of several runs concatenated repeat index labels.
        longest = ok.iloc[int(ok["seqlen"].to_numpy().argmax())] if len(ok) else None
        out.append({**dict(zip(by, key)),
                    "longest_ok": int(longest["seqlen"]) if longest is not None else None,
                    "peak_mem_bytes": (longest["peak_mem_bytes"] if longest is not None
                                       and pd.notna(longest["peak_mem_bytes"]) else None),
                    "first_oom": int(oom["seqlen"].min()) if len(oom) else None,
                    "largest_measured": int(pd.concat([ok, oom])["seqlen"].max())})
    order = {m: i for i, m in enumerate(mask_order(gpu, masks))} if len(gpu) else {}
    return sorted(out, key=lambda e: (order.get(e["mask"], 1e9), e["direction"] != "fwd", e["kernel"], e["dtype"]))
