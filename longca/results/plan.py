"""``longca plan``: for a shape, a total length, a mask and a GPU model, per CP strategy at a GPU count,
the attention memory one GPU holds, whether it fits, and the forward and backward time of a step.

Memory per GPU, each part from the shape and the strategy (``tokens`` = total / GPUs per rank):

* inputs, outputs, gradients: the rank's Q, K, V shards (``cp_model.shard_bytes``), its output and
  upstream gradient, the float32 LSE, and for a backward dQ, dK, dV (``config.input_bytes``, the count
  the fit check before a cell uses too);
* the local kernel's workspace: its memory model (``memory_model``, fitted on the kernel table's
  peaks) at the rank's tokens, less the inputs' part above;
* the strategy's buffers (``BUFFERS``): what it holds besides its shards while it communicates, from
  what it sends (``cp_model.sent_bytes`` over ``longca.cp.comm.sent_bytes``).

Time: ``cp_model``'s model (the one ``longca predict`` prints), fitted once on the CP table, its step
for each strategy and direction; what a strategy refuses at that size (``Strategy.refuses``) gets
no figure.  Each input is said to be measured or extrapolated, and the models' held-out errors are
computed here from the same tables.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from .. import config
from .. import cp as strategies
from ..cp import comm
from ..cp.sequence_parallel import divisor_at_most
from . import cp_memory, cp_model, memory_model

GIB = 2**30
STRATEGIES = ("ring", "allgather", "ulysses", "usp", "double_ring", "magi")
FEWEST_UP_TO = 1024


@dataclass(frozen=True)
class Shape:
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"
    batch: int = 1

    @property
    def itemsize(self) -> int:
        return config.DTYPE_BYTES[self.dtype]


def _per_hop(strategy: str, direction: str, p: int, tokens: int, shape: Shape) -> float:
    """A ring's bytes per hop: what it sends in a step over its p - 1 hops."""
    sent = cp_model.sent_bytes(strategy, direction, p, tokens, shape.heads_q, shape.heads_kv, shape.head_dim,
                               shape.itemsize)
    return (sent["overlap"] + sent["wait"]) / max(p - 1, 1) if sent else 0.0


def _ring(strategy: str, slots: int) -> Callable[[str, int, int, Shape], float]:
    """``slots`` hops' worth in flight: the block computed and the next one received (double
    buffering: 2); a hop is K/V forward, K/V and float32 dK/dV backward, as the ring sends them."""
    return lambda direction, p, tokens, shape: slots * _per_hop(strategy, direction, p, tokens, shape) if p > 1 else 0.0


def _allgather(direction: str, p: int, tokens: int, shape: Shape) -> float:
    """The gathered K/V of the whole sequence (own shard plus what the all-gather brings), and
    backward the float32 dK/dV of the whole sequence before they are reduce-scattered."""
    _, kv = cp_model.shard_bytes(tokens, shape.heads_q, shape.heads_kv, shape.head_dim, shape.itemsize)
    gathered = kv + comm.sent_bytes("all_gather", kv, p) if p > 1 else 0.0
    return gathered * (1 + (4 / shape.itemsize if direction == "bwd" else 0))


def _head_copies(u: int, tokens: int, shape: Shape, direction: str) -> float:
    """Ulysses' head-sharded copies over ``u`` ranks: Q and O of the rank's heads over the group's
    tokens (the size of its shards), K/V likewise but replicated when fewer KV heads than ranks;
    backward also dO, dQ, dK, dV."""
    if u <= 1:
        return 0.0
    q, kv = cp_model.shard_bytes(tokens, shape.heads_q, shape.heads_kv, shape.head_dim, shape.itemsize)
    copies = 2 * q + kv * max(1.0, u / shape.heads_kv)
    return copies * (2 if direction == "bwd" else 1)


def _usp(direction: str, p: int, tokens: int, shape: Shape) -> float:
    u = divisor_at_most(p, p ** 0.5)  # usp's default degree, as cp_model sends it
    _, kv = cp_model.shard_bytes(tokens, shape.heads_q, shape.heads_kv, shape.head_dim, shape.itemsize)
    ring = 2 * kv * max(1.0, u / shape.heads_kv) * (3 if direction == "bwd" else 1) if p // u > 1 else 0.0
    return _head_copies(u, tokens, shape, direction) + ring


# Strategy -> bytes it holds beside its shards (direction, GPUs, tokens per GPU, shape); None: not
# modelled.  double_ring: the inner ring's two blocks and the outer hop posted ahead of it.
BUFFERS: dict[str, Optional[Callable[[str, int, int, Shape], float]]] = {
    "ring": _ring("ring", 2),
    "double_ring": lambda d, p, t, s: 3 * _per_hop("ring", d, p, t, s) if p > 1 else 0.0,
    "allgather": _allgather,
    "ulysses": lambda d, p, t, s: _head_copies(p, t, s, d),
    "usp": _usp,
    "magi": None,  # fetches the K/V ranges its queries attend: mask- and dispatch-dependent
}


