"""xFormers ``memory_efficient_attention`` (optional extra: ``xformers``).

Masks go in as xFormers attention-bias objects built untimed in ``prepare``: none (full),
``LowerTriangularMask`` (causal), ``BlockDiagonal[Causal]Mask.from_seqlens`` (packed documents).
GQA goes in as xFormers' 5-D ``(batch, seqlen, kv_heads, group, head_dim)`` layout, with K/V
broadcast by ``expand`` (a view: no copy).  Windows and the other patterns are ``unsupported``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..attention.problem import Problem
from . import register
from ._flash_masks import NO_WINDOW, flash_mask
from ._library import Library
from .base import Kernel


def _import_fmha():
    import xformers.ops.fmha as fmha
    return fmha


_fmha = Library(_import_fmha, "xformers", "install xformers")


class XformersFmha(Kernel):
    name = "xformers"
    libraries = ("xformers",)
    description = "xFormers memory_efficient_attention (fmha dispatcher)"
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def available(self) -> str | None:
        return _fmha.missing()

    def supports_mask(self, problem: Problem) -> str | None:
        fm = flash_mask(problem)
        if fm is None or fm.window != NO_WINDOW:
            return f"xformers adapter takes full, causal and packed documents, not {problem.mask_name!r}"
        if fm.packed and problem.batch != 1:
            return "xformers block-diagonal masks need batch 1 (documents are packed into one sequence)"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        fmha = _fmha()
        fm = flash_mask(problem)
        if fm.packed:
            cls = fmha.attn_bias.BlockDiagonalCausalMask if fm.causal else fmha.attn_bias.BlockDiagonalMask
            bias = cls.from_seqlens(list(fm.documents), device=problem.device)
        else:
            bias = fmha.attn_bias.LowerTriangularMask() if fm.causal else None
        return {"attn_bias": bias, "causal": fm.causal, "documents": len(fm.documents),
                "group": problem.heads_q // problem.heads_kv}

    def forward(self, q, k, v, prepared):
        fmha = _fmha()
        group = prepared["group"]
        if group > 1:
            b, s, hq, d = q.shape
            hk = hq // group
            q = q.reshape(b, s, hk, group, d)
            k = k[:, :, :, None, :].expand(b, s, hk, group, d)
            v = v[:, :, :, None, :].expand(b, s, hk, group, d)
            return fmha.memory_efficient_attention(q, k, v, attn_bias=prepared["attn_bias"]).reshape(b, s, hq, d)
        return fmha.memory_efficient_attention(q, k, v, attn_bias=prepared["attn_bias"])


register(XformersFmha())
