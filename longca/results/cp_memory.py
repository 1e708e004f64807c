"""A CP rank's measured peak memory from the plan's counted parts, fitted on one table and checked
on another (``longca plan``'s held-out memory line).

A CP cell's ``peak_mem_bytes`` (longca/execution/measure/cp_cell.py) is the allocator's whole peak
on the rank, so beside what a training step holds it counts what the measuring harness holds: the
global Q, K, V and upstream gradient it drew and dispatched from, ``cp_size`` shards' worth of each,
in rows measured before 2026-11-29 (since then a rank times its own shards only: ``inputs_held``).  The peak is modelled as a sum of terms
(``TERMS``: one definition each, a function of a row's counted parts) with coefficients fitted by
least squares on the relative error (as ``memory_model`` fits the kernels' peaks):

    peak ≈ c_constant + c_kernel · kernel + c_harness · harness + c_buffers · buffers

    kernel   the local kernel's memory model at the rank's tokens (its shards, outputs, gradients
             and workspace: ``plan.shard_need`` + ``Tables.workspace``)
    harness  the global inputs the harness keeps above cp_size 1 (``harness_bytes``)
    buffers  what the strategy holds beside its shards (``plan.BUFFERS``)
    constant the allocator's fixed part (library workspaces, the process group's buffers)

The coefficients are one set for every strategy and direction.  ``held_out`` fits them on rows of
one table and checks them on rows of another, refusing rows that are in both (``ROW_KEY``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

# Term -> its bytes from a frame of rows (columns: ``kernel``, ``buffers``, ``cp_size``,
# ``tokens_per_rank``, ``heads_q``, ``heads_kv``, ``head_dim``, ``itemsize``, ``batch``).
TERMS: dict[str, Callable[[pd.DataFrame], pd.Series]] = {}


def term(name: str):
    def register(fn):
        TERMS[name] = fn
        return fn
    return register


def harness_bytes(cp_size, tokens, heads_q, heads_kv, head_dim, itemsize, batch=1, inputs_held=None):
    """The global Q, K, V and upstream gradient every rank of a cell measured before 2026-11-29 kept
    while timed: ``cp_size`` shards of each; at cp_size 1 the shard is the whole (none extra).  A row
    whose ``inputs_held`` is ``shards`` (cp_cell's ``_timed_inputs``) kept none."""
    per_shard = batch * tokens * head_dim * itemsize * (2 * heads_q + 2 * heads_kv)
    held_global = np.asarray(pd.Series(inputs_held, dtype=object).fillna("global") != "shards") \
        if inputs_held is not None else True
    return np.where((np.asarray(cp_size) > 1) & held_global, np.asarray(cp_size) * per_shard, 0.0)


@term("constant")
def _constant(rows: pd.DataFrame) -> pd.Series:
    return pd.Series(1.0, index=rows.index)


@term("kernel")
def _kernel(rows: pd.DataFrame) -> pd.Series:
    return rows["kernel"].astype(float)


@term("harness")
def _harness(rows: pd.DataFrame) -> pd.Series:
    return pd.Series(harness_bytes(rows["cp_size"], rows["tokens_per_rank"], rows["heads_q"], rows["heads_kv"],
                                   rows["head_dim"], rows["itemsize"], rows["batch"],
                                   rows["inputs_held"] if "inputs_held" in rows else None),
                     index=rows.index, dtype=float)


@term("buffers")
def _buffers(rows: pd.DataFrame) -> pd.Series:
    return rows["buffers"].astype(float)


def design(rows: pd.DataFrame) -> np.ndarray:
    return np.column_stack([TERMS[name](rows).to_numpy(float) for name in TERMS])


def fit(rows: pd.DataFrame) -> dict[str, float]:
    """The terms' coefficients fitted on ``rows`` (their ``peak`` column), least squares on the
    relative error."""
    if len(rows) < len(TERMS):
        raise ValueError(f"{len(rows)} rows cannot fit {len(TERMS)} coefficients")
    peak = rows["peak"].to_numpy(float)
    coef, *_ = np.linalg.lstsq(design(rows) / peak[:, None], np.ones_like(peak), rcond=None)
    return dict(zip(TERMS, map(float, coef)))


def predict(coef: dict[str, float], rows: pd.DataFrame) -> np.ndarray:
    return design(rows) @ np.array([coef[name] for name in TERMS])


def errors(coef: dict[str, float], rows: pd.DataFrame) -> np.ndarray:
    """Relative errors of the predicted peaks (negative: below the measured)."""
    return predict(coef, rows) / rows["peak"].to_numpy(float) - 1


def summary(e) -> dict:
    e = np.asarray(e, float)
    a = np.abs(e)
    return {"rows": len(e), "median": float(np.median(a)) if len(e) else None,
            "max": float(a.max()) if len(e) else None, "under": int((e < 0).sum()), "over": int((e > 0).sum())}


# A measured row: its cell on its GPU model (a cell's id names the spec, which two GPUs share).
ROW_KEY = ("cell_id", "device_name")


def _keys(rows: pd.DataFrame) -> set:
    return set(map(tuple, rows[list(ROW_KEY)].astype(str).to_numpy()))


def held_out(train: pd.DataFrame, test: pd.DataFrame) -> dict:
    """Coefficients fitted on ``train``, checked on ``test``: overall and per direction.  Rows of
    ``test`` that ``train`` holds too (``ROW_KEY``) are refused: the check is held out."""
    shared = _keys(train) & _keys(test)
    if shared:
        raise ValueError(f"{len(shared)} rows are in both the fitted and the checked rows")
    coef = fit(train)
    e = errors(coef, test)
    directions = test["direction"].to_numpy()
    return {"coef": coef, "fitted_rows": len(train), **summary(e),
            "by_direction": {d: summary(e[directions == d]) for d in ("fwd", "bwd") if (directions == d).any()}}
