"""``groupcast``: every rank fetches only the K/V rows its queries attend, from the ranks that hold
them, in one all-to-all with per-rank sizes; dK/dV of those rows go back the same way and are added
where they live.  MagiAttention names the two transfers group-cast and group-reduce.

What it saves depends on the layout.  Under a zigzag layout every rank needs nearly every key, and
this moves what ``allgather`` moves.  Its own layout for packed documents (``whole_documents``)
keeps documents whole on one rank each, with equal token counts and the ranks' areas balanced by
cutting a few documents into contiguous pieces, so only those cross ranks.  The rank's own block is
computed while the transfer is in flight, as ``allgather`` does, then the fetched rows in one more
call.
"""

from __future__ import annotations


import numpy as np
import torch

from ..attention.masks import AttnMask
from . import layout as layouts
from . import register
from .base import Strategy
from .blocks import Span, area, merge_slices, restrict, shard_length, spans_from_ranges
from .comm import all_to_all_uneven, sent_bytes
from .local import BlockAttention

# Documents are placed whole or cut into contiguous pieces; ``spread_above_pct`` cuts those longer
# than that share of a shard by zigzag instead (over as few ranks as keep the pieces within it).
# Contiguous is the default: a zigzag-cut document gives its ranks overlapping query ranges in their
# own block, which FFA then reduces with atomics (measured: lab/data/groupcast_layouts_4xh100_2026-11-28).
#
# The rebalancing moves pieces until the busiest rank has at most BALANCE_TOLERANCE times the mean
# area, or after REBALANCE_STEPS moves per rank.
BALANCE_TOLERANCE = 1.005
REBALANCE_STEPS = 4


def row_area_prefix(mask: AttnMask) -> np.ndarray:
    """``prefix[i]``: (query, key) pairs on query rows ``[0, i)``, so rows ``[a, b)`` have
    ``prefix[b] - prefix[a]``."""
    keys = np.zeros(mask.seqlen_q, dtype=np.int64)
    for s in mask.slices:
        rows = np.arange(s.q_start, s.q_end)
        lo, hi = s.key_bounds(rows)
        keys[s.q_start:s.q_end] += np.maximum(hi - lo, 0)
    return np.concatenate([[0], np.cumsum(keys)])


