"""The ``block_sparse`` pattern: random tiles at a given density, for block-sparse kernels."""

from __future__ import annotations

import numpy as np

from ..errors import MaskError
from ..varlen import STREAM_PARAMS, rng
from ._checks import _positive
from ._shapes import _mask, _Slices
from .slices import AttnMask, SliceKind

BLOCK_SPARSE = "block_sparse"
SPARSE_BLOCK = 128  # the tile of FlexAttention's BlockMask and of most block-sparse kernels


def block_sparse(seqlen: int, *, seed: int = 0, block: int = SPARSE_BLOCK, density: float = 0.25,
                 causal: bool = False) -> AttnMask:
    """Random ``block × block`` tiles at block density ``density`` (the benchmark of block-sparse
    kernels: FLOPs are counted on the attended tiles only).

    Each query block attends ``max(1, round(density · n))`` key blocks chosen by the seed, always
    including its own diagonal block so that no row is empty (``n`` = key blocks it may see: all of
    them, or those at or before it when ``causal``; the diagonal tile is then CAUSAL).  ``seqlen``
    must be a multiple of ``block``.  Consecutive chosen tiles merge into one slice."""
    block = _positive("block", block)
    if seqlen % block:
        raise MaskError(f"block_sparse: seqlen {seqlen} is not a multiple of block {block}")
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise MaskError(f"block_sparse: density must be a number in (0, 1], got {density!r}")
    if not isinstance(causal, bool):
        raise MaskError(f"block_sparse: causal must be true or false, got {causal!r}")
    gen = rng(int(seed), STREAM_PARAMS)
    nb = seqlen // block
    out = _Slices()
    chosen_total = 0
    for qb in range(nb):
        visible = qb + 1 if causal else nb
        want = max(1, int(round(density * visible)))
        others = [kb for kb in range(visible) if kb != qb]
        order = np.argsort(gen.random(len(others)), kind="stable")
        chosen = sorted([qb] + [others[i] for i in order[: want - 1]])
        chosen_total += len(chosen)
        q0, q1 = qb * block, (qb + 1) * block
        run_start = prev = None
        for kb in chosen + [None]:
            if run_start is not None and (kb is None or kb != prev + 1 or (causal and kb == qb)):
                end = prev + 1
                # The causal diagonal tile always forms a run of its own (see the break above).
                kind = SliceKind.CAUSAL if causal and end == qb + 1 else SliceKind.FULL
                out.add(q0, q1, run_start * block, end * block, kind)
                run_start = None
            if kb is not None and run_start is None:
                run_start = kb
            prev = kb
    params = {"block": block, "density": float(density), "causal": causal, "seed": int(seed),
              "block_density": chosen_total / (nb * nb)}
    return _mask(BLOCK_SPARSE, seqlen, out, params, None)
