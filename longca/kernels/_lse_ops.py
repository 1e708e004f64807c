"""Attention with its log-sum-exp, forward and backward, per SDPA backend: what CP strategies need.

A CP strategy computes one (query shard, key shard) block at a time and merges the partial
results itself, so it needs each block's softmax statistics (the LSE) and, for the backward, a
kernel that takes the *global* output and LSE and returns this block's share of dq/dk/dv.  PyTorch's
fused backends expose exactly that through their aten ops; this module wraps them behind one
interface, on ``(batch, heads, seqlen, head_dim)`` tensors with as many KV heads as query heads
(the caller expands GQA).

Modes a backend takes: ``full``, ``causal`` (square, top-left = bottom-right) and ``bias`` (an
additive float mask, for the diagonal pieces no fused causal flag expresses).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

aten = torch.ops.aten
LseResult = tuple[torch.Tensor, torch.Tensor]


def _lse_bhs(lse: torch.Tensor, s: int) -> torch.Tensor:
    """LSE as float32 ``(b, h, s)`` (cuDNN returns ``(b, h, s, 1)``, the efficient backend pads s)."""
    if lse.dim() == 4:
        lse = lse.squeeze(-1)
    return lse[..., :s].float()


class LseOps:
    modes: frozenset[str] = frozenset()

    def forward(self, q, k, v, causal: bool, bias: Optional[torch.Tensor], scale: float) -> LseResult:
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, causal: bool, bias: Optional[torch.Tensor], scale: float):
        raise NotImplementedError


class MathOps(LseOps):
    """Plain matmuls in float32, explicit backward from the global statistics (any device)."""

    modes = frozenset({"full", "causal", "bias"})

    @staticmethod
    def _scores(q, k, causal, bias, scale):
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        if bias is not None:
            s = s + bias
        return s

    def forward(self, q, k, v, causal, bias, scale):
        s = self._scores(q, k, causal, bias, scale)
        lse = torch.logsumexp(s, dim=-1)
        safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        out = torch.matmul(torch.exp(s - safe.unsqueeze(-1)), v.float())
        return out.to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, causal, bias, scale):
        # P from the *global* LSE: this block's share of the softmax, so shares add up across blocks.
        p = torch.exp(self._scores(q, k, causal, bias, scale) - lse.unsqueeze(-1))
        do = dout.float()
        dv = torch.matmul(p.transpose(-1, -2), do)
        dp = torch.matmul(do, v.float().transpose(-1, -2))
        delta = (do * out.float()).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq = torch.matmul(ds, k.float()) * scale
        dk = torch.matmul(ds.transpose(-1, -2), q.float()) * scale
        return dq, dk, dv


class CpuFlashOps(LseOps):
    """``_scaled_dot_product_flash_attention_for_cpu``: the CPU flash kernel, with its LSE."""

    modes = frozenset({"full", "causal", "bias"})

    def forward(self, q, k, v, causal, bias, scale):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=None if bias is None else bias.to(q.dtype), scale=scale)
        return out, _lse_bhs(lse, q.shape[2])

    def backward(self, dout, q, k, v, out, lse, causal, bias, scale):
        # The kernel keeps its statistics in float32, float64 for float64 inputs.
        lse = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal, attn_mask=None if bias is None else bias.to(q.dtype),
            scale=scale)


class CudaFlashOps(LseOps):
    """``_scaled_dot_product_flash_attention`` (FlashAttention-2 inside PyTorch); no mask tensor."""

    modes = frozenset({"full", "causal"})

    def forward(self, q, k, v, causal, bias, scale):
        out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return out, _lse_bhs(lse, q.shape[2])

    def backward(self, dout, q, k, v, out, lse, causal, bias, scale):
        # No dropout: the RNG state is never read; non-varlen: no cumulative sequence lengths.
        rng = torch.empty(2, dtype=torch.uint64, device=q.device)
        unused = torch.empty(0, dtype=torch.uint64, device=q.device)
        return aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), None, None, q.shape[2], k.shape[2], 0.0, causal, rng, unused,
            scale=scale)


class CudnnOps(LseOps):
    modes = frozenset({"full", "causal", "bias"})

    def forward(self, q, k, v, causal, bias, scale):
        out, lse, *_ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None if bias is None else bias.to(q.dtype), True, 0.0, causal, False, scale=scale)
        self._lse_4d = lse.dim() == 4
        return out, _lse_bhs(lse, q.shape[2])

    def backward(self, dout, q, k, v, out, lse, causal, bias, scale):
        seed = torch.empty((), dtype=torch.int64, device=q.device)
        offset = torch.empty((), dtype=torch.int64, device=q.device)
        lse = lse.unsqueeze(-1) if getattr(self, "_lse_4d", True) else lse
        return aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.contiguous(), seed, offset, None if bias is None else bias.to(q.dtype),
            None, None, q.shape[2], k.shape[2], 0.0, causal, scale=scale)


class EfficientOps(LseOps):
    modes = frozenset({"full", "causal", "bias"})

    def forward(self, q, k, v, causal, bias, scale):
        out, lse, *_ = aten._scaled_dot_product_efficient_attention(
            q, k, v, None if bias is None else bias.to(q.dtype), True, 0.0, causal, scale=scale)
        return out, _lse_bhs(lse, q.shape[2])

    def backward(self, dout, q, k, v, out, lse, causal, bias, scale):
        s = q.shape[2]
        padded = math.ceil(s / 32) * 32  # the kernel's LSE rows come in tiles of 32
        lse = torch.nn.functional.pad(lse, (0, padded - s)) if padded != s else lse
        seed = torch.zeros((), dtype=torch.int64, device=q.device)
        offset = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            dout, q, k, v, None if bias is None else bias.to(q.dtype), out, lse.contiguous(), seed, offset,
            0.0, [True, True, True, False], causal, scale=scale)
        return dq, dk, dv


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