def shard_need(tokens: int, shape: Shape, direction: str) -> dict[str, float]:
    """The rank's own tensors: inputs (Q, K, V), outputs (O, the upstream gradient dO, the float32
    LSE) and, backward, the gradients (dQ, dK, dV).  Q, K, V, O and the gradients are what
    ``config.input_bytes`` counts (tests hold the two together)."""
    q, kv = cp_model.shard_bytes(tokens, shape.heads_q, shape.heads_kv, shape.head_dim, shape.itemsize)
    lse = shape.heads_q * tokens * 4
    return {"inputs": shape.batch * (q + kv), "outputs": shape.batch * (2 * q + lse),
            "gradients": shape.batch * (q + kv) if direction == "bwd" else 0.0}


@dataclass
class Tables:
    """The measured tables a plan reads, and the models fitted on them (once)."""

    cp: pd.DataFrame
    kernels: pd.DataFrame
    cp_name: str = "cp"
    kernels_name: str = "kernels"

    def __post_init__(self):
        self.local_kernel = cp_model.local_kernel(self.cp)
        self.memory = memory_model.models(self.kernels)
        self.time_model = cp_model.fit(self.cp, self.kernels, self.cp["cp_size"] > 1, kernel=self.local_kernel)

    def workspace(self, mask: str, direction: str, tokens: int, shape: Shape) -> tuple[float | None, str]:
        """The local kernel's workspace at ``tokens`` (its memory model less the rank's own tensors),
        and where it came from."""
        found = [(key, m) for key, m in self.memory.items()
                 if key[:4] == (self.local_kernel, mask, direction, shape.dtype)]
        if not found:
            return None, f"no memory model of {self.local_kernel} on {mask} {direction}"
        key, model = found[0]
        own = sum(shard_need(tokens, shape, direction).values())
        state = "extrapolated" if model.extrapolated(tokens) else "interpolated"
        return max(0.0, model.bytes(tokens) - own), (f"{state}: {self.local_kernel}'s {model.terms} fitted at "
                                                     f"{min(model.lengths)}-{max(model.lengths)} tokens")

    def step_ms(self, strategy: str, mask: str, direction: str, tokens: int, p: int, shape: Shape) -> tuple[float | None, str | None]:
        """The model's step (ms) for one direction, or why none."""
        rows = self.cp[(self.cp["mask"] == mask) & (self.cp["status"] == "ok")]
        if rows.empty:
            return None, f"the CP table has no ok row on {mask}"
        base = cp_model.Cell.from_row(next(rows.head(1).itertuples()))
        cell = dataclasses.replace(base, strategy=strategy, direction=direction, tokens_per_rank=tokens, cp_size=p,
                                   heads_q=shape.heads_q, heads_kv=shape.heads_kv, head_dim=shape.head_dim,
                                   itemsize=shape.itemsize)
        step = self.time_model.step(cell)
        if step["tflops_per_gpu"] is None:
            return None, step["why"]
        return cell.flops / p / (step["tflops_per_gpu"] * 1e12) * 1e3, None


