"""Exact attention in float32 at lengths where the dense reference does not fit: one block of query
rows at a time.

``reference.attention`` materialises the whole ``seqlen × seqlen`` mask and score matrix (at 8K, 64
heads and float64: 32 GiB of scores).  Here each block of ``rows`` queries gets its rows of the mask
(from the slices' key intervals, never the dense matrix) and its scores, and is recomputed in the
backward (activation checkpointing), so memory grows with the block, not the square of the length.
The same conventions as the exact reference: GQA by repeating KV heads, and an empty query row
returns zeros.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from .masks import AttnMask, HeadBlockMask


def mask_rows(mask: AttnMask, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """The dense rows ``[start, stop)`` of ``mask``: (stop − start, seqlen_k) bool, or (heads_q,
    stop − start, seqlen_k) for a mask per KV head (``HeadBlockMask``)."""
    if isinstance(mask, HeadBlockMask):
        return mask.dense_rows(start, stop).to(device)
    rows = np.arange(start, stop)
    allowed = torch.zeros(stop - start, mask.seqlen_k, dtype=torch.bool)
    keys = torch.arange(mask.seqlen_k)
    for s in mask.slices:
        a, b = max(start, s.q_start), min(stop, s.q_end)
        if a >= b:
            continue
        lo, hi = s.key_bounds(rows[a - start:b - start])
        lo, hi = torch.as_tensor(lo).unsqueeze(1), torch.as_tensor(hi).unsqueeze(1)
        allowed[a - start:b - start] |= (keys >= lo) & (keys < hi)
    return allowed.to(device)


def _block(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, allowed: torch.Tensor, scale: float):
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse))
    return torch.matmul(probs, vh)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask, *, rows: int = 512,
              scale: float | None = None) -> torch.Tensor:
    """``q``: (batch, seqlen_q, heads_q, d), ``k``, ``v``: (batch, seqlen_k, heads_kv, d), in the
    dtype they come in (float32 for the full-size check); differentiable."""
    b, sq, hq, d = q.shape
    hk = k.shape[2]
    if hq % hk:
        raise ValueError(f"heads_q={hq} is not a multiple of heads_kv={hk}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    blocks = []
    for start in range(0, sq, rows):
        stop = min(sq, start + rows)
        allowed = mask_rows(mask, start, stop, q.device)
        blocks.append(checkpoint(_block, qh[:, :, start:stop], kh, vh, allowed, scale, use_reentrant=False))
    return torch.cat(blocks, dim=2).transpose(1, 2).contiguous()
