"""``ulysses``: DeepSpeed-Ulysses; an all-to-all turns sequence shards into head shards, each rank
attends the whole sequence for its heads, and a second all-to-all turns them back.

The heads a rank attends go through in ``head_chunks`` chunks, each a whole group of query heads
with the KV heads they read: every chunk's all-to-all is posted at once, the chunk that has arrived
is computed while the next one travels, and its output goes back while the next one is computed.
So the transfers hide behind the attention instead of adding to it (one chunk: the plain
all-to-all, compute, all-to-all).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import a2a, register
from .base import Unsupported
from .comm import Comm
from .sequence_parallel import SequenceParallel


def _start_all_to_all(comm: Comm, parts: torch.Tensor):
    """``parts`` is ``(W, ...)``, part j for rank j: the all-to-all posted, ``(out, work)``; ``out``
    holds part j from rank j once the work is waited for."""
    parts = parts.contiguous()
    out = torch.empty_like(parts)
    work = dist.all_to_all_single(out, parts, group=comm.group, async_op=True)
    comm._count((comm.size - 1) * parts[0].numel() * parts.element_size())
    return out, work


def _send_heads(comm: Comm, x: torch.Tensor, chunks: int, c: int):
    """Chunk ``c`` of every rank's heads of the sequence shard ``x`` ``(b, s, h, d)``, posted to the
    ranks that attend them: ``(got, work)``, ``got`` ``(W, b, s, h / (W · chunks), d)``."""
    b, s, h, d = x.shape
    u = comm.size
    parts = x.view(b, s, u, chunks, h // (u * chunks), d)[:, :, :, c].permute(2, 0, 1, 3, 4)
    return _start_all_to_all(comm, parts)


def _as_head_shard(got: torch.Tensor) -> torch.Tensor:
    """A chunk that arrived, ``(W, b, s, hc, d)`` from ``_send_heads``, as ``(b, W · s, hc, d)``."""
    u, b, s, hc, d = got.shape
    return got.permute(1, 0, 2, 3, 4).reshape(b, u * s, hc, d)


def _send_tokens(comm: Comm, x: torch.Tensor):
    """A head-shard chunk ``(b, W · s, hc, d)`` posted back to the ranks whose tokens it holds:
    ``(got, work)``, ``got`` ``(W, b, s, hc, d)``: rank j's chunk of heads for this rank's tokens."""
    b, total, hc, d = x.shape
    u = comm.size
    return _start_all_to_all(comm, x.reshape(b, u, total // u, hc, d).permute(1, 0, 2, 3, 4))


def _place(into: torch.Tensor, got: torch.Tensor, chunks: int, c: int) -> None:
    """Write a chunk that came back (``_send_tokens``) into its heads of ``into`` ``(b, s, h, d)``."""
    b, s, h, d = into.shape
    u = got.shape[0]
    into.view(b, s, u, chunks, h // (u * chunks), d)[:, :, :, c] = got.permute(1, 2, 0, 3, 4)


def head_chunks(option, kv_local: int, u: int) -> int:
    """How many chunks a rank's heads go in: ``option`` (a count, or 0: one per KV head the rank
    attends, when there is an all-to-all to hide) for a rank that attends ``kv_local`` KV heads
    among ``u`` Ulysses ranks."""
    chunks = (kv_local if u > 1 else 1) if option == 0 and not isinstance(option, bool) else option
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1 or kv_local % chunks:
        raise Unsupported(f"head_chunks {option!r}: a rank attends {kv_local} KV heads, and each chunk needs "
                          "whole KV heads (a divisor of them, or auto)")
    return chunks


@register
class Ulysses(SequenceParallel):
    name = "ulysses"
    description = ("all-to-all from sequence- to head-sharded and back (KV heads replicated if too few), "
                   "in head chunks whose transfers overlap the attention")
    # Every rank sees every token after the all-to-all, so no load balancing is needed.
    # head_chunks: 0 is one chunk per KV head a rank attends.
    options = {**SequenceParallel.options, "layout": "contiguous", "head_chunks": 0}

    def degrees(self, heads_q, heads_kv):
        return self.world, 1

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        super().plan(mask, heads_q, heads_kv, head_dim, device, dtype)
        self.chunks = head_chunks(self.opts["head_chunks"], heads_kv * self.rep // self.u, self.u)
        self.heads_kv_sent = heads_kv * self.rep
        self.notes["head_chunks"] = self.chunks

    def _forward(self, q, k, v):
        if self.chunks == 1:
            return super()._forward(q, k, v)
        comm, n = self.ulysses, self.chunks
        k, v = a2a.expand_kv(k, self.rep), a2a.expand_kv(v, self.rep)
        arriving = [[_send_heads(comm, x, n, c) for x in (q, k, v)] for c in range(n)]
        out = torch.empty_like(q)
        leaving, saved = [], []
        for c in range(n):
            for _, work in arriving[c]:
                work.wait()
            qh, kh, vh = (_as_head_shard(got) for got, _ in arriving[c])
            acc = self.block.new_accumulators(qh)
            self.block.forward(qh, kh, vh, self.pieces[0], acc, overlapped=True)
            out_c, lse_c = self.block.finish(acc, q.dtype)
            leaving.append(_send_tokens(comm, out_c))
            saved += [qh, kh, vh, out_c, lse_c]
        for c, (got, work) in enumerate(leaving):
            work.wait()
            _place(out, got, n, c)
        return out, tuple(saved)  # five tensors per chunk, flat: autograd saves tensors

    def _backward(self, dout, saved):
        if self.chunks == 1:
            return super()._backward(dout, saved)
        comm, n = self.ulysses, self.chunks
        arriving = [_send_heads(comm, dout, n, c) for c in range(n)]
        leaving = []
        for c in range(n):
            qh, kh, vh, out_c, lse_c = saved[5 * c:5 * c + 5]
            got, work = arriving[c]
            work.wait()
            dq_acc = self.block.new_dq(qh)
            dk, dv = self._attend_backward(_as_head_shard(got), qh, kh, vh, out_c, self.block.backward_lse(lse_c),
                                           dq_acc)
            leaving.append([_send_tokens(comm, g) for g in
                            (self.block.dq_result(dq_acc, qh.dtype), dk.to(kh.dtype), dv.to(vh.dtype))])
        b, s, hq, d = dout.shape
        dq = torch.empty_like(dout)
        dk, dv = (dout.new_empty((b, s, self.heads_kv_sent, d)) for _ in range(2))
        for c, sent in enumerate(leaving):
            for into, (got, work) in zip((dq, dk, dv), sent):
                work.wait()
                _place(into, got, n, c)
        return dq, a2a.fold_kv(dk, self.rep), a2a.fold_kv(dv, self.rep)
