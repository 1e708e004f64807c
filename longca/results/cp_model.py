"""A CP strategy's per-GPU TFLOPs/s at any GPU count, predicted from what was measured (``longca predict``).

The slowest rank's step is planned as the strategy plans it (``rank_blocks``: the layout, each
block's mask from ``longca.cp.blocks.restrict``, in step order) and each local call costs

    block    = tiles · t_tile / e + rows · t_row + t_call
               tiles: the TILE × TILE tiles the call touches; t_tile: one full tile at the local
               kernel's rate on the full mask in the kernel table; e: the strategy's own efficiency
               on that mask and length at cp_size 1 (where nothing moves); rows: the query rows the
               call reduces into (float32 output read and written); t_call: a call's fixed cost
    transfer = bytes / B                    bytes: what the strategy sends per rank (BYTES, below);
                                            B: the effective NVLink bandwidth; across nodes the
                                            network's per GPU (given) bounds a ring's lockstep hops
                                            and an all-to-all's bytes that leave the node
    step     = waited transfers + Σ max(block, hop) + last block
               all-to-alls are waited for; each ring hop (the all-gather: its one gather) hides
               behind the block computed while it is in flight

Only what the kernel table cannot give is fitted: ``e`` on the cp_size-1 rows, and ``B``, ``t_row``
and ``t_call`` on the rows above cp_size 1 chosen for fitting (a grid search).  The byte formulas
are in units of one rank's K+V shard and its Q shard, as ``longca.cp.comm.Comm`` counts them; the
tests hold them to the measured ``comm_bytes``.  Strategies whose traffic is not modelled (magi: it
sends only what the mask needs; groupcast likewise; torch_cp: PyTorch's own ring; double_ring
backward) are predicted as ``None`` with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..attention import masks
from ..attention.flops import DIRECTION_FACTOR, attention_flops
from ..attention.masks import AttnMask, AttnSlice, SliceKind
from ..cells import cp_seqlen
from .. import cp
from ..cp import layout as layouts
from ..cp.allgather import _complement
from ..cp.blocks import restrict
from ..cp import comm
from ..cp.sequence_parallel import divisor_at_most
from .tables import tied_with_best

# The local kernel's tile (FFA's forward: 128 queries × 128 keys): a call costs the tiles it touches.
TILE = 128
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def slice_tiles(s: AttnSlice) -> int:
    """The TILE × TILE (query, key) tiles one slice touches, tiled from its own corner as FFA tiles
    each range: per query tile, the key tiles between its first row's first key and its last row's
    last key (both ends are non-decreasing in the row; ``AttnSlice.key_bounds`` in integer arithmetic,
    as this runs for every piece of every block of a plan)."""
    if s.q_end <= s.q_start or s.k_end <= s.k_start:
        return 0
    if s.kind is SliceKind.FULL:
        return -(-(s.q_end - s.q_start) // TILE) * -(-(s.k_end - s.k_start) // TILE)
    shifts_lo = s.kind in (SliceKind.INV_CAUSAL, SliceKind.BI_CAUSAL)   # j >= k_start + (i - q_start)
    caps_hi = s.kind in (SliceKind.CAUSAL, SliceKind.BI_CAUSAL)         # j <= i + lk - lq
    total = 0
    for q0 in range(s.q_start, s.q_end, TILE):
        q1 = min(q0 + TILE, s.q_end) - 1
        lo = s.k_start + (q0 - s.q_start) if shifts_lo else s.k_start
        hi = min(s.k_end, q1 + s.k_end - s.q_end + 1) if caps_hi else s.k_end
        if hi > lo:
            total += -(-(hi - s.k_start) // TILE) - (lo - s.k_start) // TILE
    return total


def tiles(slices) -> tuple[int, int]:
    """A call's (tiles touched, query rows summed over its slices: the output rows it reduces into)."""
    slices = list(slices)
    return sum(slice_tiles(s) for s in slices), sum(s.q_end - s.q_start for s in slices if s.area())


