"""``allgather``: Llama-3's context parallelism.  K and V (few heads under GQA, so cheap) are
all-gathered; each rank attends its own queries to only the keys its mask needs (empty blocks are
skipped, not masked); the backward re-gathers K/V and reduce-scatters dK/dV to their owners.

The gather overlaps the rank's own block: its queries against the K/V it already holds are computed
while the other shards arrive, then the rest in one more call."""

from __future__ import annotations

import torch

from . import layout as layouts
from . import register
from .base import Strategy
from .blocks import area, restrict
from .comm import Comm
from .local import BlockAttention


def _end_to_end(parts: torch.Tensor) -> torch.Tensor:
    """Gathered shards ``(W, b, s, h, d)`` laid end to end: ``(b, W·s, h, d)``."""
    return parts.transpose(0, 1).reshape(parts.shape[1], -1, *parts.shape[3:])


@register
class AllGather(Strategy):
    name = "allgather"
    description = "all-gather K/V (overlapping the rank's own block), local queries against the keys they need, reduce-scatter dK/dV"

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        self.layout = layouts.build(self.opts["layout"], mask, self.world)
        self.comm = Comm(self.group, self)
        self.block = BlockAttention(self.opts["local_kernel"], device, heads_q, heads_kv, head_dim,
                                    calls=self.opts["local_calls"], comm_sm_margin=self.opts["comm_sm_margin"])
        mine = self.layout.shards[self.rank]
        gathered = self.layout.concatenated(range(self.world))
        # The own shard's spans in gathered coordinates start at rank · shard_len.
        first = self.rank * self.layout.shard_len
        others = tuple(s for s in gathered if not first <= s.offset < first + self.layout.shard_len)
        own_slices, other_slices = restrict(mask, mine, mine), restrict(mask, mine, others)
        self.own, self.others = self.block.pieces(own_slices), self.block.pieces(other_slices)
        self.rank_area = area(own_slices) + area(other_slices)
        self.notes = {"layout": self.layout.name, "local_kernel": self.block.kernel, "local_calls": self.block.calls}

    def _start_gather(self, k, v):
        if self.world == 1:
            return None
        (k_parts, kw), (v_parts, vw) = self.comm.start_all_gather(k), self.comm.start_all_gather(v)
        return k_parts, v_parts, kw + vw

    def _forward(self, q, k, v):
        pending = self._start_gather(k, v)
        acc = self.block.new_accumulators(q)
        self.block.forward(q, k, v, self.own, acc, overlapped=pending is not None)
        if pending is not None:
            k_parts, v_parts, works = pending
            self.comm.wait(works)
            self.block.forward(q, _end_to_end(k_parts), _end_to_end(v_parts), self.others, acc)
        out, lse = self.block.finish(acc, q.dtype)
        # K/V are gathered again in the backward rather than kept: W× less memory between passes.
        return out, (q, k, v, out, lse)

    def _backward(self, dout, saved):
        q, k, v, out, lse = saved
        lse_bwd = self.block.backward_lse(lse)
        pending = self._start_gather(k, v)
        dq = self.block.new_dq(q)
        own = self.block.backward(dout, q, k, v, out, lse_bwd, self.own, dq, overlapped=pending is not None)
        b, n = k.shape[0], k.shape[1]
        if pending is None:
            dk, dv = own if own is not None else (torch.zeros_like(k, dtype=torch.float32),) * 2
            return self.block.dq_result(dq, q.dtype), dk.to(k.dtype), dv.to(v.dtype)
        k_parts, v_parts, works = pending
        self.comm.wait(works)
        k_all, v_all = _end_to_end(k_parts), _end_to_end(v_parts)
        share = self.block.backward(dout, q, k_all, v_all, out, lse_bwd, self.others, dq)
        if share is None:
            z = torch.zeros(k_all.shape, dtype=torch.float32, device=k.device)
            share = (z, torch.zeros_like(z))
        if own is not None:  # the own block's gradient goes to this rank's slot before the scatter
            mine = slice(self.rank * n, (self.rank + 1) * n)
            share[0][:, mine] += own[0]
            share[1][:, mine] += own[1]

        def scatter(g):  # (b, W·n, h, d) float32 → this rank's (b, n, h, d), summed over ranks
            parts = g.reshape(b, self.world, n, *g.shape[2:]).transpose(0, 1)
            return self.comm.reduce_scatter(parts).to(k.dtype)

        return self.block.dq_result(dq, q.dtype), scatter(share[0]), scatter(share[1])
