"""The exact reference every kernel and CP strategy is checked against.

Plain softmax attention over the dense mask, in whatever dtype the inputs have (pass float64
tensors for an exact reference).  GQA aware: each KV head serves ``heads_q // heads_kv`` query
heads.  A query row that attends no key returns zeros and an LSE of -inf, which is what the
fused kernels return for such rows.
"""

from __future__ import annotations

import math

import torch

from .masks import AttnMask


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask, *,
              scale: float | None = None, return_lse: bool = False):
    """``q``: (batch, seqlen_q, heads_q, d); ``k``: (batch, seqlen_k, heads_kv, d); ``v``: (batch,
    seqlen_k, heads_kv, d_v), d_v its own where it differs (MLA); the output is d_v wide and the
    scale 1/√d (q's and k's head dim)."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if hq % hk:
        raise ValueError(f"heads_q={hq} is not a multiple of heads_kv={hk}")
    if (sq, sk) != (mask.seqlen_q, mask.seqlen_k):
        raise ValueError(f"mask is {mask.seqlen_q}x{mask.seqlen_k}, tensors are {sq}x{sk}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = hq // hk
    # (b, h, s, d) layout for the matmuls; repeat KV heads for their query groups.
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)
    allowed = mask.to_dense().to(q.device)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (b, h, sq); -inf on empty rows
    # exp(scores - lse) with empty rows guarded: -inf - -inf would be NaN.
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe_lse.unsqueeze(-1))
    out = torch.matmul(probs, vh).transpose(1, 2).contiguous()
    return (out, lse) if return_lse else out
