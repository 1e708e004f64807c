"""A mask as FlashMask's column-wise row indices (PaddlePaddle's ``flashmask_attention``).

FlashMask describes a mask column by column: for key ``j`` it masks rows of the score matrix in at
most one interval of the lower-left triangle (rows ``i >= j``) and one of the upper-right triangle
(rows ``i < j``), given as ``startend_row_indices [batch, heads, seqlen_k, n]`` (int32):

* ``causal=True``, ``n = 1``: ``[LTS]``: the upper triangle is masked, and rows ``>= LTS`` of the
  lower one;
* ``causal=True``, ``n = 2``: ``[LTS, LTE]``: the upper triangle, and lower rows in ``[LTS, LTE)``;
* ``causal=False``, ``n = 2``: ``[LTS, UTE]``: lower rows ``>= LTS`` and upper rows ``< UTE``;
* ``causal=False``, ``n = 4``: ``[LTS, LTE, UTS, UTE]``: lower rows in ``[LTS, LTE)``, upper rows
  in ``[UTS, UTE)``.

Paddle's own reference (``flashmask_to_densemask`` in ``flashmask_attention``'s docstring, Paddle
3.3) masks rows ``[LTS, LTE)`` and ``[UTS, UTE)`` of column ``j`` (and rows ``< j`` when causal)
without clipping them to a triangle; ``to_flashmask`` keeps each run within its triangle, so both
readings give the same mask.  Column ``j`` may then attend ``[0, UTS) ∪ [UTE, j)`` above the diagonal
and ``[j, LTS) ∪ [LTE, S)`` on and below it.  A LongCA mask converts exactly when every column's
attended rows have that shape;
``to_flashmask`` gives the narrowest form that holds the mask (causal before not, fewer indices
before more) or raises ``NotRepresentable`` naming the first column that does not fit.
``flashmask_dense`` expands indices back to the bool matrix by the rules above: the conversion's
check, and the reference its tests compare with.  Square masks only (FlashMask's triangles are the
square's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import MaskError
from .masks import AttnMask, AttnSlice, SliceKind


class NotRepresentable(MaskError):
    """The mask attends, in some column, rows that FlashMask's two masked intervals cannot leave."""


@dataclass(frozen=True)
class FlashMaskIndices:
    """``indices [seqlen_k, n]`` int32 (FlashMask's ``startend_row_indices`` for one head and
    sequence) and the ``causal`` flag they go with."""

    indices: np.ndarray
    causal: bool


