"""Ring schedules: K/V rotate between ranks while each rank computes the block it holds.

``ring_forward`` / ``ring_backward`` run one ring over a ``Comm`` group; the double ring
(LoongTrain) nests an inner ring within windows of ranks inside an outer ring across windows, the
outer transfer posted before the inner ring starts so it overlaps the whole inner ring.

Overlap: at every step the next block's transfer is posted *before* the current block is computed.
Backward: K/V rotate again, and each block's dK/dV (float32) travel with it, so after a full turn
every rank holds the complete gradient of its own K/V; the gradient hop of step s is waited for at
step s+1, after that step's compute.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .comm import Comm
from .local import BlockAttention, Piece

SrcOf = Callable[[int], int]


def _next_prev(comm: Comm) -> tuple[int, int]:
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def ring_forward(block: BlockAttention, comm: Comm, q, k, v, pieces: Sequence[Sequence[Piece]], acc,
                 src_of: SrcOf, busy: bool = False) -> None:
    """Accumulate ``q`` against every K/V block of the ring into ``acc``; at step ``s`` this rank
    holds the block that ``src_of(s)`` (an index into ``pieces``) names.  ``busy``: another transfer
    is in flight throughout (the double ring's outer hop)."""
    nxt, prv = _next_prev(comm)
    cur_k, cur_v = k, v
    for step in range(comm.size):
        works = None
        if step < comm.size - 1:
            new_k, new_v = torch.empty_like(cur_k), torch.empty_like(cur_v)
            works = comm.exchange([cur_k, cur_v], nxt, [new_k, new_v], prv)
        block.forward(q, cur_k, cur_v, pieces[src_of(step)], acc, overlapped=busy or works is not None)
        if works is not None:
            comm.wait(works)
            cur_k, cur_v = new_k, new_v


def ring_backward(block: BlockAttention, comm: Comm, dout, q, k, v, out, lse_bwd,
                  pieces: Sequence[Sequence[Piece]], dq_acc, src_of: SrcOf, busy: bool = False):
    """dq of every block added into ``dq_acc``; returns the float32 (dk, dv) of this rank's own K/V,
    summed over every rank's queries of this ring."""
    nxt, prv = _next_prev(comm)
    cur_k, cur_v = k, v
    held = None          # (dk, dv) of the block currently held, accumulated so far
    grad_works = None    # the hop that brings the next block's (dk, dv)
    incoming = None
    for step in range(comm.size):
        kv_works = None
        if step < comm.size - 1:
            new_k, new_v = torch.empty_like(cur_k), torch.empty_like(cur_v)
            kv_works = comm.exchange([cur_k, cur_v], nxt, [new_k, new_v], prv)
        share = block.backward(dout, q, cur_k, cur_v, out, lse_bwd, pieces[src_of(step)], dq_acc,
                               overlapped=busy or kv_works is not None or grad_works is not None)
        if step == 0:
            held = share if share is not None else _zeros_kv(cur_k)
        else:
            comm.wait(grad_works)
            held = incoming if share is None else (incoming[0] + share[0], incoming[1] + share[1])
        if comm.size > 1:
            incoming = (torch.empty_like(held[0]), torch.empty_like(held[1]))
            grad_works = comm.exchange(list(held), nxt, list(incoming), prv)
        if kv_works is not None:
            comm.wait(kv_works)
            cur_k, cur_v = new_k, new_v
    if comm.size == 1:
        return held
    comm.wait(grad_works)  # the last hop brings our own block's gradient home
    return incoming


def _zeros_kv(k: torch.Tensor):
    z = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    return z, torch.zeros_like(z)


def double_ring_forward(block: BlockAttention, inner: Comm, outer: Comm, q, k, v,
                        pieces: Sequence[Sequence[Piece]], acc) -> None:
    """Ring member index = outer_rank · inner_size + inner_rank (windows of consecutive members)."""
    w, windows = inner.size, outer.size
    a, p = outer.rank, inner.rank
    held_k, held_v = k, v
    for o in range(windows):
        works = None
        if o < windows - 1:  # posted first: the outer hop overlaps the whole inner ring
            new_k, new_v = torch.empty_like(held_k), torch.empty_like(held_v)
            works = outer.exchange([held_k, held_v], (a + 1) % windows, [new_k, new_v], (a - 1) % windows)
        src_window = (a - o) % windows
        ring_forward(block, inner, q, held_k, held_v, pieces, acc,
                     lambda i, sw=src_window: sw * w + (p - i) % w, busy=works is not None)
        if works is not None:
            outer.wait(works)
            held_k, held_v = new_k, new_v


def double_ring_backward(block: BlockAttention, inner: Comm, outer: Comm, dout, q, k, v, out, lse_bwd,
                         pieces: Sequence[Sequence[Piece]], dq_acc):
    w, windows = inner.size, outer.size
    a, p = outer.rank, inner.rank
    held_k, held_v = k, v
    grad_works, incoming = None, None
    for o in range(windows):
        kv_works = None
        if o < windows - 1:
            new_k, new_v = torch.empty_like(held_k), torch.empty_like(held_v)
            kv_works = outer.exchange([held_k, held_v], (a + 1) % windows, [new_k, new_v], (a - 1) % windows)
        src_window = (a - o) % windows
        # This window's share of block (src_window, p)'s gradient, back at this rank after the inner turn.
        dk, dv = ring_backward(block, inner, dout, q, held_k, held_v, out, lse_bwd, pieces, dq_acc,
                               lambda i, sw=src_window: sw * w + (p - i) % w,
                               busy=kv_works is not None or grad_works is not None)
        if o > 0:  # earlier windows' shares of the same block arrived during the inner ring
            outer.wait(grad_works)
            dk, dv = dk + incoming[0], dv + incoming[1]
        if windows > 1:
            incoming = (torch.empty_like(dk), torch.empty_like(dv))
            grad_works = outer.exchange([dk, dv], (a + 1) % windows, list(incoming), (a - 1) % windows)
        if kv_works is not None:
            outer.wait(kv_works)
            held_k, held_v = new_k, new_v
    if windows == 1:
        return dk, dv
    outer.wait(grad_works)
    return incoming
