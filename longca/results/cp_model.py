"""A CP strategy's per-GPU TFLOPs/s at any GPU count, predicted from what was measured.

One step of a strategy on P ranks (slowest rank; the layouts keep ranks within a few percent of
each other, `rank_area` in the CP table) is modelled as

    compute  = FLOPs / P / (R · e)          R: the local kernel (FFA) on the same mask, from the
                                            kernel table of the GPU model, at the length its calls
                                            see (a ring's: one shard; Ulysses' and the all-gather's:
                                            the whole sequence); e: the strategy's own efficiency on
                                            that mask at cp_size 1 (fitted)
    comm     = bytes / B                    bytes: what the strategy sends per rank (BYTES, below);
                                            B: the effective NVLink bandwidth (fitted); across nodes
                                            the network's per GPU (given) bounds a ring's steps and
                                            an all-to-all's bytes that leave the node
    step     = compute + exposed(comm)      ring-like transfers hide behind the compute they overlap
                                            (exposed = max(0, comm - compute)); all-to-all waits
                                            (exposed = comm); usp has one of each

Only what the kernel table cannot give is fitted: ``e`` per strategy, mask and direction (from cp_size-1
rows, where nothing moves) and ``B`` (from the rows at the sizes given for fitting).  The byte
formulas are in units of one rank's K+V shard (bf16) and its Q shard, as ``longca.cp.comm.Comm``
counts them; the tests hold them to the measured ``comm_bytes``.  Strategies whose traffic is not
modelled (magi: it sends only what the mask needs; torch_cp: its bytes are not counted; double_ring
backward) are predicted as ``None`` with the reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..attention import masks
from ..attention.flops import attention_flops


def _ulysses_degree(p: int) -> int:
    """usp's default inner degree: the largest divisor of ``p`` not above √p (``longca/cp/usp.py``)."""
    return max(d for d in range(1, int(math.isqrt(p)) + 1) if p % d == 0)


def _a2a(p: int, q: float, kv: float, heads_kv: int) -> float:
    """Ulysses' all-to-alls of Q, K, V, O (and of dO, dQ, dK, dV backward): (p-1)/p of what a rank
    holds leaves it; K/V are replicated to ``p`` heads when there are fewer KV heads than ranks."""
    return (p - 1) / p * (2 * q + kv * max(1.0, p / heads_kv))


# (fwd bytes, bwd bytes) per rank per step, from P, the Q shard's and the K+V shard's bytes and the
# KV head count; and which part of them overlaps compute: "overlap" (ring-like) or "wait" (a2a).
@dataclass(frozen=True)
class Traffic:
    fwd: Callable[[int, float, float, int], dict[str, float]]
    bwd: Optional[Callable[[int, float, float, int], dict[str, float]]]
    # The length whose kernel rate a local call runs at: a ring's calls are shard × shard blocks
    # ("shard"), Ulysses' and the all-gather's attend the whole sequence ("total").
    calls_at: str = "shard"


def _usp(direction: str):
    def bytes_(p, q, kv, hkv):
        u = _ulysses_degree(p)
        r = p // u
        ring = (r - 1) * kv if direction == "fwd" else (3 * r - 1) * kv if r > 1 else 0.0
        return {"wait": _a2a(u, q, kv, hkv) if u > 1 else 0.0, "overlap": ring}
    return bytes_


BYTES: dict[str, Traffic] = {
    # K/V go round the ring once; backward they go round again with float32 dK/dV (2 shards' worth).
    "ring": Traffic(lambda p, q, kv, h: {"overlap": (p - 1) * kv},
                    lambda p, q, kv, h: {"overlap": (3 * p - 1) * kv}),
    "double_ring": Traffic(lambda p, q, kv, h: {"overlap": (p - 1) * kv}, None),
    # Gather K/V; backward gather again and reduce-scatter float32 dK/dV.
    "allgather": Traffic(lambda p, q, kv, h: {"overlap": (p - 1) * kv},
                         lambda p, q, kv, h: {"overlap": 3 * (p - 1) * kv}, "total"),
    "ulysses": Traffic(lambda p, q, kv, h: {"wait": _a2a(p, q, kv, h)},
                       lambda p, q, kv, h: {"wait": _a2a(p, q, kv, h)}, "total"),
    "usp": Traffic(_usp("fwd"), _usp("bwd")),
}
NOT_MODELLED = {"magi": "MagiAttention sends only the K/V ranges remote queries attend (mask-dependent)",
                "torch_cp": "PyTorch's CP collectives are not counted (comm_bytes 0)"}