def _sampled(p: int) -> list[int]:
    return sorted({0, p // 2, p - 1}) if p <= 8 else [0]


def rank_blocks(strategy: str, mask: AttnMask, p: int) -> tuple[tuple[float, float], ...]:
    """The slowest rank's local calls in step order, each as (tiles touched, query rows reduced), per
    query head group: a ring member's blocks in ring order (its own first, then what each hop
    brings; Ulysses' degree divides them among its ranks), the all-gather's own block and then the
    rest in sequence order, Ulysses' one block.  Ranks sampled: first, middle and last up to 8
    ranks, the first beyond (the layouts balance them; a ring of 64 is 64 blocks per rank)."""
    if strategy == "allgather":
        layout = layouts.build("auto", mask, p)
        candidates = []
        for r in _sampled(p):
            mine = layout.shards[r]
            candidates.append((tiles(restrict(mask, mine, mine)),
                               tiles(restrict(mask, mine, _complement(mine, mask.seqlen_k)))))
    else:
        u = {"ulysses": p, "usp": divisor_at_most(p, p ** 0.5)}.get(strategy, 1)
        ring = p // u
        layout = layouts.build("contiguous" if ring == 1 else "auto", mask, p)

        def member(i):
            return layout.concatenated(range(i * u, (i + 1) * u))
        candidates = [tuple(tuple(x / u for x in tiles(restrict(mask, member(me), member((me - s) % ring))))
                            for s in range(ring)) for me in _sampled(ring)]
    return max(candidates, key=lambda steps: sum(t for t, _ in steps))


def _a2a(p: int, q: float, kv: float, heads_kv: int) -> float:
    """Ulysses' all-to-alls of Q, K, V, O (and of dO, dQ, dK, dV backward): (p-1)/p of what a rank
    holds leaves it; K/V are replicated to ``p`` heads when there are fewer KV heads than ranks."""
    return comm.sent_bytes("all_to_all", 2 * q + kv * max(1.0, p / heads_kv), p)


# (fwd bytes, bwd bytes) per rank per step, from P, the Q shard's and the K+V shard's bytes and the
# KV head count; and which part of them overlaps compute: "overlap" (ring-like) or "wait" (a2a).
@dataclass(frozen=True)
class Traffic:
    fwd: Callable[[int, float, float, int], dict[str, float]]
    bwd: Optional[Callable[[int, float, float, int], dict[str, float]]]


def _usp(direction: str):
    def bytes_(p, q, kv, hkv):
        u = divisor_at_most(p, p ** 0.5)  # usp's default degree
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
    "allgather": Traffic(lambda p, q, kv, h: {"overlap": comm.sent_bytes("all_gather", kv, p)},
                         lambda p, q, kv, h: {"overlap": 3 * comm.sent_bytes("all_gather", kv, p)}),
    "ulysses": Traffic(lambda p, q, kv, h: {"wait": _a2a(p, q, kv, h)},
                       lambda p, q, kv, h: {"wait": _a2a(p, q, kv, h)}),
    "usp": Traffic(_usp("fwd"), _usp("bwd")),
}
NOT_MODELLED = {"magi": "MagiAttention sends only the K/V ranges remote queries attend (mask-dependent)",
                "groupcast": "groupcast sends only the K/V rows remote queries attend (mask- and layout-dependent)",
                "torch_cp": "PyTorch's ring (all-gather or all-to-all rotation, K/V expanded to the query heads) "
                            "is not modelled"}


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
               head_dim: int, itemsize: int = 2) -> Optional[dict[str, float]]:
    """Bytes one rank sends per step, by how they meet compute (``overlap`` / ``wait``), or None."""
    traffic = BYTES.get(strategy)
    fn = None if traffic is None else getattr(traffic, direction)
    if fn is None:
        return None
    if p == 1:
        return {"overlap": 0.0, "wait": 0.0}
    q, kv = shard_bytes(tokens, heads_q, heads_kv, head_dim, itemsize)
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


