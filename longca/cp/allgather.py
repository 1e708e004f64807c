"""``allgather``: Llama-3's context parallelism.  K and V (few heads under GQA, so cheap) are
all-gathered; each rank attends its own queries to only the keys its mask needs (empty blocks are
skipped, not masked); the backward re-gathers K/V and reduce-scatters dK/dV to their owners."""

from __future__ import annotations

import torch

from . import layout as layouts
from . import register
from .base import Strategy
from .blocks import area, restrict
from .comm import Comm
from .local import BlockAttention


def _gathered(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Every rank's shard of ``x`` (b, s, h, d), end to end: (b, W·s, h, d)."""
    parts = comm.all_gather(x)                     # (W, b, s, h, d)
    return parts.transpose(0, 1).reshape(x.shape[0], -1, *x.shape[2:])


@register
class AllGather(Strategy):
    name = "allgather"
    description = "all-gather K/V, local queries against the keys they need, reduce-scatter dK/dV"

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        self.layout = layouts.build(self.opts["layout"], mask, self.world)
        self.comm = Comm(self.group, self)
        self.block = BlockAttention(self.opts["local_kernel"], device, heads_q, heads_kv, head_dim,
                                    calls=self.opts["local_calls"])
        slices = restrict(mask, self.layout.shards[self.rank], self.layout.concatenated(range(self.world)))
        self.pieces = self.block.pieces(slices)
        self.rank_area = area(slices)
        self.notes = {"layout": self.layout.name, "local_kernel": self.block.kernel, "local_calls": self.block.calls}

    def _forward(self, q, k, v):
        k_all, v_all = _gathered(self.comm, k), _gathered(self.comm, v)
        acc = self.block.new_accumulators(q)
        self.block.forward(q, k_all, v_all, self.pieces, acc)
        out, lse = self.block.finish(acc, q.dtype)
        # K/V are gathered again in the backward rather than kept: W× less memory between passes.
        return out, (q, k, v, out, lse)

    def _backward(self, dout, saved):
        q, k, v, out, lse = saved
        k_all, v_all = _gathered(self.comm, k), _gathered(self.comm, v)
        dq = self.block.new_dq(q)
        share = self.block.backward(dout, q, k_all, v_all, out, self.block.backward_lse(lse), self.pieces, dq)
        if share is None:
            z = torch.zeros(k_all.shape, dtype=torch.float32, device=k.device)
            share = (z, torch.zeros_like(z))
        b, n = k.shape[0], k.shape[1]

        def scatter(g):  # (b, W·n, h, d) float32 → this rank's (b, n, h, d), summed over ranks
            parts = g.reshape(b, self.world, n, *g.shape[2:]).transpose(0, 1)
            return self.comm.reduce_scatter(parts).to(k.dtype)

        return self.block.dq_result(dq, q.dtype), scatter(share[0]), scatter(share[1])
