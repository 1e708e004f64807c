"""Collectives and point-to-point transfers on one process group, counting the bytes this rank sends.

The count is the payload this rank puts on the wire in the algorithm's logical pattern (a P2P send:
its size; all-gather / all-to-all / reduce-scatter: the (W-1)/W of the data that leaves the rank),
so strategies compare on what they move, independent of how NCCL or gloo schedules it.

``local_copies()`` is the one switch that replaces every collective here by a local copy of the same
bytes into the same output buffers (the exposed-communication measurement: a step timed with and
without its traffic, ``cp_exposed_comm``; docs/cp.md).  The result is numerically meaningless.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
import torch.distributed as dist

COLLECTIVES = ("send", "all_gather", "all_to_all", "reduce_scatter")


def sent_bytes(collective: str, nbytes, world: int, own=None):
    """The bytes one rank of ``world`` sends in ``collective`` on ``nbytes`` of its input, in the
    algorithm's logical pattern: a P2P ``send``, the message; an ``all_gather``, its input to each
    of the other ``world - 1`` ranks; an ``all_to_all`` or a ``reduce_scatter`` (input of ``world``
    parts), what of its input is addressed to other ranks: all but ``own`` (the bytes of its part
    for itself, for uneven parts), else ``(world - 1) / world`` of it (equal parts; integer bytes
    floored, a float as the CP model computes it)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if collective == "send":
        return nbytes
    if own is not None and collective != "all_gather":
        return nbytes - own
    if collective == "all_gather":
        return (world - 1) * nbytes
    if isinstance(nbytes, int):
        return nbytes * (world - 1) // world
    return (world - 1) / world * nbytes


# --- local-copy mode ------------------------------------------------------------------------------
# A module global, not thread-local: autograd runs a CUDA backward on a device thread of its own.
_LOCAL = False
# What may not be called while the mode is on: a strategy that calls torch.distributed itself would
# otherwise time its real traffic in the "without traffic" step (and the difference would read ~0).
_GUARDED = ("all_to_all_single", "all_to_all", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
            "reduce_scatter", "all_reduce", "broadcast", "batch_isend_irecv", "isend", "irecv", "send", "recv")


class LocalCopyViolation(RuntimeError):
    """A collective called outside ``Comm`` (and ``all_to_all_uneven``) while local copies are on."""


def local_copy_mode() -> bool:
    return _LOCAL


@contextlib.contextmanager
def local_copies():
    """Within: every collective of ``Comm`` and ``all_to_all_uneven`` copies the bytes it would move
    into its output buffers locally and sends nothing (its works are already done); a direct
    ``torch.distributed`` collective raises ``LocalCopyViolation``.  Byte counting is unchanged."""
    global _LOCAL
    saved = {name: getattr(dist, name) for name in _GUARDED if hasattr(dist, name)}

    def refuse(name):
        def call(*args, **kwargs):
            raise LocalCopyViolation(f"torch.distributed.{name} called outside longca.cp.comm in local-copy mode")
        return call

    was, _LOCAL = _LOCAL, True
    for name in saved:
        setattr(dist, name, refuse(name))
    try:
        yield
    finally:
        _LOCAL = was
        for name, fn in saved.items():
            setattr(dist, name, fn)


class _Done:
    """The work of a local copy: already complete (copies are ordered on the stream like the rest)."""

    def wait(self, *args, **kwargs) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _fill(dst: torch.Tensor, src: torch.Tensor | None) -> None:
    """``dst`` (contiguous) filled with ``src``'s bytes: a plain copy when the sizes agree; else the
    source's bytes repeated or cut to the destination's size (zeros where there is no source)."""
    if dst.numel() == 0:
        return
    if src is not None and src.shape == dst.shape and src.dtype == dst.dtype:
        dst.copy_(src)
        return
    out = dst.reshape(-1).view(torch.uint8)
    if src is None or src.numel() == 0:
        out.zero_()
        return
    data = _bytes(src)
    for start in range(0, out.numel(), data.numel()):
        n = min(data.numel(), out.numel() - start)
        out[start:start + n].copy_(data[:n])


def all_to_all_uneven(out: torch.Tensor, x: torch.Tensor, out_splits, in_splits, group):
    """``dist.all_to_all_single`` with per-rank row counts, posted (``async_op``); in local-copy mode
    ``out`` gets ``x``'s bytes (as many as ``out`` holds) and nothing is sent."""
    if _LOCAL:
        _fill(out, x)
        return _Done()
    return dist.all_to_all_single(out, x, out_splits, in_splits, group=group, async_op=True)


