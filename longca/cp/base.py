"""What every CP strategy is: planned for a mask on a process group, then dispatch / attention /
undispatch (the contract in docs/architecture.md).

A strategy is built on a process group (``build``), planned for one problem (``plan``: the layout,
the blocks each rank computes, their pieces: all untimed), then used as

    q_local = strategy.dispatch(q_global)            # this rank's shard, (b, s_local, h, d)
    out_local = strategy.attention(q_local, k_local, v_local)   # autograd-capable
    out_global = strategy.undispatch(out_local)       # every rank gets the whole tensor

Subclasses implement ``_forward(q, k, v) -> (out, saved)`` and ``_backward(dout, saved) ->
(dq, dk, dv)``; the autograd plumbing is here, once.  ``comm_bytes`` counts what this rank sends;
``rank_area`` is the number of (query, key) pairs this rank computes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..attention.masks import AttnMask
from ..kernels.base import Unsupported  # one type: a strategy's refusal and its local kernel's are alike

__all__ = ["Strategy", "Unsupported"]


class Strategy:
    name: str = ""
    description: str = ""
    # Options a strategy accepts from config (cp_options: {<name>: {...}}) and their defaults.
    # local_kernel: a registry kernel or ``auto`` (``longca.cp.local.AUTO_LOCAL_KERNELS``);
    # local_calls: ``auto`` (one call per block where the kernel can) or ``pieces``;
    # comm_sm_margin: SMs a local call that overlaps a transfer leaves to the collective's kernels
    # (where the kernel takes such a margin: FFA's persistent kernel otherwise holds every SM until
    # it ends, and the transfer waits; MagiAttention leaves 4).
    options: dict[str, Any] = {"local_kernel": "auto", "local_calls": "auto", "layout": "auto", "comm_sm_margin": 4}
    # Why this strategy's step cannot be timed with its collectives replaced by local copies
    # (``longca.cp.comm.local_copies``): a library's own collectives, which LongCA does not route.
    # None: every collective it makes goes through ``longca.cp.comm`` (the exposed-communication
    # measurement, config ``cp_exposed_comm``).
    own_collectives: str | None = None

    def __init__(self, group: dist.ProcessGroup | None = None, options: dict[str, Any] | None = None):
        unknown = sorted(set(options or {}) - set(self.options))
        if unknown:
            raise ValueError(f"CP strategy {self.name!r} has no option {', '.join(map(repr, unknown))} "
                             f"(it accepts: {', '.join(sorted(self.options))})")
        self.opts = {**self.options, **(options or {})}
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.comm_bytes = 0
        self.rank_area = 0
        self.layout = None
        self.notes: dict[str, Any] = {}

    @classmethod
    def sized(cls, world: int, options: dict[str, Any] | None = None) -> "Strategy":
        """An instance that knows only its size and options, with no process group: what ``refuses``
        asks before any work (config validation, ``longca predict``)."""
        self = cls.__new__(cls)
        self.opts, self.group, self.world, self.rank = {**cls.options, **(options or {})}, None, world, 0
        return self

    def refuses(self, heads_q: int, heads_kv: int) -> str | None:
        """Why this strategy cannot run on ``self.world`` ranks with these heads and its options (the
        checks ``plan`` makes first), or None."""
        return None

    # --- planning ------------------------------------------------------------------------------
    def plan(self, mask: AttnMask, heads_q: int, heads_kv: int, head_dim: int, device: torch.device,
             dtype: torch.dtype) -> None:
        """Prepare everything untimed; raise Unsupported with the reason when this cannot run."""
        raise NotImplementedError

    def close(self) -> None:
        """Undo whatever ``plan`` switched on globally (most strategies: nothing)."""

    # --- the contract --------------------------------------------------------------------------
    def dispatch(self, x_global: torch.Tensor) -> torch.Tensor:
        return self.layout.dispatch(x_global, self.rank)

    def undispatch(self, x_local: torch.Tensor) -> torch.Tensor:
        gathered = [torch.empty_like(x_local) for _ in range(self.world)]
        dist.all_gather(gathered, x_local.contiguous(), group=self.group)
        return self.layout.assemble(gathered)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _Attention.apply(self, q, k, v)

    # --- what subclasses write -----------------------------------------------------------------
    def _forward(self, q, k, v) -> tuple[torch.Tensor, tuple]:
        raise NotImplementedError

    def _backward(self, dout, saved: tuple):
        raise NotImplementedError


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, strategy: Strategy, q, k, v):
        out, saved = strategy._forward(q, k, v)
        ctx.strategy = strategy
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = ctx.strategy._backward(dout.contiguous(), ctx.saved_tensors)
        return None, dq, dk, dv