@dataclass(frozen=True)
class Links:
    """Where a step's bytes go: ``nvlink_gbs`` inside a node (the fitted effective bandwidth), and
    ``network_gbs`` per GPU across nodes, for a group larger than ``gpus_per_node``."""

    nvlink_gbs: float
    gpus_per_node: int = 8
    network_gbs: float = 50.0


def shard_bytes(tokens: int, heads_q: int, heads_kv: int, head_dim: int, itemsize: int = 2) -> tuple[float, float]:
    """One rank's Q shard and K+V shard, in bytes."""
    return tokens * heads_q * head_dim * itemsize, 2 * tokens * heads_kv * head_dim * itemsize


def sent_bytes(strategy: str, direction: str, p: int, tokens: int, heads_q: int, heads_kv: int,
               head_dim: int) -> Optional[dict[str, float]]:
    """Bytes one rank sends per step, by how they meet compute (``overlap`` / ``wait``), or None."""
    traffic = BYTES.get(strategy)
    fn = None if traffic is None else getattr(traffic, direction)
    if fn is None:
        return None
    if p == 1:
        return {"overlap": 0.0, "wait": 0.0}
    q, kv = shard_bytes(tokens, heads_q, heads_kv, head_dim)
    return {"overlap": 0.0, "wait": 0.0, **fn(p, q, kv, heads_kv)}


def comm_seconds(nbytes: float, p: int, links: Links, pattern: str) -> float:
    """Time to send ``nbytes`` from one rank.  Inside a node at NVLink speed.  Across nodes, a ring's
    steps go in lockstep, so its slowest hop (the network's) sets every step (``pattern`` "ring"); an
    all-to-all sends the share of peers outside the node at the network's per-GPU speed and the rest
    over NVLink, the slower part bounding ("a2a")."""
    if p <= links.gpus_per_node:
        return nbytes / (links.nvlink_gbs * 1e9)
    if pattern == "ring":
        return nbytes / (links.network_gbs * 1e9)
    outside = (p - links.gpus_per_node) / (p - 1)
    return max(nbytes * (1 - outside) / (links.nvlink_gbs * 1e9), nbytes * outside / (links.network_gbs * 1e9))


class KernelRates:
    """The local kernel's TFLOPs/s per (mask, direction) at each length of a kernel table."""

    def __init__(self, kernels: pd.DataFrame, kernel: str = "ffa"):
        ok = kernels[(kernels["status"] == "ok") & (kernels["kernel"] == kernel)]
        self.kernel = kernel
        self.rates = {(m, d): g.groupby("seqlen")["tflops"].median().sort_index()
                      for (m, d), g in ok.groupby(["mask", "direction"])}

    def at(self, mask: str, direction: str, seqlen: int) -> float:
        """The rate at ``seqlen``, interpolated in log length; held flat beyond the table's ends."""
        series = self.rates.get((mask, direction))
        if series is None:
            raise KeyError(f"the kernel table has no ok {self.kernel} row for {mask} {direction}")
        x = np.log2(series.index.to_numpy(dtype=float))
        return float(np.interp(math.log2(seqlen), x, series.to_numpy(dtype=float)))