def tile_seconds(kernels: pd.DataFrame, direction: str, heads_q: int, head_dim: int, kernel: str = "ffa",
                 reference: int = 32768) -> float:
    """What one full tile costs the local kernel: its FLOPs at the kernel's rate on the full mask at
    ``reference`` tokens in the kernel table (a length where the rate has stopped growing)."""
    ok = kernels[(kernels["status"] == "ok") & (kernels["kernel"] == kernel) & (kernels["mask"] == "full")
                 & (kernels["direction"] == direction)]
    if ok.empty:
        raise ValueError(f"the kernel table has no ok {kernel} row on the full mask {direction}: what one tile "
                         f"of the CP rows' local kernel costs (a run with {kernel} among its kernels and full "
                         "among its masks measures it)")
    near = ok.iloc[(ok["seqlen"] - reference).abs().argsort()[:1]]["seqlen"].iloc[0]
    rate = ok[ok["seqlen"] == near]["tflops"].median()
    return DIRECTION_FACTOR[direction] * 4.0 * TILE * TILE * heads_q * head_dim / (rate * 1e12)


@dataclass(frozen=True)
class Cell:
    strategy: str
    mask: str
    direction: str
    tokens_per_rank: int
    cp_size: int
    mask_params: str = "{}"
    seed: int = 1
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128
    itemsize: int = 2  # bytes per element of Q, K, V

    @classmethod
    def from_row(cls, row) -> "Cell":
        return cls(row.strategy, row.mask, row.direction, int(row.tokens_per_rank), int(row.cp_size),
                   row.mask_params if isinstance(row.mask_params, str) else "{}",
                   int(row.seed) if pd.notna(row.seed) else 0,
                   int(row.heads_q), int(row.heads_kv), int(row.head_dim), ITEMSIZE.get(row.dtype, 2))

    @property
    def flops(self) -> float:
        return _flops(self.mask, cp_seqlen(self.tokens_per_rank, self.cp_size), self.mask_params, self.seed, self.heads_q,
                      self.head_dim, self.direction)


@functools.lru_cache(maxsize=None)
def _mask(name: str, seqlen: int, params: str, seed: int) -> AttnMask:
    return masks.build(name, seqlen, seed=seed, **json.loads(params))


@functools.lru_cache(maxsize=None)
def _flops(name: str, seqlen: int, params: str, seed: int, heads_q: int, head_dim: int, direction: str) -> float:
    return attention_flops(_mask(name, seqlen, params, seed), heads_q, head_dim, direction)


@functools.lru_cache(maxsize=None)
def _rank_blocks(strategy: str, name: str, seqlen: int, params: str, seed: int, p: int):
    return rank_blocks(strategy, _mask(name, seqlen, params, seed), p)


def cell_blocks(cell: Cell) -> tuple[tuple[float, float], ...]:
    p = cell.cp_size
    return _rank_blocks(cell.strategy, cell.mask, cp_seqlen(cell.tokens_per_rank, p), cell.mask_params, cell.seed, p)


def step_seconds(blocks: list[float], overlapped: float, waited: float) -> float:
    """One step from its blocks' compute times: each transfer overlaps the block computed while it is
    in flight (a ring's hop the block before it; the all-gather the rank's own block), so a step is
    waited transfers + Σ over blocks but the last of max(block, its share of the overlapped
    transfers) + the last block."""
    if len(blocks) == 1:
        return waited + blocks[0] + overlapped
    hop = overlapped / (len(blocks) - 1)
    return waited + sum(max(b, hop) for b in blocks[:-1]) + blocks[-1]


