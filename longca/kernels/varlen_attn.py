"""``torch.nn.attention.varlen.varlen_attn``: PyTorch's packed-document FlashAttention.

Documents go in as ``cu_seqlens`` (built untimed in ``prepare``), so attention never crosses a
document and no tile of another document is ever computed.  GQA goes in natively where this torch
takes ``enable_gqa``; otherwise KV heads are expanded and the row says so (``kv_expanded``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from ..attention.problem import Problem
from . import register
from ._flash_masks import batch_cu_seqlens, flash_mask, unsupported_reason
from .base import Kernel


@functools.lru_cache(maxsize=None)
def _api():
    """``(varlen_attn, its parameter names)`` or ``(None, reason)``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        return None, f"torch {torch.__version__} has no torch.nn.attention.varlen ({exc})"
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


class VarlenAttn(Kernel):
    name = "varlen_attn"
    description = "torch.nn.attention.varlen.varlen_attn (FlashAttention on cu_seqlens)"
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)

    def available(self) -> str | None:
        fn, params = _api()
        return params if fn is None else None

    def supports_mask(self, problem: Problem) -> str | None:
        _, params = _api()
        return unsupported_reason(self.name, problem, windows="window_size" in params)

    def prepare(self, problem: Problem) -> dict[str, Any]:
        _, params = _api()
        fm = flash_mask(problem)
        docs = problem.mask.documents or (problem.seqlen,)
        cu = batch_cu_seqlens(problem)
        window = fm.window
        if fm.causal:
            window = (window[0], 0)
        native_gqa = "enable_gqa" in params
        return {"cu_seqlens": cu, "max_seqlen": max(docs), "window_size": window,
                "documents": len(docs), "group": problem.heads_q // problem.heads_kv,
                "kv_expanded": problem.gqa and not native_gqa, "native_gqa": native_gqa}

    def forward(self, q, k, v, prepared):
        fn, _ = _api()
        b, s, hq, d = q.shape
        group = prepared["group"]
        if prepared["kv_expanded"]:
            k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        # torch 2.10 took is_causal; later releases take a (left, right) window instead.
        kwargs = ({"window_size": prepared["window_size"]} if "window_size" in _api()[1]
                  else {"is_causal": prepared["window_size"] == (-1, 0)})
        if prepared["native_gqa"] and group > 1:
            kwargs["enable_gqa"] = True
        cu, mx = prepared["cu_seqlens"], prepared["max_seqlen"]
        out = fn(q.reshape(b * s, hq, d), k.reshape(b * s, -1, d), v.reshape(b * s, -1, d),
                 cu, cu, mx, mx, **kwargs)
        return out.reshape(b, s, hq, d)


register(VarlenAttn())
