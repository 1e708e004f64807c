"""The mask as seen by one block of a CP step: a query shard against a key shard.

A shard is a tuple of ``Span``s: contiguous global token ranges laid end to end in local memory
(zigzag gives two spans per rank, per-document zigzag two per document).  ``restrict`` clips every
slice of the global mask to the spans and returns the slices in *local* coordinates, still as
FULL / CAUSAL / INV_CAUSAL / BI_CAUSAL, so a block is computed by the same slice kernels as a whole
mask and never through a dense matrix.  Empty blocks come back empty: that is how every strategy
skips the keys its mask does not need.

Why this is exact: every row of a slice attends one key interval ``[lo(i), hi(i))`` where each end
is either constant or ``i + c`` (``AttnSlice.key_bounds``).  Clipping to a rectangle takes
``max(lo, k0)`` and ``min(hi, k1)``, which switch form at one row each, so the rectangle splits into
at most three row pieces, each of which is again one of the four kinds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from ..attention.masks import AttnMask, AttnSlice, SliceKind


@dataclass(frozen=True)
class Span:
    """Global tokens ``[start, end)`` stored at local offset ``offset``."""

    start: int
    end: int
    offset: int

    @property
    def length(self) -> int:
        return self.end - self.start


def spans_from_ranges(ranges: Iterable[tuple[int, int]], offset: int = 0) -> tuple[Span, ...]:
    """Lay global ranges end to end from ``offset``, merging ranges that touch."""
    spans: list[Span] = []
    for start, end in ranges:
        if end <= start:
            continue
        if spans and spans[-1].end == start:
            last = spans.pop()
            spans.append(Span(last.start, end, last.offset))
        else:
            spans.append(Span(start, end, offset))
        offset += end - start
    return tuple(spans)


def shard_length(spans: Sequence[Span]) -> int:
    return sum(s.length for s in spans)


class _SpanIndex:
    """Spans sorted by global start, for finding those that overlap a range."""

    def __init__(self, spans: Sequence[Span]):
        self.spans = sorted(spans, key=lambda s: s.start)
        self.starts = [s.start for s in self.spans]

    def overlapping(self, start: int, end: int) -> list[Span]:
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        out = []
        while i < len(self.spans) and self.spans[i].start < end:
            if self.spans[i].end > start:
                out.append(self.spans[i])
            i += 1
        return out


def _clip(s: AttnSlice, q0: int, q1: int, k0: int, k1: int) -> list[AttnSlice]:
    """``s`` restricted to the global rectangle ``[q0, q1) × [k0, k1)`` (inside its own)."""
    # Row i attends [lo(i), hi(i)): lo = k0 or i + bl, hi = k1 or i + bh after clipping.
    lo_moves = s.kind in (SliceKind.INV_CAUSAL, SliceKind.BI_CAUSAL)
    hi_moves = s.kind in (SliceKind.CAUSAL, SliceKind.BI_CAUSAL)
    bl = s.k_start - s.q_start          # lo(i) = i + bl   (j >= i, top-left aligned)
    bh = s.k_end - s.q_end + 1          # hi(i) = i + bh   (j <= i + lk - lq, bottom-right aligned)
    cuts = {q0, q1}
    if lo_moves:
        cuts.add(min(max(k0 - bl, q0), q1))  # below it lo = k0, from it lo = i + bl
    if hi_moves:
        cuts.add(min(max(k1 - bh, q0), q1))  # below it hi = i + bh, from it hi = k1
    rows = sorted(cuts)
    out = []
    for a, b in zip(rows, rows[1:]):
        if a >= b:
            continue
        lo_diag = lo_moves and a >= k0 - bl   # lo = i + bl on the whole piece
        hi_diag = hi_moves and b <= k1 - bh   # hi = i + bh on the whole piece
        if not lo_diag and not hi_diag:
            out.append(AttnSlice(a, b, k0, k1, SliceKind.FULL))
        elif not lo_diag:
            a = max(a, k0 - bh + 1)           # rows with at least one key: i + bh > k0
            if a < b:
                out.append(AttnSlice(a, b, k0, b + bh - 1, SliceKind.CAUSAL))
        elif not hi_diag:
            b = min(b, k1 - bl)               # rows with at least one key: i + bl < k1
            if a < b:
                out.append(AttnSlice(a, b, a + bl, k1, SliceKind.INV_CAUSAL))
        elif bh - 1 >= bl:
            out.append(AttnSlice(a, b, a + bl, b + bh - 1, SliceKind.BI_CAUSAL))
    return [p for p in out if p.area() > 0]


def restrict(mask: AttnMask, q_spans: Sequence[Span], k_spans: Sequence[Span]) -> tuple[AttnSlice, ...]:
    """The slices of ``mask`` that fall in ``q_spans × k_spans``, in local coordinates.

    Local row ``p`` is global token ``span.start + p - span.offset`` of the query span that holds
    it; likewise for keys.  The result's slices do not overlap (the mask's do not)."""
    q_index, k_index = _SpanIndex(q_spans), _SpanIndex(k_spans)
    out: list[AttnSlice] = []
    for s in mask.slices:
        for qs in q_index.overlapping(s.q_start, s.q_end):
            q0, q1 = max(qs.start, s.q_start), min(qs.end, s.q_end)
            for ks in k_index.overlapping(s.k_start, s.k_end):
                k0, k1 = max(ks.start, s.k_start), min(ks.end, s.k_end)
                dq, dk = qs.offset - qs.start, ks.offset - ks.start
                for p in _clip(s, q0, q1, k0, k1):
                    out.append(AttnSlice(p.q_start + dq, p.q_end + dq, p.k_start + dk, p.k_end + dk, p.kind))
    return tuple(out)


def area(slices: Iterable[AttnSlice]) -> int:
    return sum(s.area() for s in slices)


def share(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` pairs split into ``parts`` whole shares, the first ``total % parts``
    one pair more: the shares sum to ``total`` exactly (a rank's area where the work is split evenly)."""
    whole, remainder = divmod(total, parts)
    return whole + int(index < remainder)