@dataclass
class Model:
    """What one tile costs per direction, each strategy's efficiency on a mask at a length, and the
    links; ``step`` gives per-GPU TFLOPs/s and the parts of the step, or the reason it cannot."""

    tile_s: dict[str, float]
    efficiency: dict[tuple[str, str, str], dict[int, float]]
    links: Links
    call_s: float = 0.0  # what each local call costs beyond its tiles (launch, a persistent kernel's tail)
    row_s: float = 0.0   # what each query row a call reduces into costs (float32 output read and written)

    def block_seconds(self, block, direction: str, e: float) -> float:
        """An empty block is skipped, not called (as the strategies do)."""
        tiles_, rows = block
        return tiles_ * self.tile_s[direction] / e + rows * self.row_s + self.call_s if tiles_ else 0.0

    def _efficiency(self, cell: Cell) -> Optional[float]:
        """At the cell's tokens per rank, or the nearest length measured at cp_size 1."""
        by_length = self.efficiency.get((cell.strategy, cell.mask, cell.direction))
        if not by_length:
            return None
        return by_length[min(by_length, key=lambda t: abs(math.log2(t / cell.tokens_per_rank)))]

    def step(self, cell: Cell) -> dict:
        # What the strategy itself refuses (heads its degree does not divide, degrees that do not tile
        # the GPUs) gets no figure: it cannot run.
        refused = cp.get(cell.strategy).sized(cell.cp_size).refuses(cell.heads_q, cell.heads_kv)
        if refused:
            return {"tflops_per_gpu": None, "why": refused, "refused": True}
        why = NOT_MODELLED.get(cell.strategy)
        sent = None if why else sent_bytes(cell.strategy, cell.direction, cell.cp_size, cell.tokens_per_rank,
                                           cell.heads_q, cell.heads_kv, cell.head_dim, cell.itemsize)
        if sent is None:
            return {"tflops_per_gpu": None, "why": why or f"{cell.strategy} {cell.direction}'s bytes are not modelled"}
        e = self._efficiency(cell)
        if e is None:
            return {"tflops_per_gpu": None,
                    "why": f"no cp_size-1 row to fit {cell.strategy} {cell.mask} {cell.direction}"}
        planned = cell_blocks(cell)
        blocks = [self.block_seconds(b, cell.direction, e) for b in planned]
        overlap = comm_seconds(sent["overlap"], cell.cp_size, self.links, "ring")
        wait = comm_seconds(sent["wait"], cell.cp_size, self.links, "a2a")
        seconds = step_seconds(blocks, overlap, wait)
        compute = sum(blocks)
        return {"tflops_per_gpu": cell.flops / cell.cp_size / seconds / 1e12, "compute_ms": compute * 1e3,
                "exposed_comm_ms": (seconds - compute) * 1e3, "sent_bytes": sent["overlap"] + sent["wait"],
                "tiles": sum(t for t, _ in planned), "why": None}

    def predict(self, cell: Cell) -> Optional[float]:
        return self.step(cell)["tflops_per_gpu"]


def fit_efficiency(cp: pd.DataFrame, tile_s: dict[str, float], call_s: float = 0.0, row_s: float = 0.0
                   ) -> dict[tuple[str, str, str], dict[int, float]]:
    """Each strategy's cp_size-1 rows: the tile model's time for the mask over the measured time less
    one call's cost, per mask, direction and length (at cp_size 1 nothing moves and the rank makes
    one call: this is the local attention's own efficiency, fragments and merges included)."""
    one = cp[(cp["status"] == "ok") & (cp["cp_size"] == 1) & cp["strategy"].isin(list(BYTES))]
    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for row in one.itertuples():
        cell = Cell.from_row(row)
        blocks = cell_blocks(cell)
        fixed = sum(rows * row_s + call_s for t, rows in blocks if t)
        work = max(row.median_ms * 1e-3 - fixed, 1e-6)
        out.setdefault((row.strategy, row.mask, row.direction), {})[int(row.tokens_per_rank)] = (
            sum(t for t, _ in blocks) * tile_s[row.direction] / work)
    return out


def local_kernel(cp: pd.DataFrame) -> str:
    """The local kernel most of the table's ok CP rows ran (its full-mask rate prices a tile)."""
    ok = cp[cp["status"] == "ok"]
    return str(ok["local_kernel"].mode().iloc[0]) if len(ok) and "local_kernel" in ok else "ffa"


def fit(cp: pd.DataFrame, kernels: pd.DataFrame, fit_rows: pd.Series, gpus_per_node: int = 8,
        network_gbs: float = 50.0, kernel: str = "ffa") -> Model:
    """The model fitted on ``cp[fit_rows]``: the per-call cost and the NVLink bandwidth on its
    cp_size > 1 rows (a grid: the error is not smooth in them, max() terms), the efficiencies on the
    cp_size-1 rows of the whole table (they move no byte)."""
    first = cp.iloc[0]
    tile_s = {d: tile_seconds(kernels, d, int(first["heads_q"]), int(first["head_dim"]), kernel)
              for d in sorted(set(cp["direction"]))}
    train = cp[fit_rows & (cp["status"] == "ok") & (cp["cp_size"] > 1)]
    cells = [Cell.from_row(r) for r in train.itertuples()]
    measured = train["tflops_per_gpu"].to_numpy()
    best, best_err = None, math.inf
    for call_us, row_ns in itertools.product((0, 40, 80, 160, 320), (0, 8, 16, 32, 48, 64)):
        efficiency = fit_efficiency(cp, tile_s, call_us * 1e-6, row_ns * 1e-9)
        for gbs in np.geomspace(20, 2000, 41):
            model = Model(tile_s, efficiency, Links(float(gbs), gpus_per_node, network_gbs), call_us * 1e-6,
                          row_ns * 1e-9)
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


