"""``allgather``: Llama-3's context parallelism.  K and V (few heads under GQA, so cheap) are
all-gathered; each rank attends its own queries to only the keys its mask needs (empty blocks are
skipped, not masked); the backward re-gathers K/V and reduce-scatters dK/dV to their owners.

The gather overlaps the rank's own block: its queries against the K/V it already holds are computed
while the other shards arrive, then the rest in one more call.  The gathered K/V are put back in
the sequence's own order first: under a balanced layout (zigzag chunks of every document) the
shards interleave, and in gathered order a query chunk would meet its document's keys as one range
per shard, many small ranges where in sequence order it meets one or two long ones."""

from __future__ import annotations

import torch

from . import layout as layouts
from . import register
from .base import Strategy
from .blocks import Span, area, restrict
from .comm import Comm
from .local import BlockAttention


def _end_to_end(parts: torch.Tensor) -> torch.Tensor:
    """Gathered shards ``(W, b, s, h, d)`` laid end to end: ``(b, W·s, h, d)``."""
    return parts.transpose(0, 1).reshape(parts.shape[1], -1, *parts.shape[3:])


def _complement(spans, seqlen: int) -> tuple[Span, ...]:
    """The global tokens ``spans`` do not hold, as spans stored at their own index (sequence order)."""
    out, pos = [], 0
    for s in sorted(spans, key=lambda s: s.start):
        if s.start > pos:
            out.append(Span(pos, s.start, pos))
        pos = max(pos, s.end)
    if pos < seqlen:
        out.append(Span(pos, seqlen, pos))
    return tuple(out)


@register
class AllGather(Strategy):
    name = "allgather"
    description = ("all-gather K/V (overlapping the rank's own block), local queries against the keys "
                   "they need in sequence order, reduce-scatter dK/dV")

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        self.layout = layouts.build(self.opts["layout"], mask, self.world)
        self.comm = Comm(self.group, self)
        self.block = BlockAttention(self.opts["local_kernel"], device, heads_q, heads_kv, head_dim,
                                    calls=self.opts["local_calls"], comm_sm_margin=self.opts["comm_sm_margin"])
        mine = self.layout.shards[self.rank]
        own_slices = restrict(mask, mine, mine)
        other_slices = restrict(mask, mine, _complement(mine, mask.seqlen_k))
        self.own, self.others = self.block.pieces(own_slices), self.block.pieces(other_slices)
        self.rank_area = area(own_slices) + area(other_slices)
        self.to_sequence = self.layout.gathered_index().to(device)
        self.notes = {"layout": self.layout.name, "local_kernel": self.block.kernel, "local_calls": self.block.calls}

    def _start_gather(self, k, v):
        if self.world == 1:
            return None
        (k_parts, kw), (v_parts, vw) = self.comm.start_all_gather(k), self.comm.start_all_gather(v)
        return k_parts, v_parts, kw + vw

    def _in_sequence(self, parts: torch.Tensor) -> torch.Tensor:
        """Gathered shards → ``(b, seqlen, h, d)`` in sequence order (padding rows dropped)."""
        return _end_to_end(parts).index_select(1, self.to_sequence)

    def _forward(self, q, k, v):
        pending = self._start_gather(k, v)
        acc = self.block.new_accumulators(q)
        self.block.forward(q, k, v, self.own, acc, overlapped=pending is not None)
        if pending is not None:
            k_parts, v_parts, works = pending
            self.comm.wait(works)
            self.block.forward(q, self._in_sequence(k_parts), self._in_sequence(v_parts), self.others, acc)
        out, lse = self.block.finish(acc, q.dtype)
        # K/V are gathered again in the backward rather than kept: W× less memory between passes.
        return out, (q, k, v, out, lse)

    def _backward(self, dout, saved):
        q, k, v, out, lse = saved
        lse_bwd = self.block.backward_lse(lse)
        pending = self._start_gather(k, v)
        dq = self.block.new_dq(q)
        own = self.block.backward(dout, q, k, v, out, lse_bwd, self.own, dq, overlapped=pending is not None)
        if pending is None:
            dk, dv = own if own is not None else (torch.zeros_like(k, dtype=torch.float32),) * 2
            return self.block.dq_result(dq, q.dtype), dk.to(k.dtype), dv.to(v.dtype)
        k_parts, v_parts, works = pending
        self.comm.wait(works)
        share = self.block.backward(dout, q, self._in_sequence(k_parts), self._in_sequence(v_parts), out, lse_bwd,
                                    self.others, dq)
        b, n = k.shape[0], k.shape[1]
        rows = (b, self.world * n) + tuple(k.shape[2:])

        def gathered_order(g):  # (b, seqlen, h, d) in sequence order → shards end to end, padding 0
            full = torch.zeros(rows, dtype=torch.float32, device=k.device)
            if g is not None:
                full.index_copy_(1, self.to_sequence, g)
            return full

        dk_all, dv_all = (gathered_order(share[i] if share is not None else None) for i in (0, 1))
        if own is not None:  # the own block's gradient goes to this rank's slot before the scatter
            mine = slice(self.rank * n, (self.rank + 1) * n)
            dk_all[:, mine] += own[0]
            dv_all[:, mine] += own[1]

        def scatter(g):  # (b, W·n, h, d) float32 → this rank's (b, n, h, d), summed over ranks
            parts = g.reshape(b, self.world, n, *g.shape[2:]).transpose(0, 1)
            return self.comm.reduce_scatter(parts).to(k.dtype)

        return self.block.dq_result(dq, q.dtype), scatter(dk_all), scatter(dv_all)
