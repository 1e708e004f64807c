"""PyTorch ``scaled_dot_product_attention``, once per backend and once with PyTorch's own choice.

Masks the fused backends cannot take natively go through a dense boolean ``attn_mask`` only where
the backend accepts one; the row's notes say which way the mask went in (``mask_via``).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..attention.masks import AttnMask, SliceKind
from ..attention.problem import Problem
from . import _lse_ops, register
from .base import Kernel


def _native_mode(problem: Problem) -> str | None:
    """'none' / 'is_causal' when SDPA expresses the mask without a tensor, else None."""
    (only, *rest) = problem.mask.slices
    square = problem.mask.seqlen_q == problem.mask.seqlen_k
    if rest or (only.q_start, only.k_start, only.lq, only.lk) != (0, 0, problem.mask.seqlen_q,
                                                                  problem.mask.seqlen_k):
        return None
    if only.kind is SliceKind.FULL:
        return "none"
    # SDPA's is_causal is top-left aligned; it equals ours (bottom-right) when the mask is square.
    if only.kind is SliceKind.CAUSAL and square:
        return "is_causal"
    return None


# Query rows of the dense mask built at once: a band this size is the only temporary, so a 32K mask
# (1 GiB) costs the memory probe ~100 MiB of transients beside it, below the call's own rise.
DENSE_ROWS = 1024


# The longest length a dense mask is built for: 16 GiB of booleans at 128K (the paper grid's
# longest, measured), 64 GiB at 256K and 1 TiB at 1M, memory and time quadratic in the length that
# no linear kernel's cell should pay for.
DENSE_MASK_MAX_TOKENS = 131072


def dense_mask(mask: AttnMask, device: torch.device) -> torch.Tensor:
    """``mask.to_dense()`` built on ``device``, band by band from each slice's key interval per row
    (``AttnSlice.key_bounds``).  Built on the host and copied, a 32K mask cost about as much wall as
    ten calls of the kernel it feeds, twice per cell (timing and memory), on an H100 box."""
    out = torch.zeros(mask.seqlen_q, mask.seqlen_k, dtype=torch.bool, device=device)
    for s in mask.slices:
        keys = torch.arange(s.k_start, s.k_end, device=device)
        for start in range(s.q_start, s.q_end, DENSE_ROWS):
            end = min(start + DENSE_ROWS, s.q_end)
            lo, hi = (torch.from_numpy(b).to(device)[:, None] for b in s.key_bounds(np.arange(start, end)))
            out[start:end, s.k_start:s.k_end] |= (keys >= lo) & (keys < hi)
    return out


# The aten entry point that returns the LSE, per (backend, device type): what CP strategies use.
_LSE_OPS = {
    (SDPBackend.MATH, "cpu"): _lse_ops.MathOps(),
    (SDPBackend.MATH, "cuda"): _lse_ops.MathOps(),
    (SDPBackend.FLASH_ATTENTION, "cpu"): _lse_ops.CpuFlashOps(),
    (SDPBackend.FLASH_ATTENTION, "cuda"): _lse_ops.CudaFlashOps(),
    (SDPBackend.EFFICIENT_ATTENTION, "cuda"): _lse_ops.EfficientOps(),
    (SDPBackend.CUDNN_ATTENTION, "cuda"): _lse_ops.CudnnOps(),
}


class SDPA(Kernel):
    def __init__(self, name: str, backend: SDPBackend | None, description: str, *,
                 devices=("cpu", "cuda"), dense_mask: bool = True, gqa: bool = True,
                 libraries: tuple[str, ...] = (), takes_head_dim_v: bool = False):
        self.name = name
        self.takes_head_dim_v = takes_head_dim_v
        self.libraries = libraries
        self.backend = backend
        self.description = description
        self.devices = devices
        self.dense_mask = dense_mask  # does this backend accept an attn_mask tensor?
        self.gqa = gqa  # does it take enable_gqa, or must KV heads be expanded?

    def supports_mask(self, problem: Problem) -> str | None:
        if _native_mode(problem) is None and not self.dense_mask:
            return f"{self.name} takes no attn_mask tensor and mask {problem.mask_name!r} is not full/causal"
        if _native_mode(problem) is None and problem.seqlen > DENSE_MASK_MAX_TOKENS:
            return (f"{self.name} takes mask {problem.mask_name!r} only as a dense seqlen x seqlen mask "
                    f"({self.prepared_bytes(problem) / 2**30:.0f} GiB at {problem.seqlen} tokens); LongCA builds "
                    f"none past {DENSE_MASK_MAX_TOKENS} tokens")
        return None

    def lse_ops(self, device: torch.device):
        return _LSE_OPS.get((self.backend, torch.device(device).type))

    def prepared_bytes(self, problem: Problem) -> int:
        # The dense boolean mask: seqlen_q x seqlen_k bytes (1 TiB at 1M tokens).
        return 0 if _native_mode(problem) else problem.mask.seqlen_q * problem.mask.seqlen_k

    def prepare(self, problem: Problem) -> dict[str, Any]:
        mode = _native_mode(problem)
        prepared: dict[str, Any] = {"mask_via": mode or "dense", "kv_expanded": problem.gqa and not self.gqa}
        prepared["is_causal"] = mode == "is_causal"
        if mode is None:
            prepared["attn_mask"] = dense_mask(problem.mask, problem.device)
        prepared["group"] = problem.heads_q // problem.heads_kv
        return prepared

    def forward(self, q, k, v, prepared):
        # (b, s, h, d) -> (b, h, s, d) as views: no copy inside the timed region.
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        group = prepared["group"]
        enable_gqa = group > 1
        if enable_gqa and prepared["kv_expanded"]:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            enable_gqa = False
        ctx = sdpa_kernel([self.backend]) if self.backend is not None else nullcontext()
        with ctx:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=prepared.get("attn_mask"),
                                                 is_causal=prepared["is_causal"], enable_gqa=enable_gqa)
        return out.transpose(1, 2)


# A value head dim other than the query/key one (``takes_head_dim_v``): SDPA documents value as
# (N, ..., S, Ev) and its output as (N, ..., L, Ev).  The math backend computes it on any device, and
# the dispatcher (``sdpa``) falls back to a backend that takes it (math at worst); both verified on the
# CPU (torch 2.13, forward and backward).  The flash backend refuses it ("No available kernel", on
# the CPU too); the efficient and cuDNN backends are GPU-only here and left unclaimed until a GPU run
# shows they take it.
register(SDPA("sdpa_math", SDPBackend.MATH, "SDPA, math backend (unfused reference implementation)",
              takes_head_dim_v=True))
register(SDPA("sdpa", None, "SDPA, backend chosen by PyTorch's dispatcher", takes_head_dim_v=True))
register(SDPA("sdpa_flash", SDPBackend.FLASH_ATTENTION, "SDPA, FlashAttention-2 backend",
              dense_mask=False))
register(SDPA("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION, "SDPA, memory-efficient (xFormers) backend",
              devices=("cuda",), gqa=False))
register(SDPA("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION, "SDPA, cuDNN backend", devices=("cuda",),
              libraries=("cudnn",)))