def row(tables: Tables, strategy: str, mask: str, total: int, p: int, shape: Shape, memory_bytes: float) -> dict:
    """One strategy at ``p`` GPUs: memory by part (bytes; the backward's, which holds the most), whether
    it fits, and the forward and backward step times."""
    tokens = -(-total // p)
    refused = strategies.get(strategy).sized(p).refuses(shape.heads_q, shape.heads_kv)
    out = {"strategy": strategy, "gpus": p, "tokens_per_gpu": tokens, "refused": refused}
    need = shard_need(tokens, shape, "bwd")
    workspace, _ = tables.workspace(mask, "bwd", tokens, shape)
    buffers = BUFFERS.get(strategy)
    out.update(need, workspace=workspace, buffers=buffers("bwd", p, tokens, shape) if buffers else None)
    known = [v for v in (*need.values(), workspace, out["buffers"]) if v is not None]
    out["total"] = sum(known)
    out["complete"] = workspace is not None and out["buffers"] is not None
    # What is known is a lower bound: past the memory it does not fit; within it only when complete.
    out["fits"] = (None if refused else False if out["total"] > memory_bytes
                   else True if out["complete"] else None)
    for direction in ("fwd", "bwd"):
        ms, why = (None, refused) if refused else tables.step_ms(strategy, mask, direction, tokens, p, shape)
        out[f"{direction}_ms"], out[f"{direction}_why"] = ms, why
    return out


def fewest(tables: Tables, strategy: str, mask: str, total: int, shape: Shape, memory_bytes: float,
           up_to: int = FEWEST_UP_TO) -> dict:
    """The fewest GPUs (a power of two up to ``up_to``) at which ``strategy`` fits, else its row at ``up_to``."""
    p = 1
    while True:
        r = row(tables, strategy, mask, total, p, shape, memory_bytes)
        if r["fits"] or p >= up_to:
            return r
        p *= 2


# The two ways a plan reaches past its table: more GPUs than measured, more tokens per GPU.
HELD_OUT_AXES = {"cp_size": "GPU count", "tokens_per_rank": "tokens per GPU"}


def held_out_time(tables: Tables, axis: str) -> dict:
    """The time model fitted without the table's largest ``axis`` value (``HELD_OUT_AXES``; for tokens
    per GPU its cp_size-1 rows left out too, so the efficiency comes from a shorter length) and
    checked on the rows above cp_size 1 there: median and largest absolute relative error of per-GPU
    TFLOPs/s, over how many rows; ``why`` where the table has one value of ``axis`` to fit on."""
    cp = tables.cp[tables.cp["status"] == "ok"]
    values = sorted(cp[cp["cp_size"] > 1][axis].unique())
    if len(values) < 2:
        return {"axis": axis, "held": values[-1] if values else None, "rows": 0,
                "why": f"one {HELD_OUT_AXES[axis]} above cp_size 1 measured: nothing to fit without it"}
    held = values[-1]
    train = cp[cp[axis] < held] if axis == "tokens_per_rank" else cp
    model = cp_model.fit(train, tables.kernels, (train["cp_size"] > 1) & (train[axis] < held),
                         kernel=tables.local_kernel)
    checked = cp_model.held_out(model, cp, (cp[axis] == held) & (cp["cp_size"] > 1))
    errors = checked["error"].abs() if len(checked) else pd.Series(dtype=float)
    return {"axis": axis, "held": int(held), "rows": len(checked), "why": None,
            "median": float(errors.median()) if len(errors) else None,
            "max": float(errors.max()) if len(errors) else None}


def held_out_memory(tables: Tables) -> dict:
    """The memory model's held-out error over the kernel table (each group without its longest length)."""
    limits = memory_model.limits(tables.kernels)
    errors = limits["held_out_error"].dropna().abs() if len(limits) else pd.Series(dtype=float)
    return {"groups": len(errors), "median": float(errors.median()) if len(errors) else None,
            "max": float(errors.max()) if len(errors) else None}


def peak_rows(tables: Tables) -> pd.DataFrame:
    """The CP table's ok rows with a measured per-rank peak (``peak_mem_bytes``, the largest rank's)
    of strategies whose buffers are modelled, with the plan's counted parts: ``kernel`` (the rank's
    own tensors and the local kernel's workspace), ``buffers``, and ``counted`` (their sum, what the
    plan prints)."""
    cp = tables.cp
    out = []
    if "peak_mem_bytes" not in cp:
        return pd.DataFrame(out)
    for r in cp[(cp["status"] == "ok") & cp["peak_mem_bytes"].notna() & cp["strategy"].isin(list(BUFFERS))].itertuples():
        buffers = BUFFERS[r.strategy]
        shape = Shape(int(r.heads_q), int(r.heads_kv), int(r.head_dim), r.dtype, int(r.batch))
        tokens = int(r.tokens_per_rank)
        workspace, _ = tables.workspace(r.mask, r.direction, tokens, shape)
        if buffers is None or workspace is None:
            continue
        kernel = sum(shard_need(tokens, shape, r.direction).values()) + workspace
        held = buffers(r.direction, int(r.cp_size), tokens, shape)
        out.append({"cell_id": r.cell_id, "device_name": getattr(r, "device_name", None), "strategy": r.strategy,
                    "direction": r.direction, "cp_size": int(r.cp_size), "tokens_per_rank": tokens,
                    "heads_q": shape.heads_q, "heads_kv": shape.heads_kv, "head_dim": shape.head_dim,
                    "itemsize": shape.itemsize, "batch": shape.batch, "kernel": kernel, "buffers": held,
                    "counted": kernel + held, "peak": float(r.peak_mem_bytes),
                    "inputs_held": getattr(r, "inputs_held", None)})
    return pd.DataFrame(out)


def memory_check(tables: Tables) -> dict:
    """The plan's counted memory (``peak_rows``' ``counted``) against the CP table's measured per-rank
    peaks: relative errors, nothing fitted."""
    rows = peak_rows(tables)
    if not len(rows):
        return {"rows": 0, "why": "the CP table has no peak-memory column"}
    return {**cp_memory.summary(rows["counted"] / rows["peak"] - 1), "why": None}


def memory_held_out(tables: Tables, train: Optional[Tables]) -> dict:
    """``cp_memory``'s coefficients fitted on ``train``'s CP table (another GPU model's) and checked on
    ``tables``' measured peaks, per direction; ``why`` where there is nothing to fit on."""
    if train is None:
        return {"rows": 0, "why": "no other CP table to fit on"}
    fitted, checked = peak_rows(train), peak_rows(tables)
    if len(fitted) < len(cp_memory.TERMS) or not len(checked):
        return {"rows": 0, "why": f"too few rows with a peak ({len(fitted)} to fit, {len(checked)} to check)"}
    return {**cp_memory.held_out(fitted, checked), "fitted_on": train.cp_name, "why": None}
