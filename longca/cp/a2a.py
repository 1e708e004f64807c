"""Ulysses all-to-all: sequence-sharded ``(b, s, h, d)`` ↔ head-sharded ``(b, U·s, h/U, d)``.

After ``seq_to_head`` a rank holds every rank's tokens (in rank order, i.e. the layout's order) for
``h/U`` of the heads; ``head_to_seq`` is its inverse.  With fewer KV heads than ranks the KV heads
are replicated first (``expand_kv``) so every rank gets the one its query heads read; the gradient
of the replicas is summed back (``fold_kv``).
"""

from __future__ import annotations

import torch

from .base import Unsupported
from .comm import Comm


def seq_to_head(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    u = comm.size
    if u == 1:
        return x
    b, s, h, d = x.shape
    parts = x.reshape(b, s, u, h // u, d).permute(2, 0, 1, 3, 4)   # part j: heads of rank j
    got = comm.all_to_all(parts)                                     # got[j]: rank j's tokens
    return got.permute(1, 0, 2, 3, 4).reshape(b, u * s, h // u, d)


def head_to_seq(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    u = comm.size
    if u == 1:
        return x
    b, total, hh, d = x.shape
    s = total // u
    parts = x.reshape(b, u, s, hh, d).permute(1, 0, 2, 3, 4)        # part j: rank j's tokens
    got = comm.all_to_all(parts)                                     # got[j]: heads of rank j
    return got.permute(1, 2, 0, 3, 4).reshape(b, s, u * hh, d)


def kv_replication(heads_q: int, heads_kv: int, u: int) -> int:
    """How many times each KV head is replicated so ``u`` ranks each get whole KV heads."""
    if heads_q % u:
        raise Unsupported(f"Ulysses degree {u} does not divide the {heads_q} query heads")
    if heads_kv % u == 0:
        return 1
    if u % heads_kv == 0:
        return u // heads_kv
    raise Unsupported(f"Ulysses degree {u} and {heads_kv} KV heads: neither divides the other")


def expand_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    return x.repeat_interleave(rep, dim=2) if rep > 1 else x


def fold_kv(grad: torch.Tensor, rep: int) -> torch.Tensor:
    if rep == 1:
        return grad
    b, s, h, d = grad.shape
    return grad.reshape(b, s, h // rep, rep, d).sum(3)
