"""Slice lists and the shapes the builders assemble masks from: a band ``|i − j| ≤ window``, a causal
band ``0 ≤ i − j ≤ window`` and a prefix-then-causal square, each in at most three slices."""

from __future__ import annotations

from typing import Any

from .slices import AttnMask, AttnSlice, SliceKind


class _Slices(list):
    """A slice list that drops empty rectangles, so builders need no edge-case branches."""

    def add(self, q_start: int, q_end: int, k_start: int, k_end: int, kind: SliceKind) -> None:
        if q_end > q_start and k_end > k_start:
            self.append(AttnSlice(q_start, q_end, k_start, k_end, kind))


def _mask(name: str, seqlen: int, slices: list[AttnSlice], params: dict[str, Any],
          documents: tuple[int, ...] | None = None) -> AttnMask:
    return AttnMask(name, seqlen, seqlen, tuple(slices), documents, params)


def _band(out: _Slices, offset: int, n: int, window: int) -> None:
    """``|i − j| ≤ window`` on the square ``[offset, offset + n)²`` in at most three slices."""
    o, w = offset, window
    if w >= n - 1:
        out.add(o, o + n, o, o + n, SliceKind.FULL)
        return
    top = min(w, n - w)
    out.add(o, o + top, o, o + top + w, SliceKind.CAUSAL)            # rows i < w: j ≤ i + w
    if w <= n - w:
        out.add(o + w, o + n - w, o, o + n, SliceKind.BI_CAUSAL)     # i − w ≤ j ≤ i + w
    else:
        out.add(o + n - w, o + w, o, o + n, SliceKind.FULL)          # both ends out of range
    bottom = max(w, n - w)
    out.add(o + bottom, o + n, o + bottom - w, o + n, SliceKind.INV_CAUSAL)  # j ≥ i − w


def _causal_band(out: _Slices, offset: int, n: int, window: int) -> None:
    """``0 ≤ i − j ≤ window`` on the square ``[offset, offset + n)²`` in at most two slices."""
    o, w = offset, window
    if w >= n - 1:
        out.add(o, o + n, o, o + n, SliceKind.CAUSAL)
        return
    out.add(o, o + w, o, o + w, SliceKind.CAUSAL)                    # rows i < w: 0 ≤ j ≤ i
    out.add(o + w, o + n, o, o + n, SliceKind.BI_CAUSAL)             # i − w ≤ j ≤ i


def _prefix_causal(out: _Slices, offset: int, n: int, prefix: int) -> None:
    """``j ≤ max(i, prefix − 1)`` on ``[offset, offset + n)²``: a full prefix, then causal."""
    out.add(offset, offset + prefix, offset, offset + prefix, SliceKind.FULL)
    # Rows i ≥ prefix see j ≤ i: a CAUSAL slice with lk − lq = prefix.
    out.add(offset + prefix, offset + n, offset, offset + n, SliceKind.CAUSAL)
