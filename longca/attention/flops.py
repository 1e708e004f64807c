"""FLOP accounting, written next to nothing else so every cell divides by the same number.

Forward attention does two matmuls (QKᵀ and PV) over the attended pairs only: 2 · 2 · area · d
per head.  Backward recomputes QKᵀ and does four more (dV, dP, dQ, dK): 2.5 × forward, the
convention of the FlashAttention papers.  ``area`` is the mask's exact attended-pair count, so a
causal mask counts half the dense FLOPs and masked FLOPs are never confused with dense ones.
"""

from __future__ import annotations

from .masks import AttnMask

DIRECTION_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def attention_flops(mask: AttnMask, num_heads_q: int, head_dim: int, direction: str = "fwd",
                    batch: int = 1) -> float:
    """FLOPs of attention over ``mask`` for one batch element (times ``batch``)."""
    try:
        factor = DIRECTION_FACTOR[direction]
    except KeyError:
        raise ValueError(f"direction must be one of {sorted(DIRECTION_FACTOR)}, got {direction!r}") from None
    return factor * 4.0 * mask.area() * num_heads_q * head_dim * batch
