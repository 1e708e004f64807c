"""Ulysses × (double) ring on a 2-D rank grid: the engine behind ``ring``, ``ulysses``, ``usp`` and
``double_ring``, which differ only in their degrees.

Global rank ``g = ring_index · U + u``: Ulysses groups are ``U`` consecutive ranks (the fast,
intra-node all-to-all), ring groups the ranks with the same ``u``.  A ring group of ``R`` members is
cut into windows of ``window`` consecutive members: ``window == R`` is a plain ring, a smaller window
the double ring.  After the all-to-all, ring member ``i`` holds the tokens of layout shards
``i·U … i·U+U-1`` (for ``h/U`` heads); the blocks it computes against member ``j`` are the mask
restricted to those two token sets.
"""

from __future__ import annotations

import functools

import torch

from ..attention.masks import AttnMask
from . import a2a
from . import layout as layouts
from .base import Strategy, Unsupported
from .blocks import Span, area, restrict, share
from .comm import Comm, grid_groups, new_subgroup
from .local import BlockAttention
from .ring_engine import double_ring_backward, double_ring_forward, ring_backward, ring_forward


@functools.lru_cache(maxsize=None)
def _groups(world: int, rank: int, u: int, window: int):
    """(ulysses, ring, inner, outer) process groups of ``rank``; every rank creates all of them, in
    the same order (cached: a process group is made once per layout, not once per plan)."""
    ulysses_groups, ring_groups = grid_groups(world, u)
    ring_size = world // u
    inner_groups, outer_groups = [], []
    for ring in ring_groups:
        ins, outs = grid_groups(ring_size, window)
        inner_groups += [[ring[i] for i in g] for g in ins]
        outer_groups += [[ring[i] for i in g] for g in outs]
    return (new_subgroup(ulysses_groups, rank), new_subgroup(ring_groups, rank),
            new_subgroup(inner_groups, rank), new_subgroup(outer_groups, rank))


class SequenceParallel(Strategy):
    def degrees(self, heads_q: int, heads_kv: int) -> tuple[int, int]:
        """(Ulysses degree U, inner ring window); the ring degree is world / U."""
        raise NotImplementedError

    def refuses(self, heads_q: int, heads_kv: int) -> str | None:
        u, window = self.degrees(heads_q, heads_kv)
        if u < 1 or self.world % u:
            return f"Ulysses degree {u} does not divide the {self.world} ranks"
        if window < 1 or (self.world // u) % window:
            return f"ring window {window} does not divide the ring of {self.world // u} ranks (Ulysses degree {u})"
        try:
            a2a.kv_replication(heads_q, heads_kv, u)
        except Unsupported as exc:
            return str(exc)
        return None

    def plan(self, mask: AttnMask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        import torch.distributed as dist

        if (why := self.refuses(heads_q, heads_kv)):
            raise Unsupported(why)
        u, window = self.degrees(heads_q, heads_kv)
        self.rep = a2a.kv_replication(heads_q, heads_kv, u)
        ring_size = self.world // u
        # Without a ring every rank attends the whole sequence (for its heads), so no layout
        # balances anything; the contiguous one keeps each document in one piece after the
        # all-to-all, where a balanced one would cut it into 2·world chunks (more, smaller ranges).
        name = "contiguous" if self.opts["layout"] == "auto" and ring_size == 1 else self.opts["layout"]
        self.layout = layouts.build(name, mask, self.world)
        g_rank = dist.get_rank(self.group)
        ug, rg, ig, og = _groups(self.world, g_rank, u, window)
        self.ulysses, self.ring = Comm(ug, self), Comm(rg, self)
        self.inner, self.outer = Comm(ig, self), Comm(og, self)
        heads_kv_local = heads_kv * self.rep // u
        self.block = BlockAttention(self.opts["local_kernel"], device, heads_q // u, heads_kv_local, head_dim,
                                    calls=self.opts["local_calls"], comm_sm_margin=self.opts["comm_sm_margin"])

        def member_spans(i: int) -> tuple[Span, ...]:  # ring member i = Ulysses group i
            return self.layout.concatenated(range(i * u, (i + 1) * u))

        me = self.ring.rank
        blocks = [restrict(mask, member_spans(me), member_spans(j)) for j in range(ring_size)]
        self.pieces = [self.block.pieces(b) for b in blocks]
        # This rank computes 1/U of the heads of its Ulysses group's blocks: the group's area split
        # in U integer shares (the first ``remainder`` ranks one pair more), so the ranks' areas sum
        # to the mask's exactly.
        self.rank_area = share(sum(area(b) for b in blocks), u, self.ulysses.rank)
        self.u, self.window, self.ring_size = u, window, ring_size
        self.notes = {"ulysses_degree": u, "ring_degree": ring_size, "ring_window": window,
                      "kv_replication": self.rep, "layout": self.layout.name,
                      "local_kernel": self.block.kernel, "local_calls": self.block.calls}

    def _attend_forward(self, q, k, v, acc):
        if self.ring_size == 1:
            self.block.forward(q, k, v, self.pieces[0], acc)
        elif self.window == self.ring_size:
            me = self.ring.rank
            ring_forward(self.block, self.ring, q, k, v, self.pieces, acc, lambda s: (me - s) % self.ring_size)
        else:
            double_ring_forward(self.block, self.inner, self.outer, q, k, v, self.pieces, acc)

    def _attend_backward(self, dout, q, k, v, out, lse_bwd, dq_acc):
        if self.ring_size == 1:
            share = self.block.backward(dout, q, k, v, out, lse_bwd, self.pieces[0], dq_acc)
            if share is None:
                z = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
                share = (z, torch.zeros_like(z))
            return share
        if self.window == self.ring_size:
            me = self.ring.rank
            return ring_backward(self.block, self.ring, dout, q, k, v, out, lse_bwd, self.pieces, dq_acc,
                                 lambda s: (me - s) % self.ring_size)
        return double_ring_backward(self.block, self.inner, self.outer, dout, q, k, v, out, lse_bwd,
                                    self.pieces, dq_acc)

    def _forward(self, q, k, v):
        qh = a2a.seq_to_head(self.ulysses, q)
        kh = a2a.seq_to_head(self.ulysses, a2a.expand_kv(k, self.rep))
        vh = a2a.seq_to_head(self.ulysses, a2a.expand_kv(v, self.rep))
        acc = self.block.new_accumulators(qh)
        self._attend_forward(qh, kh, vh, acc)
        out, lse = self.block.finish(acc, q.dtype)
        return a2a.head_to_seq(self.ulysses, out), (qh, kh, vh, out, lse)

    def _backward(self, dout, saved):
        qh, kh, vh, out, lse = saved
        douth = a2a.seq_to_head(self.ulysses, dout)
        dq_acc = self.block.new_dq(qh)
        dk, dv = self._attend_backward(douth, qh, kh, vh, out, self.block.backward_lse(lse), dq_acc)
        dq = a2a.head_to_seq(self.ulysses, self.block.dq_result(dq_acc, qh.dtype))
        dk = a2a.fold_kv(a2a.head_to_seq(self.ulysses, dk.to(kh.dtype)), self.rep)
        dv = a2a.fold_kv(a2a.head_to_seq(self.ulysses, dv.to(vh.dtype)), self.rep)
        return dq, dk, dv


def divisor_at_most(n: int, limit: float) -> int:
    """The largest divisor of ``n`` not above ``limit``."""
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= limit)
