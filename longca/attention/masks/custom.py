"""Custom masks from a slice list: ``from_slices`` (any ``seqlen_q × seqlen_k`` rectangle) and the
``custom`` pattern of the config (a slice list at a base length, scaled along the seqlen axis)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import MaskError
from ._checks import _is_int, _positive
from .slices import AttnMask, AttnSlice, SliceKind, check_disjoint

# ---------------------------------------------------------------------------------------------
# Custom masks from a slice list (config: ``[[q_start, q_end, k_start, k_end, kind], ...]``).
# ---------------------------------------------------------------------------------------------

def _parse_slice(k: int, item: Any, seqlen_q: int, seqlen_k: int) -> AttnSlice:
    if isinstance(item, AttnSlice):
        item = item.as_tuple()
    if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 5:
        raise MaskError(f"slices[{k}]: expected [q_start, q_end, k_start, k_end, kind], "
                        f"got {item!r}")
    qs, qe, ks, ke, kind = item
    for field_name, v in (("q_start", qs), ("q_end", qe), ("k_start", ks), ("k_end", ke)):
        if not _is_int(v):
            raise MaskError(f"slices[{k}]: {field_name} must be an integer, got {v!r}")
    if not 0 <= qs < qe <= seqlen_q:
        raise MaskError(f"slices[{k}]: query range [{qs}, {qe}) is empty or outside "
                        f"[0, {seqlen_q})")
    if not 0 <= ks < ke <= seqlen_k:
        raise MaskError(f"slices[{k}]: key range [{ks}, {ke}) is empty or outside "
                        f"[0, {seqlen_k})")
    try:
        kind = SliceKind(kind.lower() if isinstance(kind, str) else kind)
    except ValueError:
        raise MaskError(f"slices[{k}]: unknown kind {kind!r}; known: "
                        f"{', '.join(x.value for x in SliceKind)}") from None
    s = AttnSlice(int(qs), int(qe), int(ks), int(ke), kind)
    if s.area() == 0:
        raise MaskError(f"slices[{k}]: {kind.value} slice of {s.lq} queries × {s.lk} keys "
                        "attends no pair (bi_causal needs lk >= lq)")
    return s


def from_slices(name: str, seqlen_q: int, seqlen_k: int, slices: Sequence[Any], *,
                params: Mapping[str, Any] | None = None) -> AttnMask:
    """A custom mask from ``[q_start, q_end, k_start, k_end, kind]`` items (or AttnSlices).

    Ranges are half-open; kind is one of full, causal, inv_causal, bi_causal.  Every slice must
    lie inside the ``seqlen_q × seqlen_k`` rectangle, attend at least one pair, and share no
    attended pair with another slice (MaskError names the slice index)."""
    if not isinstance(name, str) or not name:
        raise MaskError(f"name must be a non-empty string, got {name!r}")
    if not _is_int(seqlen_q) or seqlen_q <= 0:
        raise MaskError(f"seqlen_q must be a positive integer, got {seqlen_q!r}")
    if not _is_int(seqlen_k) or seqlen_k <= 0:
        raise MaskError(f"seqlen_k must be a positive integer, got {seqlen_k!r}")
    if isinstance(slices, (str, bytes)) or not isinstance(slices, Sequence) or not slices:
        raise MaskError(f"slices must be a non-empty list of [q_start, q_end, k_start, k_end, "
                        f"kind], got {slices!r}")
    parsed = tuple(_parse_slice(k, item, seqlen_q, seqlen_k) for k, item in enumerate(slices))
    check_disjoint(parsed)
    return AttnMask(name, int(seqlen_q), int(seqlen_k), parsed, None, dict(params or {}))


CUSTOM = "custom"


def custom(seqlen: int, *, seed: int = 0, slices: Sequence[Any] = (), base_seqlen: int | None = None,
           **unknown: Any) -> AttnMask:
    """A user's mask from config: ``slices`` given at ``base_seqlen`` tokens (default: the largest
    slice end), scaled to ``seqlen`` by multiplying every coordinate by ``seqlen / base_seqlen``.

    So one custom mask is a *shape* that runs along the seqlen axis like the built-in patterns, and
    the correctness gate can check it at a smaller multiple of its base length.  ``seqlen`` must be
    a multiple of ``base_seqlen``.  CAUSAL slices stay bottom-right aligned after scaling."""
    if unknown:
        raise MaskError(f"mask 'custom': unknown parameter(s) {', '.join(sorted(unknown))}; "
                        "accepted: slices, base_seqlen")
    if not _is_int(seqlen) or seqlen <= 0:
        raise MaskError(f"seqlen must be a positive integer, got {seqlen!r}")
    if isinstance(slices, (str, bytes)) or not isinstance(slices, Sequence) or not slices:
        raise MaskError(f"slices must be a non-empty list of [q_start, q_end, k_start, k_end, "
                        f"kind], got {slices!r}")
    if base_seqlen is None:
        ends = [v for item in slices if isinstance(item, Sequence) and len(item) == 5
                for v in (item[1], item[3]) if _is_int(v)]
        base_seqlen = max(ends, default=0)
    base = _positive("base_seqlen", base_seqlen)
    shape = from_slices(CUSTOM, base, base, slices)  # validates ranges, kinds and overlaps
    if seqlen % base:
        raise MaskError(f"custom mask: seqlen {seqlen} is not a multiple of base_seqlen {base}")
    f = seqlen // base
    scaled = [AttnSlice(s.q_start * f, s.q_end * f, s.k_start * f, s.k_end * f, s.kind)
              for s in shape.slices]
    if f > 1:
        check_disjoint(scaled)
    params = {"base_seqlen": base, "scale": f, "seed": int(seed),
              "slices": [list(s.as_tuple()) for s in shape.slices]}
    return AttnMask(CUSTOM, int(seqlen), int(seqlen), tuple(scaled), None, params)