def exposed_comm(model: Model, cp: pd.DataFrame) -> pd.DataFrame:
    """The measured exposed communication of each ok row that has one (config ``cp_exposed_comm``:
    the step less the same step with its collectives local copies) beside the model's for that cell
    (``Model.step``'s ``exposed_comm_ms``: the step less its blocks' compute); ``predicted`` None with
    the model's reason where it gives none.  Both are the slowest rank's; a measured value inside the
    two timings' spreads is a tie with zero (``spread_ms``: the wider of the two p20–p80 ranges)."""
    columns = ["strategy", "mask", "direction", "tokens_per_rank", "cp_size", "measured_exposed_comm_ms",
               "spread_ms", "predicted_exposed_comm_ms", "why"]
    if "exposed_comm_ms" not in cp:
        return pd.DataFrame(columns=columns)
    out = []
    for row in cp[(cp["status"] == "ok") & cp["exposed_comm_ms"].notna()].itertuples():
        step = model.step(Cell.from_row(row))
        spread = max(row.p80_ms - row.p20_ms, row.step_ms_local_comm_p80 - row.step_ms_local_comm_p20)
        out.append({"strategy": row.strategy, "mask": row.mask, "direction": row.direction,
                    "tokens_per_rank": row.tokens_per_rank, "cp_size": row.cp_size,
                    "measured_exposed_comm_ms": row.exposed_comm_ms, "spread_ms": spread,
                    "predicted_exposed_comm_ms": step.get("exposed_comm_ms"), "why": step["why"]})
    return pd.DataFrame(out, columns=columns)


def ranking_agreement(checked: pd.DataFrame, tie: float = 0.05) -> tuple[int, int]:
    """(cells where the predicted best strategy is the measured best or tied with it
    (``tables.tied_with_best`` at margin ``tie``), cells with two or more strategies) over mask ×
    tokens × cp_size × direction."""
    agree = total = 0
    for _, g in checked.groupby(["mask", "tokens_per_rank", "cp_size", "direction"]):
        if len(g) < 2:
            continue
        total += 1
        pick = g.loc[g["predicted"].idxmax()]
        agree += bool(tied_with_best(pick["measured"], g["measured"].max(), tie))
    return agree, total


def _first(rows: pd.DataFrame) -> Cell:
    """A measured row as a cell: its mask's parameters and seed, shapes and dtype, which the cells
    predicted for it share."""
    return Cell.from_row(next(rows.head(1).itertuples()))


def predictions(cp: pd.DataFrame, kernels: pd.DataFrame, strategies: list[str], mask: str, direction: str,
                tokens_per_rank: int, cp_sizes: list[int], gpus_per_node: int = 8, network_gbs: float = 50.0,
                nvlink_gbs: Optional[float] = None) -> tuple[Model, pd.DataFrame]:
    """The model fitted on the whole measured table ``cp`` (``nvlink_gbs`` given: that bandwidth
    instead of the fitted one) and its predictions for each strategy × cp_size; the mask built at
    each total length with the parameters and seed the measured rows used."""
    known = set(BYTES) | set(NOT_MODELLED)
    unknown = [s for s in strategies if s not in known]
    if unknown:
        raise ValueError(f"strategy {', '.join(map(repr, unknown))} is not modelled (modelled: {', '.join(sorted(BYTES))})")
    rows = cp[cp["mask"] == mask]
    if rows.empty:
        raise ValueError(f"mask {mask!r} has no row in the measured CP table (it has: "
                         f"{', '.join(sorted(cp['mask'].unique()))})")
    if direction not in set(rows["direction"]):
        raise ValueError(f"mask {mask!r} has no {direction} row in the measured CP table")
    model = fit(cp, kernels, cp["cp_size"] > 1, gpus_per_node, network_gbs, kernel=local_kernel(cp))
    if nvlink_gbs is not None:
        model = Model(model.tile_s, model.efficiency, Links(nvlink_gbs, gpus_per_node, network_gbs), model.call_s,
                      model.row_s)
    measured = _first(rows)
    out = []
    for p in cp_sizes:
        for strategy in strategies:
            cell = dataclasses.replace(measured, strategy=strategy, direction=direction,
                                       tokens_per_rank=tokens_per_rank, cp_size=p)
            out.append({"strategy": strategy, "cp_size": p, **model.step(cell)})
    return model, pd.DataFrame(out)