@dataclass(frozen=True)
class Cell:
    strategy: str
    mask: str
    direction: str
    tokens_per_rank: int
    cp_size: int
    flops: float
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128

    @classmethod
    def from_row(cls, row) -> "Cell":
        return cls(row.strategy, row.mask, row.direction, int(row.tokens_per_rank), int(row.cp_size),
                   float(row.flops), int(row.heads_q), int(row.heads_kv), int(row.head_dim))

    @classmethod
    def planned(cls, strategy: str, mask: str, direction: str, tokens_per_rank: int, cp_size: int,
                mask_params: Optional[dict] = None, seed: int = 1, heads_q: int = 64, heads_kv: int = 8,
                head_dim: int = 128) -> "Cell":
        """A cell not measured: its FLOPs from the mask built at the total length."""
        built = masks.build(mask, tokens_per_rank * cp_size, seed=seed, **(mask_params or {}))
        return cls(strategy, mask, direction, tokens_per_rank, cp_size,
                   attention_flops(built, heads_q, head_dim, direction), heads_q, heads_kv, head_dim)


@dataclass
class Model:
    """``efficiency[(strategy, mask, direction)]`` and the links; ``predict`` gives per-GPU TFLOPs/s and
    the parts of the step, or the reason it cannot."""

    rates: KernelRates
    efficiency: dict[tuple[str, str, str], float]
    links: Links

    def step(self, cell: Cell) -> dict:
        why = NOT_MODELLED.get(cell.strategy)
        sent = None if why else sent_bytes(cell.strategy, cell.direction, cell.cp_size, cell.tokens_per_rank,
                                           cell.heads_q, cell.heads_kv, cell.head_dim)
        if sent is None:
            return {"tflops_per_gpu": None, "why": why or f"{cell.strategy} {cell.direction}'s bytes are not modelled"}
        e = self.efficiency.get((cell.strategy, cell.mask, cell.direction))
        if e is None:
            return {"tflops_per_gpu": None,
                    "why": f"no cp_size-1 row to fit {cell.strategy} {cell.mask} {cell.direction}"}
        length = cell.tokens_per_rank * (cell.cp_size if BYTES[cell.strategy].calls_at == "total" else 1)
        rate = self.rates.at(cell.mask, cell.direction, length) * e
        compute = cell.flops / cell.cp_size / (rate * 1e12)
        overlap = comm_seconds(sent["overlap"], cell.cp_size, self.links, "ring")
        wait = comm_seconds(sent["wait"], cell.cp_size, self.links, "a2a")
        exposed = wait + max(0.0, overlap - compute)
        seconds = compute + exposed
        return {"tflops_per_gpu": cell.flops / cell.cp_size / seconds / 1e12, "compute_ms": compute * 1e3,
                "exposed_comm_ms": exposed * 1e3, "sent_bytes": sent["overlap"] + sent["wait"],
                "formula": "compute + wait + max(0, overlapped transfer - compute)", "why": None}

    def predict(self, cell: Cell) -> Optional[float]:
        return self.step(cell)["tflops_per_gpu"]


def fit_efficiency(cp: pd.DataFrame, rates: KernelRates) -> dict[tuple[str, str, str], float]:
    """Each strategy's median ratio, over its cp_size-1 rows of a mask, of its TFLOPs/s to the local
    kernel's at the same length."""
    one = cp[(cp["status"] == "ok") & (cp["cp_size"] == 1)]
    ratios: dict[tuple[str, str, str], list[float]] = {}
    for row in one.itertuples():
        try:
            ratios.setdefault((row.strategy, row.mask, row.direction), []).append(
                row.tflops_per_gpu / rates.at(row.mask, row.direction, int(row.seqlen)))
        except KeyError:
            continue
    return {k: float(np.median(v)) for k, v in ratios.items()}


