"""``ulysses``: DeepSpeed-Ulysses; an all-to-all turns sequence shards into head shards, each rank
attends the whole sequence for its heads, and a second all-to-all turns them back.

Option ``head_chunks`` sends a rank's heads in chunks, each a whole group of query heads with the KV
heads they read (or a part of one KV head's group): every chunk's all-to-all is posted at once, the
chunk that has arrived is computed while the next one travels, and its output goes back while the
next one is computed.  The default is one chunk, the plain all-to-all, compute, all-to-all: side by
side on 4 × H200, chunks made the forward slower, not faster (lab/data/cp_ulysses_chunks_4xh200_2026-11-28).
"""

from __future__ import annotations

import torch

from . import a2a, register
from .base import Unsupported
from .comm import Comm
from .local import BlockAttention
from .sequence_parallel import SequenceParallel


def _send_heads(comm: Comm, x: torch.Tensor, chunks: int, c: int):
    """Chunk ``c`` of every rank's heads of the sequence shard ``x`` ``(b, s, h, d)``, posted to the
    ranks that attend them: ``(got, works)``, ``got`` ``(W, b, s, h / (W · chunks), d)``."""
    b, s, h, d = x.shape
    u = comm.size
    parts = x.view(b, s, u, chunks, h // (u * chunks), d)[:, :, :, c].permute(2, 0, 1, 3, 4)
    return comm.start_all_to_all(parts)


def _as_head_shard(got: torch.Tensor) -> torch.Tensor:
    """A chunk that arrived, ``(W, b, s, hc, d)`` from ``_send_heads``, as ``(b, W · s, hc, d)``."""
    u, b, s, hc, d = got.shape
    return got.permute(1, 0, 2, 3, 4).reshape(b, u * s, hc, d)


def _send_tokens(comm: Comm, x: torch.Tensor):
    """A head-shard chunk ``(b, W · s, hc, d)`` posted back to the ranks whose tokens it holds:
    ``(got, works)``, ``got`` ``(W, b, s, hc, d)``: rank j's chunk of heads for this rank's tokens."""
    b, total, hc, d = x.shape
    u = comm.size
    return comm.start_all_to_all(x.reshape(b, u, total // u, hc, d).permute(1, 0, 2, 3, 4))


def _place(into: torch.Tensor, got: torch.Tensor, chunks: int, c: int) -> None:
    """Write a chunk that came back (``_send_tokens``) into its heads of ``into`` ``(b, s, h, d)``."""
    b, s, h, d = into.shape
    u = got.shape[0]
    into.view(b, s, u, chunks, h // (u * chunks), d)[:, :, :, c] = got.permute(1, 2, 0, 3, 4)


def head_chunks(option, heads_local: int, kv_local: int, u: int) -> tuple[int, int]:
    """How many chunks a rank's query heads and its KV heads go in, ``(chunks, kv_chunks)``, for a
    rank that attends ``heads_local`` query and ``kv_local`` KV heads among ``u`` Ulysses ranks:
    ``option`` chunks (0: one per KV head, when there is an all-to-all to hide), each a whole group of
    query heads with the KV heads they read; more chunks than KV heads split a KV head's query heads,
    and that KV head travels once, with the first of them."""
    chunks = (kv_local if u > 1 else 1) if option == 0 and not isinstance(option, bool) else option
    ok = isinstance(chunks, int) and not isinstance(chunks, bool) and chunks >= 1 and heads_local % chunks == 0
    if not ok or (kv_local % chunks and chunks % kv_local):
        raise Unsupported(f"head_chunks {option!r}: a rank attends {heads_local} query heads reading {kv_local} KV "
                          "heads; a chunk holds whole query heads and whole KV heads or whole groups of their "
                          "query heads (0: one chunk per KV head)")
    return chunks, min(chunks, kv_local)


@register
class Ulysses(SequenceParallel):
    name = "ulysses"
    description = ("all-to-all from sequence- to head-sharded and back (KV heads replicated if too few; "
                   "head_chunks: in chunks whose transfers overlap the attention)")
    # Every rank sees every token after the all-to-all, so no load balancing is needed.
    # head_chunks: 1 is the plain all-to-all; 0 one chunk per KV head a rank attends.
    options = {**SequenceParallel.options, "layout": "contiguous", "head_chunks": 1}

    def degrees(self, heads_q, heads_kv):
        return self.world, 1

    def refuses(self, heads_q: int, heads_kv: int) -> str | None:
        if (why := super().refuses(heads_q, heads_kv)):
            return why
        u = self.world
        try:
            head_chunks(self.opts["head_chunks"], heads_q // u, heads_kv * a2a.kv_replication(heads_q, heads_kv, u) // u, u)
        except Unsupported as exc:
            return str(exc)
        return None

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        super().plan(mask, heads_q, heads_kv, head_dim, device, dtype)
        kv_local = heads_kv * self.rep // self.u
        self.chunks, self.kv_chunks = head_chunks(self.opts["head_chunks"], heads_q // self.u, kv_local, self.u)
        self.heads_kv_sent = heads_kv * self.rep
        self.notes["head_chunks"] = self.chunks
        # A chunk's query heads per KV head differ from the rank's when a KV head's group is split;
        # the block's pieces do not depend on heads, so they are shared.
        self.chunk_block = BlockAttention(self.opts["local_kernel"], device, heads_q // self.u // self.chunks,
                                          kv_local // self.kv_chunks, head_dim, calls=self.opts["local_calls"],
                                          comm_sm_margin=self.opts["comm_sm_margin"])

    def _forward(self, q, k, v):
        if self.chunks == 1:
            return super()._forward(q, k, v)
        comm, n, nkv, block = self.ulysses, self.chunks, self.kv_chunks, self.chunk_block
        per_kv = n // nkv  # query chunks per KV chunk
        k, v = a2a.expand_kv(k, self.rep), a2a.expand_kv(v, self.rep)
        kv_arriving, q_arriving = [], []
        for c in range(n):  # posted in the order they are used
            if c % per_kv == 0:
                kv_arriving.append([_send_heads(comm, x, nkv, c // per_kv) for x in (k, v)])
            q_arriving.append(_send_heads(comm, q, n, c))
        out = torch.empty_like(q)
        leaving, kv_saved, q_saved = [], [], []
        for c in range(n):
            if c % per_kv == 0:
                for _, works in kv_arriving[c // per_kv]:
                    comm.wait(works)
                kh, vh = (_as_head_shard(got) for got, _ in kv_arriving[c // per_kv])
                kv_saved += [kh, vh]
            got, works = q_arriving[c]
            comm.wait(works)
            qh = _as_head_shard(got)
            acc = block.new_accumulators(qh)
            block.forward(qh, kh, vh, self.pieces[0], acc, overlapped=True)
            out_c, lse_c = block.finish(acc, q.dtype)
            leaving.append(_send_tokens(comm, out_c))
            q_saved += [qh, out_c, lse_c]
        for c, (got, works) in enumerate(leaving):
            comm.wait(works)
            _place(out, got, n, c)
        return out, tuple(kv_saved + q_saved)  # flat: autograd saves tensors

    def _backward(self, dout, saved):
        if self.chunks == 1:
            return super()._backward(dout, saved)
        comm, n, nkv, block = self.ulysses, self.chunks, self.kv_chunks, self.chunk_block
        per_kv = n // nkv
        kv_saved, q_saved = saved[:2 * nkv], saved[2 * nkv:]
        arriving = [_send_heads(comm, dout, n, c) for c in range(n)]
        dq_leaving, kv_leaving = [], []
        for c in range(n):
            kh, vh = kv_saved[2 * (c // per_kv):2 * (c // per_kv) + 2]
            qh, out_c, lse_c = q_saved[3 * c:3 * c + 3]
            got, works = arriving[c]
            comm.wait(works)
            dq_acc = block.new_dq(qh)
            share = block.backward(_as_head_shard(got), qh, kh, vh, out_c, block.backward_lse(lse_c),
                                   self.pieces[0], dq_acc, overlapped=True)
            if share is None:
                z = torch.zeros(kh.shape, dtype=torch.float32, device=kh.device)
                share = (z, torch.zeros_like(z))
            dq_leaving.append(_send_tokens(comm, block.dq_result(dq_acc, qh.dtype)))
            # A KV chunk's gradient is the sum over its query chunks; it leaves after the last one.
            dkv = share if c % per_kv == 0 else tuple(a + b for a, b in zip(dkv, share))
            if c % per_kv == per_kv - 1:
                kv_leaving.append([_send_tokens(comm, g.to(kh.dtype)) for g in dkv])
        b, s, hq, d = dout.shape
        dq = torch.empty_like(dout)
        dk, dv = (dout.new_empty((b, s, self.heads_kv_sent, d)) for _ in range(2))
        for c, (got, works) in enumerate(dq_leaving):
            comm.wait(works)
            _place(dq, got, n, c)
        for j, sent in enumerate(kv_leaving):
            for into, (got, works) in zip((dk, dv), sent):
                comm.wait(works)
                _place(into, got, nkv, j)
        return dq, a2a.fold_kv(dk, self.rep), a2a.fold_kv(dv, self.rep)