# The report's predicted sizes beyond what a run measured (8 GPUs per node, 50 GB/s per GPU across).
REPORT_SIZES = (8, 16, 32, 64, 96)


def report_prediction(cp: pd.DataFrame, kernels: pd.DataFrame, mask: str, sizes=REPORT_SIZES) -> dict:
    """What the report shows for ``mask``: the model fitted on the run's own tables and its forward
    predictions, at the run's smallest tokens per rank, at the sizes measured and ``sizes``; where the
    run measured two CP sizes above 1, the model fitted without the largest and checked on it.  A
    dict with ``predicted``, ``measured``, ``caption``; or ``why`` when the run cannot fit it."""
    ok = cp[(cp["status"] == "ok") & cp["strategy"].isin(list(BYTES))] if len(cp) else cp
    measured_sizes = sorted(ok["cp_size"].unique()) if len(ok) else []
    above = [p for p in measured_sizes if p > 1]
    if 1 not in measured_sizes or not above:
        have = ", ".join(map(str, measured_sizes)) or "none"
        return {"why": "no prediction: the model is fitted on the run's own ok CP rows at cp_size 1 (the local "
                       f"attention alone) and above 1; this run has cp_size {have}"}
    kernel = local_kernel(ok)
    try:
        model = fit(cp, kernels, cp["cp_size"] > 1, kernel=kernel)
    except ValueError as exc:
        return {"why": f"no prediction: {exc}"}
    rows = ok[ok["mask"] == mask]
    if rows.empty:
        return {"why": f"no prediction: no ok CP row on {mask} of a modelled strategy"}
    direction = "fwd" if (rows["direction"] == "fwd").any() else rows["direction"].iloc[0]
    tokens = int(rows["tokens_per_rank"].min())
    rows = rows[(rows["direction"] == direction) & (rows["tokens_per_rank"] == tokens)]
    measured = _first(rows)
    predicted = []
    for p in sorted(set(measured_sizes) | set(sizes)):
        for strategy in sorted(rows["strategy"].unique()):
            cell = dataclasses.replace(measured, strategy=strategy, cp_size=p)
            predicted.append({"strategy": strategy, "cp_size": p, "tflops_per_gpu": model.predict(cell)})
    check = "not checked on held-out cells (the run measured one CP size above 1)"
    if len(above) >= 2:
        held = fit(cp, kernels, cp["cp_size"] < max(above), kernel=kernel)
        checked = held_out(held, cp, cp["cp_size"] == max(above))
        if len(checked):
            agree, total = ranking_agreement(checked)
            check = (f"fitted without cp_size {max(above)} and checked on its {len(checked)} rows: median error "
                     f"{checked['error'].abs().median() * 100:.0f} %, best strategy named in {agree} of {total} cells")
    caption = (f"{mask}, {direction}, {tokens} tokens per GPU: measured (points) and predicted (dashed) by "
               f"longca predict from this run's tables — a model, not a measurement. Fitted: NVLink "
               f"{model.links.nvlink_gbs:.0f} GB/s, {model.call_s * 1e6:.0f} µs per local call, "
               f"{model.row_s * 1e9:.0f} ns per reduced query row, local kernel {kernel}; beyond "
               f"{model.links.gpus_per_node} GPUs, {model.links.network_gbs:g} GB/s of network per GPU assumed. "
               f"Model {check}.")
    return {"predicted": pd.DataFrame(predicted), "caption": caption,
            "measured": rows[["strategy", "cp_size", "tflops_per_gpu"]]}
