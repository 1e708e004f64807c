"""``torch_cp``: PyTorch's own context parallelism (``torch.distributed.tensor.experimental``), the
external baseline.

PyTorch swaps the CUDA SDPA ops (flash, efficient, cuDNN) for ring versions while its dispatcher is
on; it takes ``is_causal`` (so ``full`` and ``causal``), expects the head-tail layout for causal
(its load balancer's), and has no GQA: KV heads are expanded to the query heads, and the row's
notes say so.  Its collectives rotate K/V by all-gather (default) or all-to-all
(``rotate_method``).

Bytes: PyTorch's ring calls the functional collectives (an all-gather for K/V,
``permute_tensor`` for the all-to-all rotation and for dK/dV), which ``Comm`` never sees; while the
strategy is planned they are wrapped to count what each call sends, by ``Comm``'s rule.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as ft_c
import torch.nn.functional as F

from ..attention.masks import SliceKind
from . import layout as layouts
from . import register
from .base import Strategy, Unsupported
from .blocks import share
from .comm import sent_bytes

_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION",
             "sdpa_cudnn": "CUDNN_ATTENTION"}


def _native(mask) -> str | None:
    if len(mask.slices) != 1:
        return None
    (s,) = mask.slices
    if (s.q_start, s.k_start, s.q_end, s.k_end) != (0, 0, mask.seqlen_q, mask.seqlen_k):
        return None
    return {SliceKind.FULL: "full", SliceKind.CAUSAL: "causal"}.get(s.kind)


class CountedFunctionalCollectives:
    """The all-gathers and ``permute_tensor`` of ``torch.distributed._functional_collectives`` wrapped
    to add what this rank sends to ``owner.comm_bytes`` (an all-gather: its input to each of the
    other ``owner.world - 1`` ranks; a permutation: its input, to one other rank, none when alone);
    ``restore`` puts the
    originals back.  PyTorch's ring gathers with ``all_gather_tensor`` (2.11) or
    ``all_gather_single`` (later): whichever this PyTorch has is wrapped."""

    GATHERS = ("all_gather_tensor", "all_gather_single")
    NAMES = GATHERS + ("permute_tensor",)

    def __init__(self, owner: Strategy):
        self.owner = owner
        self.saved = {n: getattr(ft_c, n) for n in self.NAMES if hasattr(ft_c, n)}
        for name, fn in self.saved.items():
            setattr(ft_c, name, self._counted(name, fn))

    def restore(self) -> None:
        for name, fn in self.saved.items():
            setattr(ft_c, name, fn)

    def _counted(self, name, fn):
        def call(x, *args, **kwargs):
            # Alone (cp_size 1) a permutation is to itself: nothing leaves.
            nbytes, world = x.numel() * x.element_size(), self.owner.world
            if name in self.GATHERS:
                self.owner.comm_bytes += sent_bytes("all_gather", nbytes, world)
            elif world > 1:
                self.owner.comm_bytes += sent_bytes("send", nbytes, world)
            return fn(x, *args, **kwargs)
        return call


@register
class TorchCP(Strategy):
    name = "torch_cp"
    description = "PyTorch's context_parallel (ring SDPA through its DTensor dispatcher)"
    options = {"local_kernel": "sdpa_cudnn", "rotate_method": "allgather"}
    own_collectives = "PyTorch's context_parallel calls its own functional collectives"

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        if torch.device(device).type != "cuda":
            raise Unsupported("PyTorch's context_parallel replaces only the CUDA SDPA kernels (flash, "
                              "efficient, cuDNN); on CPU SDPA would silently attend to the local shard")
        kind = _native(mask)
        if kind is None:
            raise Unsupported(f"PyTorch's context_parallel takes SDPA's is_causal only (full or causal), "
                              f"not {mask.name!r}")
        kernel = self.opts["local_kernel"]
        if kernel not in _BACKENDS:
            raise Unsupported(f"PyTorch's context_parallel runs SDPA's {', '.join(_BACKENDS)}, not {kernel}")
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental import _attention as cpa
        except ImportError as exc:
            raise Unsupported(f"this PyTorch has no context_parallel: {exc}") from None
        self.cpa = cpa
        self.causal = kind == "causal"
        self.backend = getattr(torch.nn.attention.SDPBackend, _BACKENDS[kernel])
        self.group_size = heads_q // heads_kv
        # Its load balancer (head-tail) is on for causal and must be off for full.
        self.layout = layouts.build("zigzag" if self.causal else "contiguous", mask, self.world)
        self.mesh = init_device_mesh("cuda", (self.world,))
        cpa.set_rotate_method(self.opts["rotate_method"])  # "allgather" or "alltoall"
        cpa._cp_options.enable_load_balance = self.causal
        self.rank_area = share(mask.area(), self.world, self.rank)  # the library's split is its own
        self.notes = {"layout": self.layout.name, "kv_expanded": self.group_size > 1,
                      "rotate_method": self.opts["rotate_method"]}
        # Forward and backward both run through the patched ops: on from here until close().
        # Entered through the public context manager (its private helpers are renamed between
        # releases); the buffer it shards is a dummy: our dispatch() lays the inputs out.
        import contextlib

        self._counter = CountedFunctionalCollectives(self)
        self._stack = contextlib.ExitStack()
        dummy = torch.zeros(1, 1, 2 * self.world, 1, device=device)
        self._stack.enter_context(cpa.context_parallel(self.mesh, buffers=[dummy], buffer_seq_dims=[2],
                                                       no_restore_buffers={dummy}))
        cpa._cp_options.enable_load_balance = self.causal

    def close(self) -> None:
        stack = getattr(self, "_stack", None)
        if stack is not None:
            self._stack = None
            stack.close()
        counter = getattr(self, "_counter", None)
        if counter is not None:
            self._counter = None
            counter.restore()

    def attention(self, q, k, v):
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.group_size > 1:  # no GQA in PyTorch's CP ops
            k = k.repeat_interleave(self.group_size, dim=1)
            v = v.repeat_interleave(self.group_size, dim=1)
        with torch.nn.attention.sdpa_kernel([self.backend]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return out.transpose(1, 2)
