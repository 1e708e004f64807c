"""FLOP accounting, written next to nothing else so every cell divides by the same number.

Forward attention does two matmuls (QKᵀ and PV) over the attended pairs only: 2 · 2 · area · d
per head.  Backward recomputes QKᵀ and does four more (dV, dP, dQ, dK): 2.5 × forward, the
convention of the FlashAttention papers.  ``area`` is the mask's exact attended-pair count, so a
causal mask counts half the dense FLOPs and masked FLOPs are never confused with dense ones.

With a value head dim ``d_v`` other than the query/key one ``d_qk`` (DeepSeek-V3's MLA: 192/128),
each matmul counts 2 · area FLOPs times the head dim it runs over: QKᵀ, dQ = dS·K and dK = dSᵀ·Q
over ``d_qk``; PV, dV = Pᵀ·dO and dP = dO·Vᵀ over ``d_v``.  Per head:

* forward  = 2 · area · (d_qk + d_v)
* backward = 2 · area · (3 · d_qk + 2 · d_v)   (recomputed QKᵀ, dQ, dK; dV, dP)

At d_qk = d_v = d these are 4 · area · d and 10 · area · d = 2.5 × forward: the counts above, which an
unsplit problem keeps computing exactly as before.
"""

from __future__ import annotations

from .masks import AttnMask

DIRECTION_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
# The matmuls of each direction over (d_qk, d_v): their per-matmul count, 2 · area · head dim each.
MATMULS = {"fwd": (1, 1), "bwd": (3, 2), "fwd_bwd": (4, 3)}


def attention_flops(mask: AttnMask, num_heads_q: int, head_dim: int, direction: str = "fwd",
                    batch: int = 1, head_dim_v: int | None = None) -> float:
    """FLOPs of attention over ``mask`` for one batch element (times ``batch``); ``head_dim_v``: the
    value/output head dim where it differs from ``head_dim`` (None: equal)."""
    try:
        factor = DIRECTION_FACTOR[direction]
    except KeyError:
        raise ValueError(f"direction must be one of {sorted(DIRECTION_FACTOR)}, got {direction!r}") from None
    if head_dim_v is None or head_dim_v == head_dim:
        return factor * 4.0 * mask.area() * num_heads_q * head_dim * batch
    qk, v = MATMULS[direction]
    return 2.0 * mask.area() * num_heads_q * (qk * head_dim + v * head_dim_v) * batch