def merge_slices(slices: Sequence[AttnSlice]) -> tuple[AttnSlice, ...]:
    """The same (query, key) pairs in fewer slices, where a rank's pieces lie next to each other in
    local memory though not in the sequence (``restrict`` cuts at every span).  A one-row FULL slice
    is a one-row CAUSAL one; then, to a fixed point: a FULL slice and a CAUSAL (or FULL) one on the
    same rows and adjacent keys become one; two CAUSAL (or two FULL) slices on adjacent rows that
    agree on every row's key bounds become one.  Fewer slices are fewer FFA ranges or varlen calls, and a
    rank's own block whose query ranges no longer overlap is written without atomics."""
    def norm(x: AttnSlice) -> AttnSlice:
        return replace(x, kind=SliceKind.CAUSAL) if x.kind is SliceKind.FULL and x.lq == 1 else x

    out = sorted((norm(x) for x in slices if x.area() > 0), key=lambda x: (x.q_start, x.q_end, x.k_start))
    changed = True
    while changed:
        changed, merged = False, []
        for x in sorted(out, key=lambda x: (x.q_start, x.q_end, x.k_start)):  # same rows, adjacent keys
            last = merged[-1] if merged else None
            if (last is not None and last.kind is SliceKind.FULL and (last.q_start, last.q_end) == (x.q_start, x.q_end)
                    and last.k_end == x.k_start and x.kind in (SliceKind.FULL, SliceKind.CAUSAL)):
                merged[-1] = replace(x, k_start=last.k_start)
                changed = True
            else:
                merged.append(x)
        out, merged = merged, []
        for x in sorted(out, key=lambda x: (x.k_start, x.q_start)):  # adjacent rows, same bounds
            last = merged[-1] if merged else None
            if (last is not None and last.kind is x.kind and last.q_end == x.q_start and last.k_start == x.k_start
                    and ((x.kind is SliceKind.CAUSAL and last.k_end - last.q_end == x.k_end - x.q_end)
                         or (x.kind is SliceKind.FULL and last.k_end == x.k_end))):
                merged[-1] = replace(last, q_end=x.q_end, k_end=x.k_end)
                changed = True
            else:
                merged.append(x)
        out = merged
    return tuple(sorted(out, key=lambda x: (x.q_start, x.k_start)))