def fit(cp: pd.DataFrame, kernels: pd.DataFrame, fit_rows: pd.Series, gpus_per_node: int = 8,
        network_gbs: float = 50.0) -> Model:
    """The model fitted on ``cp[fit_rows]`` (cp_size > 1 rows fit the bandwidth; the cp_size-1 rows
    of the whole table fit the efficiencies: they move no byte)."""
    rates = KernelRates(kernels)
    efficiency = fit_efficiency(cp, rates)
    train = cp[fit_rows & (cp["status"] == "ok") & (cp["cp_size"] > 1)]
    cells = [Cell.from_row(r) for r in train.itertuples()]
    measured = train["tflops_per_gpu"].to_numpy()
    best, best_err = None, math.inf
    for gbs in np.geomspace(20, 2000, 121):  # a grid: the error is not smooth in B (max() terms)
        model = Model(rates, efficiency, Links(float(gbs), gpus_per_node, network_gbs))
        pred = [model.predict(c) for c in cells]
        errs = [abs(p / m - 1) for p, m in zip(pred, measured) if p is not None]
        err = float(np.median(errs)) if errs else math.inf
        if err < best_err:
            best, best_err = model, err
    return best


def held_out(model: Model, cp: pd.DataFrame, rows: pd.Series) -> pd.DataFrame:
    """Predicted against measured on ``cp[rows]`` (ok rows the model covers)."""
    out = []
    for row in cp[rows & (cp["status"] == "ok")].itertuples():
        p = model.predict(Cell.from_row(row))
        if p is not None:
            out.append({"strategy": row.strategy, "mask": row.mask, "direction": row.direction,
                        "tokens_per_rank": row.tokens_per_rank, "cp_size": row.cp_size,
                        "measured": row.tflops_per_gpu, "predicted": p, "error": p / row.tflops_per_gpu - 1})
    return pd.DataFrame(out)


def ranking_agreement(checked: pd.DataFrame, tie: float = 0.05) -> tuple[int, int]:
    """(cells where the predicted best strategy is the measured best or tied with it within ``tie``,
    cells with two or more strategies) over mask × tokens × cp_size × direction."""
    agree = total = 0
    for _, g in checked.groupby(["mask", "tokens_per_rank", "cp_size", "direction"]):
        if len(g) < 2:
            continue
        total += 1
        pick = g.loc[g["predicted"].idxmax()]
        agree += pick["measured"] >= g["measured"].max() * (1 - tie)
    return agree, total


def params_of(row) -> dict:
    return json.loads(row.mask_params) if isinstance(row.mask_params, str) else {}


def predictions(cp: pd.DataFrame, kernels: pd.DataFrame, strategies: list[str], mask: str, direction: str,
                tokens_per_rank: int, cp_sizes: list[int], gpus_per_node: int = 8, network_gbs: float = 50.0,
                nvlink_gbs: Optional[float] = None) -> tuple[Model, pd.DataFrame]:
    """The model fitted on the whole measured table ``cp`` (``nvlink_gbs`` given: that bandwidth
    instead of the fitted one) and its predictions for each strategy × cp_size; FLOPs from the mask
    built at each total length with the parameters the measured rows used."""
    known = set(BYTES) | set(NOT_MODELLED)
    unknown = [s for s in strategies if s not in known]
    if unknown:
        raise ValueError(f"strategy {', '.join(map(repr, unknown))} is not modelled (modelled: {', '.join(sorted(BYTES))})")
    rows = cp[cp["mask"] == mask]
    if rows.empty:
        raise ValueError(f"mask {mask!r} has no row in the measured CP table (it has: "
                         f"{', '.join(sorted(cp['mask'].unique()))})")
    model = fit(cp, kernels, cp["cp_size"] > 1, gpus_per_node, network_gbs)
    if nvlink_gbs is not None:
        model = Model(model.rates, model.efficiency, Links(nvlink_gbs, gpus_per_node, network_gbs))
    params, seed = params_of(rows.iloc[0]), int(rows.iloc[0]["seed"])
    out = []
    for p in cp_sizes:
        for strategy in strategies:
            cell = Cell.planned(strategy, mask, direction, tokens_per_rank, p, params, seed)
            out.append({"strategy": strategy, "cp_size": p, **model.step(cell)})
    return model, pd.DataFrame(out)