def _place_documents(mask: AttnMask, world: int, prefix: np.ndarray, spread_above: float | None):
    """Documents whole, in order of decreasing area, each to the least loaded rank with room for
    it; one no rank has room for in contiguous pieces filling the least loaded ranks; with
    ``spread_above``, one longer than that share of a shard by zigzag over the roomiest ranks.
    Returns each rank's ranges."""
    caps = [b - a for a, b in layouts._even_cuts(0, mask.seqlen_q, world)]
    room, load = list(caps), [0] * world
    per_rank: list[list[tuple[int, int]]] = [[] for _ in range(world)]

    def place(rank: int, start: int, end: int) -> None:
        per_rank[rank].append((start, end))
        room[rank] -= end - start
        load[rank] += int(prefix[end] - prefix[start])

    bounds = np.concatenate([[0], np.cumsum(mask.documents)])
    docs = sorted(zip(bounds[:-1].tolist(), bounds[1:].tolist()), key=lambda d: (-(prefix[d[1]] - prefix[d[0]]), d[0]))
    limit = max(int(spread_above * min(caps)), 1) if spread_above else mask.seqlen_q
    for a, b in docs:
        if b - a > limit:
            n = min(world, -(-(b - a) // limit))
            ranks = sorted(range(world), key=lambda r: (-room[r], load[r], r))[:n]
            pieces = layouts._zigzag_ranges(a, b - a, n)
            if all(room[r] >= sum(e - s for s, e in p) for r, p in zip(ranks, pieces)):
                for rank, ranges in zip(ranks, pieces):
                    for r in ranges:
                        place(rank, *r)
                continue
        fits = [r for r in range(world) if room[r] >= b - a]
        if fits:
            place(min(fits, key=lambda r: (load[r], r)), a, b)
            continue
        while a < b:
            rank = min((r for r in range(world) if room[r]), key=lambda r: (load[r], r))
            n = min(room[rank], b - a)
            place(rank, a, a + n)
            a += n
    return per_rank


def _rebalance(per_rank: list[list[tuple[int, int]]], prefix: np.ndarray) -> None:
    """Even out the ranks' areas in place, keeping their token counts: the busiest rank gives the
    tail of one of its ranges (under a causal mask the costliest rows) to the least loaded rank,
    which gives back as many tokens from the head of one of its ranges; of all pairs of ranges, the
    exchange whose area difference is closest to half the gap.  Each exchange cuts at most two
    documents into two contiguous pieces."""
    world = len(per_rank)
    for _ in range(REBALANCE_STEPS * world):
        load = [sum(int(prefix[b] - prefix[a]) for a, b in r) for r in per_rank]
        hi, lo = max(range(world), key=lambda r: (load[r], -r)), min(range(world), key=lambda r: (load[r], r))
        if load[hi] <= BALANCE_TOLERANCE * sum(load) / world:
            return
        want, best = (load[hi] - load[lo]) / 2, None
        for i, (a1, b1) in enumerate(per_rank[hi]):
            for j, (a2, b2) in enumerate(per_rank[lo]):
                x = np.arange(1, min(b1 - a1, b2 - a2) + 1)
                gain = (prefix[b1] - prefix[b1 - x]) - (prefix[a2 + x] - prefix[a2])
                k = int(np.argmin(np.abs(gain - want)))
                miss = abs(float(gain[k]) - want)
                if gain[k] > 0 and (best is None or miss < best[0]):
                    best = (miss, i, j, int(x[k]))
        if best is None:
            return
        _, i, j, n = best
        (a1, b1), (a2, b2) = per_rank[hi][i], per_rank[lo][j]
        per_rank[hi][i:i + 1] = [(a1, b1 - n)] if b1 - n > a1 else []
        per_rank[hi].append((a2, a2 + n))
        per_rank[lo][j:j + 1] = [(a2 + n, b2)] if b2 > a2 + n else []
        per_rank[lo].append((b1 - n, b1))


def whole_documents(mask: AttnMask, world: int, spread_above: float | None = None) -> layouts.Layout:
    """Documents kept whole where they can be, ranks balanced by area; equal shards (±1 token).

    ``_place_documents`` puts whole documents on ranks (cutting only those too long for a rank, or
    with ``spread_above`` those longer than that share of a shard);
    ``_rebalance`` then trades contiguous pieces between the busiest and the least loaded rank until
    their areas agree.  Each rank's tokens stay in sequence order."""
    if mask.documents is None or len(mask.documents) < 2:
        raise ValueError(f"whole_documents needs a mask of several documents; {mask.name!r} has "
                         f"{'none' if mask.documents is None else 'one'}")
    prefix = row_area_prefix(mask)
    per_rank = _place_documents(mask, world, prefix, spread_above)
    _rebalance(per_rank, prefix)
    shards = tuple(spans_from_ranges(sorted(r)) for r in per_rank)
    return layouts.Layout("whole_documents", mask.seqlen_q, shards, max(shard_length(s) for s in shards))


def _merged(ranges) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _to_global(spans, a: int, b: int) -> list[tuple[int, int]]:
    """Local rows ``[a, b)`` of a shard laid out as ``spans`` → global ``(start, end)`` pieces."""
    out = []
    for s in spans:
        lo, hi = max(a, s.offset), min(b, s.offset + s.length)
        if lo < hi:
            out.append((s.start + lo - s.offset, s.start + hi - s.offset))
    return out


def needed_rows(mask: AttnMask, layout: layouts.Layout) -> list[list[list[tuple[int, int]]]]:
    """``needs[r][s]``: the rows of rank s's shard (local, as merged ranges) that rank r's queries
    attend; empty for s == r."""
    shards = layout.shards
    return [[[] if r == s else _merged((x.k_start, x.k_end) for x in restrict(mask, shards[r], shards[s]))
             for s in range(layout.world)] for r in range(layout.world)]


@register
class GroupCast(Strategy):
    name = "groupcast"
    description = ("fetch only the K/V rows a rank's queries attend (one all-to-all with per-rank sizes, "
                   "overlapping the rank's own block), documents placed whole by area; dK/dV sent back")

    # spread_above_pct: documents longer than this % of a shard are spread over ranks by zigzag
    # (0: none; documents too long for a rank are cut into contiguous pieces).
    options = {**Strategy.options, "spread_above_pct": 0}

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        by_documents = self.opts["layout"] == "auto" and mask.documents is not None and len(mask.documents) > 1
        pct = self.opts["spread_above_pct"]
        self.layout = (whole_documents(mask, self.world, pct / 100 if pct else None) if by_documents
                       else layouts.build(self.opts["layout"], mask, self.world))
        self.block = BlockAttention(self.opts["local_kernel"], device, heads_q, heads_kv, head_dim,
                                    calls=self.opts["local_calls"], comm_sm_margin=self.opts["comm_sm_margin"])
        shards = self.layout.shards
        needs = needed_rows(mask, self.layout)
        mine = shards[self.rank]
        self.send_splits = [sum(b - a for a, b in needs[r][self.rank]) for r in range(self.world)]
        self.recv_splits = [sum(b - a for a, b in needs[self.rank][s]) for s in range(self.world)]
        self.send_index = torch.tensor([i for r in range(self.world) for a, b in needs[r][self.rank]
                                        for i in range(a, b)], dtype=torch.long, device=device)
        # Every rank skips the transfer together, or none does (it is a collective).
        self.silent = not any(needs[r][s] for r in range(self.world) for s in range(self.world))
        fetched, offset = [], 0
        for s in range(self.world):
            for a, b in needs[self.rank][s]:
                for g0, g1 in _to_global(shards[s], a, b):
                    fetched.append(Span(g0, g1, offset))
                    offset += g1 - g0
        own_slices = merge_slices(restrict(mask, mine, mine))
        other_slices = merge_slices(restrict(mask, mine, tuple(fetched))) if fetched else ()
        self.own, self.others = self.block.pieces(own_slices), self.block.pieces(other_slices)
        self.rank_area = area(own_slices) + area(other_slices)
        remote = mask.seqlen_k - shard_length(mine)
        self.notes = {"layout": self.layout.name, "local_kernel": self.block.kernel, "local_calls": self.block.calls,
                      "fetched_fraction": round(offset / remote, 4) if remote else 0.0}

    def _all_to_all(self, x: torch.Tensor, out_rows: int, out_splits, in_splits):
        """``x`` ``(rows, ...)`` cut by ``in_splits`` to the ranks; returns ``(out, work)``."""
        out = x.new_empty((out_rows,) + tuple(x.shape[1:]))
        work = all_to_all_uneven(out, x, out_splits, in_splits, self.group)
        # Nothing is addressed to the rank itself.
        self.comm_bytes += sent_bytes("all_to_all", x.numel() * x.element_size(), self.world, own=0)
        return out, work

    def _start_fetch(self, k, v):
        if self.world == 1 or self.silent:
            return None
        rows = torch.cat([k.index_select(1, self.send_index), v.index_select(1, self.send_index)], dim=-1)
        rows = rows.transpose(0, 1).contiguous()
        return self._all_to_all(rows, sum(self.recv_splits), self.recv_splits, self.send_splits)

    @staticmethod
    def _split_kv(rows: torch.Tensor, d: int):
        """Received ``(n, b, h, 2d)`` → K, V ``(b, n, h, d)``."""
        rows = rows.transpose(0, 1)
        return rows[..., :d].contiguous(), rows[..., d:].contiguous()

    def _forward(self, q, k, v):
        pending = self._start_fetch(k, v)
        acc = self.block.new_accumulators(q)
        self.block.forward(q, k, v, self.own, acc, overlapped=pending is not None)
        if pending is not None:
            rows, work = pending
            work.wait()
            self.block.forward(q, *self._split_kv(rows, k.shape[-1]), self.others, acc)
        out, lse = self.block.finish(acc, q.dtype)
        # The fetched rows are fetched again in the backward rather than kept between passes.
        return out, (q, k, v, out, lse)

    def _backward(self, dout, saved):
        q, k, v, out, lse = saved
        lse_bwd = self.block.backward_lse(lse)
        pending = self._start_fetch(k, v)
        dq = self.block.new_dq(q)
        own = self.block.backward(dout, q, k, v, out, lse_bwd, self.own, dq, overlapped=pending is not None)
        dk, dv = own if own is not None else (torch.zeros(k.shape, dtype=torch.float32, device=k.device),) * 2
        if pending is not None:
            rows, work = pending
            work.wait()
            d = k.shape[-1]
            k_r, v_r = self._split_kv(rows, d)
            share = self.block.backward(dout, q, k_r, v_r, out, lse_bwd, self.others, dq)
            grads = (torch.cat(share, dim=-1).transpose(0, 1).contiguous() if share is not None
                     else rows.new_zeros(rows.shape, dtype=torch.float32))
            back, work = self._all_to_all(grads, len(self.send_index), self.send_splits, self.recv_splits)
            work.wait()
            back = back.transpose(0, 1)
            dk = dk.index_add(1, self.send_index, back[..., :d])
            dv = dv.index_add(1, self.send_index, back[..., d:])
        return self.block.dq_result(dq, q.dtype), dk.to(k.dtype), dv.to(v.dtype)
