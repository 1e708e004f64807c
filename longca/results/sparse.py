"""The sparse study's answer: the fastest block-sparse kernel per block size, kept fraction and
length, and what sparsity buys there over the fastest dense kernel on the full mask.

Rows of a per-head block pattern (``masks.HEAD_PATTERNS``) are grouped by their tiles (uniform,
or variable sizes around a mean), block (the mean for variable tiles), nominal kept fraction,
length, direction and dtype; the dense side is the fastest ``ok`` row of the
``full`` mask at the same length, direction and dtype in the same table (measured in the same run,
so the ratio is side by side).  The speed-up is a time ratio, dense ÷ sparse: above 1 the sparse
kernel finishes sooner than dense attention on the whole square.
"""

from __future__ import annotations

import json

import pandas as pd

from ..attention.masks import BLOCK_SPARSE_HEADS, HEAD_PATTERNS, VARIABLE_BLOCK_SPARSE_HEADS
from . import tables

DENSE_PATTERN = "full"
TILES = {BLOCK_SPARSE_HEADS: "uniform", VARIABLE_BLOCK_SPARSE_HEADS: "variable"}
GROUP = ["tiles", "block", "kept", "seqlen", "direction", "dtype"]


def block_label(tiles: str, block: int) -> str:
    """How a group's block reads in a table: ``128``, or ``512 (variable)`` for variable tiles."""
    return f"{block}" if tiles == TILES[BLOCK_SPARSE_HEADS] else f"{block} ({tiles})"


def sparse_rows(kernels: pd.DataFrame) -> pd.DataFrame:
    """The rows of per-head block patterns, with ``tiles`` (``TILES``), ``block``, ``kept``
    (nominal) and ``kept_actual`` (the attended fraction, exactly) from the mask's resolved
    parameters."""
    if kernels.empty or "pattern" not in kernels:
        return kernels.iloc[0:0].assign(tiles=[], block=[], kept=[], kept_actual=[])
    rows = kernels[kernels["pattern"].isin(HEAD_PATTERNS)].copy()
    rows["tiles"] = rows["pattern"].map(TILES)
    params = [json.loads(p) if isinstance(p, str) and p else {} for p in rows.get("mask_params_resolved", [])]
    rows["block"] = [p.get("block") for p in params]
    rows["kept"] = [p.get("kept") for p in params]
    rows["kept_actual"] = [p.get("kept_actual") for p in params]
    return rows


def _fastest_dense(kernels: pd.DataFrame) -> dict[tuple, pd.Series]:
    dense = tables.ok_rows(kernels[kernels["pattern"] == DENSE_PATTERN], "median_ms")
    best = dense.loc[dense.groupby(["seqlen", "direction", "dtype"])["median_ms"].idxmin()] if len(dense) else dense
    return {(int(r.seqlen), r.direction, r.dtype): r for r in best.itertuples(index=False)}


def answers(kernels: pd.DataFrame, tie_margin: float = 0.0) -> list[dict]:
    """One entry per (tiles, block, kept, seqlen, direction, dtype) of the per-head block patterns: the
    fastest ``ok`` sparse kernel (``kernel``, ``tflops``, ``median_ms``, ``cell_id``; ``None``
    when none has a number), ``failed`` (the sparse kernels without a number there, with their
    status marker), the runner-up and contest as in
    ``tables.best_kernels``, and ``dense_kernel``, ``dense_ms`` and ``speedup`` (dense ÷ sparse
    time) when the full mask was measured at that length."""
    rows = sparse_rows(kernels)
    if rows.empty:
        return []
    dense = _fastest_dense(kernels)
    # The kernels that run these patterns (a number somewhere); the rest say they take one mask for
    # every head, which is no news in each group.
    sparse_kernels = set(tables.ok_rows(rows)["kernel"])
    out = []
    for (tiles, block, kept, seqlen, direction, dtype), g in rows.groupby(GROUP, sort=True):
        ok = tables.ok_rows(g).sort_values(["tflops", "kernel"], ascending=[False, True])
        failed = g[(g["status"] != "ok") & g["kernel"].isin(sparse_kernels)]
        e = {"tiles": tiles, "block": int(block), "kept": float(kept), "kept_actual": float(g["kept_actual"].iloc[0]),
             "seqlen": int(seqlen), "direction": direction, "dtype": dtype, "kernel": None,
             "failed": ", ".join(f"{k} {tables.status_marker(s)}" for k, s in zip(failed["kernel"], failed["status"])),
             "runner_up": None, "dense_kernel": None, "speedup": None}
        if len(ok):
            top = ok.iloc[0]
            e.update(kernel=top["kernel"], tflops=float(top["tflops"]), median_ms=float(top["median_ms"]),
                     cell_id=top["cell_id"])
            if len(ok) > 1:
                second = ok.iloc[1]
                e.update(runner_up=second["kernel"], runner_up_tflops=float(second["tflops"]),
                         ratio=float(top["tflops"]) / float(second["tflops"]),
                         **tables.contest(ok, "tflops", "kernel", tie_margin))
            full = dense.get((int(seqlen), direction, dtype))
            if full is not None:
                e.update(dense_kernel=full.kernel, dense_ms=float(full.median_ms),
                         speedup=float(full.median_ms) / e["median_ms"])
        out.append(e)
    return out
