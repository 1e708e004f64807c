"""The representation: ``AttnMask`` made of non-overlapping ``AttnSlice`` rectangles.

Inside a slice with local query index ``i`` (``0 ≤ i < lq``) and local key index ``j``
(``0 ≤ j < lk``):

* ``FULL``        — every pair;
* ``CAUSAL``      — ``j ≤ i + (lk − lq)``  (bottom-right aligned, as flash-attn ≥ 2.1);
* ``INV_CAUSAL``  — ``j ≥ i``              (top-left aligned);
* ``BI_CAUSAL``   — both of the above: ``i ≤ j ≤ i + (lk − lq)``, a band of width ``lk − lq + 1``.

Each kind's exact area in closed form, and ``check_disjoint``: the rule that no two slices attend a
common (q, k) pair, checked exactly without a dense matrix.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..errors import MaskError


class SliceKind(str, enum.Enum):
    FULL = "full"
    CAUSAL = "causal"
    INV_CAUSAL = "inv_causal"
    BI_CAUSAL = "bi_causal"


def _causal_area(lq: int, lk: int) -> int:
    # Row i sees clamp(i + lk - lq + 1, 0, lk) keys.
    if lk >= lq:
        return lq * (lk - lq) + lq * (lq + 1) // 2
    return lk * (lk + 1) // 2


def _inv_causal_area(lq: int, lk: int) -> int:
    # Row i sees clamp(lk - i, 0, lk) keys.
    if lk >= lq:
        return lq * lk - lq * (lq - 1) // 2
    return lk * (lk + 1) // 2


def _bi_causal_area(lq: int, lk: int) -> int:
    # Row i sees the band [i, i + lk - lq]: empty when lk < lq.
    return lq * (lk - lq + 1) if lk >= lq else 0


_AREA: dict[SliceKind, Callable[[int, int], int]] = {
    SliceKind.FULL: lambda lq, lk: lq * lk,
    SliceKind.CAUSAL: _causal_area,
    SliceKind.INV_CAUSAL: _inv_causal_area,
    SliceKind.BI_CAUSAL: _bi_causal_area,
}


@dataclass(frozen=True)
class AttnSlice:
    """Queries ``[q_start, q_end)`` attend keys ``[k_start, k_end)`` with the rule of ``kind``."""

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    kind: SliceKind = SliceKind.FULL

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SliceKind(self.kind))

    @property
    def lq(self) -> int:
        return self.q_end - self.q_start

    @property
    def lk(self) -> int:
        return self.k_end - self.k_start

    def area(self) -> int:
        return _AREA[self.kind](self.lq, self.lk)

    def dense(self) -> torch.Tensor:
        """The slice's own ``[lq, lk]`` bool pattern (small slices only: it is materialised)."""
        i = torch.arange(self.lq).unsqueeze(1)
        j = torch.arange(self.lk).unsqueeze(0)
        shift = self.lk - self.lq
        if self.kind is SliceKind.FULL:
            return torch.ones(self.lq, self.lk, dtype=torch.bool)
        if self.kind is SliceKind.CAUSAL:
            return j <= i + shift
        if self.kind is SliceKind.INV_CAUSAL:
            return j >= i
        return (j >= i) & (j <= i + shift)

    def as_tuple(self) -> tuple[int, int, int, int, str]:
        return (self.q_start, self.q_end, self.k_start, self.k_end, self.kind.value)

    def key_bounds(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global key interval ``[lo, hi)`` attended by each global query row in ``rows``.

        Every row of a slice attends one contiguous key interval (empty when ``lo >= hi``), and
        both ends are non-decreasing in the row.  This is what the FlexAttention ``mask_mod``,
        block sparsity and the exact overlap check are computed from, without a dense matrix.
        """
        rows = np.asarray(rows, dtype=np.int64)
        lo = np.full_like(rows, self.k_start)
        hi = np.full_like(rows, self.k_end)
        if self.kind in (SliceKind.INV_CAUSAL, SliceKind.BI_CAUSAL):
            lo = self.k_start + (rows - self.q_start)  # j >= i
        if self.kind in (SliceKind.CAUSAL, SliceKind.BI_CAUSAL):
            hi = np.minimum(self.k_end, rows + self.k_end - self.q_end + 1)  # j <= i + lk - lq
        return lo, hi


@dataclass(frozen=True)
class AttnMask:
    """A mask pattern resolved for one sequence length (see the module docstring)."""

    name: str
    seqlen_q: int
    seqlen_k: int
    slices: tuple[AttnSlice, ...]
    documents: tuple[int, ...] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def area(self) -> int:
        """Exact number of attended (q, k) pairs."""
        return sum(s.area() for s in self.slices)

    def density(self) -> float:
        """Attended fraction of the full ``seqlen_q × seqlen_k`` rectangle."""
        return self.area() / (self.seqlen_q * self.seqlen_k)

    def to_dense(self) -> torch.Tensor:
        """Bool tensor ``[seqlen_q, seqlen_k]``, True = attend."""
        out = torch.zeros(self.seqlen_q, self.seqlen_k, dtype=torch.bool)
        for s in self.slices:
            out[s.q_start : s.q_end, s.k_start : s.k_end] |= s.dense()
        return out


def _shared_pair(a: AttnSlice, b: AttnSlice) -> tuple[int, int] | None:
    """A (q, k) pair attended by both slices, or None.  Exact: per row, intersect the two key
    intervals over the rows both rectangles share (O(rows), no dense matrix)."""
    q0, q1 = max(a.q_start, b.q_start), min(a.q_end, b.q_end)
    if q0 >= q1 or max(a.k_start, b.k_start) >= min(a.k_end, b.k_end):
        return None
    rows = np.arange(q0, q1)
    lo_a, hi_a = a.key_bounds(rows)
    lo_b, hi_b = b.key_bounds(rows)
    lo, hi = np.maximum(lo_a, lo_b), np.minimum(hi_a, hi_b)
    hit = np.flatnonzero(lo < hi)
    if hit.size == 0:
        return None
    return int(rows[hit[0]]), int(lo[hit[0]])


def check_disjoint(slices: Sequence[AttnSlice]) -> None:
    """Raise MaskError if two slices attend a common (q, k) pair.

    The rule is on attended pairs, not rectangles: a CAUSAL slice and an INV_CAUSAL slice
    shifted one key right may share a rectangle and still be valid.  A sweep over query starts
    limits the exact test to slices whose rectangles overlap."""
    order = sorted(range(len(slices)), key=lambda k: slices[k].q_start)
    active: list[int] = []
    for k in order:
        s = slices[k]
        active = [a for a in active if slices[a].q_end > s.q_start]
        for a in active:
            pair = _shared_pair(slices[a], s)
            if pair is not None:
                i, j = sorted((a, k))
                raise MaskError(f"slices[{i}] and slices[{j}] overlap: both attend "
                                f"(q={pair[0]}, k={pair[1]})")
        active.append(k)