class Comm:
    def __init__(self, group: dist.ProcessGroup | None, owner=None):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.global_ranks = [dist.get_global_rank(group, r) if group is not None else r
                             for r in range(self.size)]
        self.owner = owner  # the strategy whose comm_bytes this adds to

    def _count(self, nbytes: int) -> None:
        if self.owner is not None:
            self.owner.comm_bytes += int(nbytes)

    # --- point to point ------------------------------------------------------------------------
    def exchange(self, sends: Sequence[torch.Tensor], to: int, recvs: Sequence[torch.Tensor], frm: int):
        """Post sends of ``sends`` to group rank ``to`` and receives into ``recvs`` from ``frm``;
        returns the works to wait on (the caller overlaps compute in between)."""
        self._count(sum(sent_bytes("send", t.numel() * t.element_size(), self.size) for t in sends))
        if _LOCAL:  # each receive buffer gets its send's bytes; the send does nothing
            for i, r in enumerate(recvs):
                _fill(r, sends[i % len(sends)] if sends else None)
            return [_Done()]
        ops = [dist.P2POp(dist.isend, t, self.global_ranks[to], self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.global_ranks[frm], self.group) for t in recvs]
        return dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works) -> None:
        for w in works or ():
            w.wait()

    # --- collectives ---------------------------------------------------------------------------
    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """``(W, *x.shape)``: every rank's ``x``."""
        out, works = self.start_all_gather(x)
        self.wait(works)
        return out

    def start_all_gather(self, x: torch.Tensor):
        """``all_gather`` posted, not waited for: ``(out, works)``; ``out`` is valid after ``wait(works)``."""
        x = x.contiguous()
        # Gathered along dim 0 (gloo checks the output as W copies of x stacked on dim 0).
        out = x.new_empty((self.size * x.shape[0],) + tuple(x.shape[1:]))
        self._count(sent_bytes("all_gather", x.numel() * x.element_size(), self.size))
        slots = out.view((self.size,) + tuple(x.shape))
        if _LOCAL:  # every slot a copy of this rank's x
            slots.copy_(x.unsqueeze(0).expand_as(slots))
            return slots, [_Done()]
        work = dist.all_gather_into_tensor(out, x, group=self.group, async_op=True)
        return slots, [work]

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` is ``(W, ...)``; returns the sum over ranks of ``x[this rank]``."""
        x = x.contiguous()
        out = x.new_empty(tuple(x.shape[1:]))
        self._count(sent_bytes("reduce_scatter", x.numel() * x.element_size(), self.size))
        if _LOCAL:  # this rank's own part, not summed: the reduction is the collective's work
            out.copy_(x[self.rank])
            return out
        dist.reduce_scatter_tensor(out, x.view((-1,) + tuple(x.shape[2:])), op=dist.ReduceOp.SUM,
                                   group=self.group)
        return out

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` is ``(W, ...)``: part j goes to rank j; returns ``(W, ...)`` with part j from rank j."""
        out, works = self.start_all_to_all(x)
        self.wait(works)
        return out

    def start_all_to_all(self, x: torch.Tensor):
        """``all_to_all`` posted, not waited for: ``(out, works)``; ``out`` is valid after ``wait(works)``."""
        x = x.contiguous()
        out = torch.empty_like(x)
        self._count(sent_bytes("all_to_all", x.numel() * x.element_size(), self.size))
        if _LOCAL:  # part j of the output: part j of the input
            out.copy_(x)
            return out, [_Done()]
        work = dist.all_to_all_single(out, x, group=self.group, async_op=True)
        return out, [work]


def grid_groups(world: int, inner: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rank lists of a 2-D layout: ``inner`` consecutive ranks per inner group, strided outer groups."""
    if world % inner:
        raise ValueError(f"inner degree {inner} does not divide {world} ranks")
    inner_groups = [list(range(i, i + inner)) for i in range(0, world, inner)]
    outer_groups = [list(range(j, world, inner)) for j in range(inner)]
    return inner_groups, outer_groups


def new_subgroup(groups: list[list[int]], rank: int) -> dist.ProcessGroup:
    """Create every group of the partition (all ranks must call this alike); return ``rank``'s."""
    mine = None
    for ranks in groups:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    return mine