def column_rows(s: AttnSlice, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Global query rows ``[lo, hi)`` of slice ``s`` that attend each global key column in ``cols``
    (every column of a slice is attended by one contiguous run of rows, empty when ``lo >= hi``)."""
    local = np.asarray(cols, dtype=np.int64) - s.k_start
    lo = np.full_like(local, s.q_start)
    hi = np.full_like(local, s.q_end)
    shift = s.lk - s.lq
    if s.kind in (SliceKind.CAUSAL, SliceKind.BI_CAUSAL):  # j <= i + shift: i >= j - shift
        lo = s.q_start + np.maximum(0, local - shift)
    if s.kind in (SliceKind.INV_CAUSAL, SliceKind.BI_CAUSAL):  # j >= i: i <= j
        hi = s.q_start + np.minimum(s.lq, local + 1)
    return lo, hi


def _columns(mask: AttnMask) -> list[list[tuple[int, int]]]:
    """Per key column, its attended row intervals, merged and sorted."""
    per_column: list[list[tuple[int, int]]] = [[] for _ in range(mask.seqlen_k)]
    for s in mask.slices:
        cols = np.arange(s.k_start, s.k_end)
        lo, hi = column_rows(s, cols)
        for j, a, b in zip(cols.tolist(), lo.tolist(), hi.tolist()):
            if a < b:
                per_column[j].append((a, b))
    merged = []
    for intervals in per_column:
        out: list[tuple[int, int]] = []
        for a, b in sorted(intervals):
            if out and a <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        merged.append(out)
    return merged


def _clip(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def _gap(attended: list[tuple[int, int]], lo: int, hi: int) -> tuple[int, int] | None:
    """The one masked interval ``[start, end)`` of ``[lo, hi)`` that leaves ``attended`` (``start ==
    end``: nothing masked), or None when the attended rows leave more than one gap."""
    if not attended:
        return lo, hi
    first, last = attended[0], attended[-1]
    if len(attended) > 2 or (len(attended) == 2 and (first[0] != lo or last[1] != hi)):
        return None
    if len(attended) == 2:
        return first[1], last[0]
    a, b = first
    if a == lo:
        return b, hi
    if b == hi:
        return lo, a
    return None


def to_flashmask(mask: AttnMask) -> FlashMaskIndices:
    """``mask`` as FlashMask's column indices (module docstring), or ``NotRepresentable``."""
    if mask.seqlen_q != mask.seqlen_k:
        raise NotRepresentable(f"{mask.name}: FlashMask's triangles are a square's; this mask is "
                               f"{mask.seqlen_q} x {mask.seqlen_k}")
    s = mask.seqlen_q
    lower = np.empty((s, 2), dtype=np.int64)   # masked [LTS, LTE) of rows >= j
    upper = np.empty((s, 2), dtype=np.int64)   # masked [UTS, UTE) of rows < j
    for j, attended in enumerate(_columns(mask)):
        below = _gap(_clip(attended, j, s), j, s)
        above = _gap(_clip(attended, 0, j), 0, j)
        if below is None or above is None:
            raise NotRepresentable(
                f"{mask.name} at {s} tokens: key column {j} is attended by rows "
                f"{', '.join(f'[{a}, {b})' for a, b in attended)}, which leaves more than one masked run "
                f"{'on and below' if below is None else 'above'} the diagonal (FlashMask masks one per triangle)")
        lower[j], upper[j] = below, above
    # An empty masked run is written at the triangle's far end, as FlashMask's own examples do.
    lower[lower[:, 0] == lower[:, 1]] = s
    upper_empty = upper[:, 0] == upper[:, 1]
    upper[upper_empty] = 0
    if (upper[:, 0] == 0).all() and (upper[:, 1] == np.arange(s)).all():   # every upper triangle masked
        if (lower[:, 1] == s).all():
            return FlashMaskIndices(lower[:, :1].astype(np.int32), causal=True)
        return FlashMaskIndices(lower.astype(np.int32), causal=True)
    if (lower[:, 1] == s).all() and (upper[:, 0] == 0).all():
        return FlashMaskIndices(np.stack([lower[:, 0], upper[:, 1]], axis=1).astype(np.int32), causal=False)
    return FlashMaskIndices(np.concatenate([lower, upper], axis=1).astype(np.int32), causal=False)


def flashmask_dense(fm: FlashMaskIndices, seqlen_q: int) -> np.ndarray:
    """The bool ``[seqlen_q, seqlen_k]`` matrix (True = attend) that FlashMask's indices describe, by
    Paddle's reference expansion (module docstring)."""
    idx = fm.indices.astype(np.int64)
    cols = idx.shape[0]
    rows = np.arange(seqlen_q)[:, None]
    n = idx.shape[1]
    lts = idx[:, 0]
    lte = idx[:, 1] if (fm.causal and n == 2) or n == 4 else np.full(cols, seqlen_q)
    if fm.causal:
        uts, ute = np.zeros(cols, dtype=np.int64), np.arange(cols)
    elif n == 2:
        uts, ute = np.zeros(cols, dtype=np.int64), idx[:, 1]
    else:
        uts, ute = idx[:, 2], idx[:, 3]
    masked = ((rows >= lts[None, :]) & (rows < lte[None, :])) | ((rows >= uts[None, :]) & (rows < ute[None, :]))
    return ~masked
