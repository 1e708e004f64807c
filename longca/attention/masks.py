"""Attention masks as lists of rectangular slices.

Every kernel and CP strategy reads a mask from one representation: an ``AttnMask`` made of
non-overlapping ``AttnSlice`` rectangles, each FULL, CAUSAL, INV_CAUSAL or BI_CAUSAL inside its
rectangle (the convention of MagiAttention's ``AttnMaskType``).  Patterns are built as slices and
never by materialising a ``seqlen × seqlen`` matrix, so building a 1M-token mask costs as much as
its number of documents, not its area.

Inside a slice with local query index ``i`` (``0 ≤ i < lq``) and local key index ``j``
(``0 ≤ j < lk``):

* ``FULL``        — every pair;
* ``CAUSAL``      — ``j ≤ i + (lk − lq)``  (bottom-right aligned, as flash-attn ≥ 2.1);
* ``INV_CAUSAL``  — ``j ≥ i``              (top-left aligned);
* ``BI_CAUSAL``   — both of the above: ``i ≤ j ≤ i + (lk − lq)``, a band of width ``lk − lq + 1``.

``PATTERNS`` maps the 14 benchmark pattern names to one small builder each; ``build`` resolves
defaults, validates parameters and records every resolved value (window, prefix, block, seed,
documents source …) in ``AttnMask.params``.  Random choices come only from ``seed`` (see
``longca.attention.varlen``).  ``from_slices`` builds a custom mask from a config slice list.  Rules,
defaults and clamping are documented in ``docs/masks.md``.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch


class MaskError(ValueError):
    """Bad mask input; the message names the offending parameter."""


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


# ---------------------------------------------------------------------------------------------
# Pattern builders.  Each returns non-overlapping slices (rectangles that do not even overlap as
# rectangles), built in time proportional to the number of documents or blocks.
# ---------------------------------------------------------------------------------------------

Builder = Callable[..., AttnMask]

WINDOW = 1024         # sliding-window half-width, as MagiAttention's benchmark
BLOCK = 1024          # block size of varlen_block_causal
GLOBAL_TOKENS = 64    # global tokens of global_sliding_window


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _positive(name: str, value: Any) -> int:
    if not _is_int(value) or value <= 0:
        raise MaskError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _non_negative(name: str, value: Any) -> int:
    if not _is_int(value) or value < 0:
        raise MaskError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _clamped(params: dict[str, Any], name: str, value: int, limit: int) -> int:
    """Clamp ``value`` to ``limit`` (beyond it the mask no longer changes); record both."""
    used = min(value, limit)
    params[name] = used
    if used != value:
        params[f"{name}_requested"] = value
    return used


class _Slices(list):
    """A slice list that drops empty rectangles, so builders need no edge-case branches."""

    def add(self, q_start: int, q_end: int, k_start: int, k_end: int, kind: SliceKind) -> None:
        if q_end > q_start and k_end > k_start:
            self.append(AttnSlice(q_start, q_end, k_start, k_end, kind))


def _mask(name: str, seqlen: int, slices: list[AttnSlice], params: dict[str, Any],
          documents: tuple[int, ...] | None = None) -> AttnMask:
    return AttnMask(name, seqlen, seqlen, tuple(slices), documents, params)


def _starts(documents: tuple[int, ...]) -> list[int]:
    out, pos = [], 0
    for d in documents:
        out.append(pos)
        pos += d
    return out


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


def _documents(seqlen: int, seed: int, documents: Any, histogram: Any,
               long: dict[str, Any] | None = None) -> tuple[tuple[int, ...], dict[str, Any]]:
    """Resolve the documents of a document pattern and the params that record how."""
    from longca.attention import varlen  # imported here: varlen imports MaskError from this module

    params: dict[str, Any] = {"seed": seed}
    if documents is not None:
        if histogram is not None:
            raise MaskError("give either documents or histogram, not both")
        docs = varlen.check_documents(documents, seqlen)
        params["distribution"] = "explicit"
    else:
        if histogram is None:
            params["histogram"] = "default"
        elif isinstance(histogram, Mapping):
            params["histogram"] = dict(histogram)
        elif isinstance(histogram, varlen.Histogram):
            params["histogram"] = histogram.as_dict()
        else:
            params["histogram"] = str(histogram)
        if long is None:
            docs = varlen.sample_documents(seqlen, seed=seed, histogram=histogram)
            params["distribution"] = "histogram"
        else:
            docs = varlen.long_mixture(seqlen, seed=seed, histogram=histogram, **long)
            params["distribution"] = "long_mixture"
            params.update(long)
    params["num_documents"] = len(docs)
    return docs, params


def full(seqlen: int, *, seed: int = 0) -> AttnMask:
    """Every query attends every key."""
    return AttnMask("full", seqlen, seqlen, (AttnSlice(0, seqlen, 0, seqlen, SliceKind.FULL),),
                    params={"seed": seed})


def causal(seqlen: int, *, seed: int = 0) -> AttnMask:
    """Query i attends keys j ≤ i."""
    return AttnMask("causal", seqlen, seqlen, (AttnSlice(0, seqlen, 0, seqlen, SliceKind.CAUSAL),),
                    params={"seed": seed})


def sliding_window(seqlen: int, *, seed: int = 0, window: int = WINDOW) -> AttnMask:
    """``|i − j| ≤ window``; a window ≥ seqlen − 1 is clamped (the mask is then full)."""
    params: dict[str, Any] = {"seed": seed}
    w = _clamped(params, "window", _positive("window", window), max(seqlen - 1, 0))
    out = _Slices()
    _band(out, 0, seqlen, w)
    return _mask("sliding_window", seqlen, out, params)


def sliding_window_causal(seqlen: int, *, seed: int = 0, window: int = WINDOW) -> AttnMask:
    """``0 ≤ i − j ≤ window``; a window ≥ seqlen − 1 is clamped (the mask is then causal)."""
    params: dict[str, Any] = {"seed": seed}
    w = _clamped(params, "window", _positive("window", window), max(seqlen - 1, 0))
    out = _Slices()
    _causal_band(out, 0, seqlen, w)
    return _mask("sliding_window_causal", seqlen, out, params)


def _varlen(name: str, kind: SliceKind, seqlen: int, seed: int, documents: Any, histogram: Any,
            long: dict[str, Any] | None = None) -> AttnMask:
    docs, params = _documents(seqlen, seed, documents, histogram, long)
    out = _Slices()
    for start, length in zip(_starts(docs), docs):
        out.add(start, start + length, start, start + length, kind)
    return _mask(name, seqlen, out, params, docs)


def varlen_full(seqlen: int, *, seed: int = 0, documents: Any = None, histogram: Any = None
                ) -> AttnMask:
    """Packed documents, each attending all of itself (block diagonal)."""
    return _varlen("varlen_full", SliceKind.FULL, seqlen, seed, documents, histogram)


def varlen_causal(seqlen: int, *, seed: int = 0, documents: Any = None, histogram: Any = None
                  ) -> AttnMask:
    """Packed documents, causal within each."""
    return _varlen("varlen_causal", SliceKind.CAUSAL, seqlen, seed, documents, histogram)


def _long(long_fraction: float, long_min: int, long_max: int) -> dict[str, Any]:
    return {"long_fraction": long_fraction, "long_min": long_min, "long_max": long_max}


def varlen_full_long(seqlen: int, *, seed: int = 0, documents: Any = None, histogram: Any = None,
                     long_fraction: float = 0.6, long_min: int = 8192, long_max: int = 30720
                     ) -> AttnMask:
    """``varlen_full`` over the long-document mixture (see ``varlen.long_mixture``)."""
    return _varlen("varlen_full_long", SliceKind.FULL, seqlen, seed, documents, histogram,
                   _long(long_fraction, long_min, long_max))


def varlen_causal_long(seqlen: int, *, seed: int = 0, documents: Any = None,
                       histogram: Any = None, long_fraction: float = 0.6, long_min: int = 8192,
                       long_max: int = 30720) -> AttnMask:
    """``varlen_causal`` over the long-document mixture (see ``varlen.long_mixture``)."""
    return _varlen("varlen_causal_long", SliceKind.CAUSAL, seqlen, seed, documents, histogram,
                   _long(long_fraction, long_min, long_max))


def shared_question(seqlen: int, *, seed: int = 0, documents: Any = None, histogram: Any = None
                    ) -> AttnMask:
    """Document 0 is a question (causal); every later document sees all of it, and itself
    causally (several answers sharing one question, as in RLHF / reward-model packing)."""
    docs, params = _documents(seqlen, seed, documents, histogram)
    out = _Slices()
    q_len = docs[0]
    out.add(0, q_len, 0, q_len, SliceKind.CAUSAL)
    out.add(q_len, seqlen, 0, q_len, SliceKind.FULL)  # one slice: all answers × the question
    for start, length in list(zip(_starts(docs), docs))[1:]:
        out.add(start, start + length, start, start + length, SliceKind.CAUSAL)
    return _mask("shared_question", seqlen, out, params, docs)


def causal_blockwise(seqlen: int, *, seed: int = 0, documents: Any = None, histogram: Any = None
                     ) -> AttnMask:
    """Causal within each document; the last document sees every earlier token (j ≤ i)."""
    docs, params = _documents(seqlen, seed, documents, histogram)
    out = _Slices()
    starts = _starts(docs)
    for start, length in list(zip(starts, docs))[:-1]:
        out.add(start, start + length, start, start + length, SliceKind.CAUSAL)
    # Last document: j ≤ i over all keys is one bottom-right aligned CAUSAL slice.
    out.add(starts[-1], seqlen, 0, seqlen, SliceKind.CAUSAL)
    return _mask("causal_blockwise", seqlen, out, params, docs)


def _seeded_fraction(seed: int) -> float:
    """A fraction in [0.25, 0.75) drawn from the seed's parameter stream."""
    from longca.attention import varlen

    return 0.25 + 0.5 * float(varlen.rng(seed, varlen.STREAM_PARAMS).random())


def prefix_lm_causal(seqlen: int, *, seed: int = 0, prefix: int | None = None) -> AttnMask:
    """``j ≤ max(i, prefix − 1)``: a bidirectional prefix, causal afterwards.

    Default prefix: ``floor(f · seqlen)`` with ``f`` seeded in [0.25, 0.75); a prefix > seqlen is
    clamped (the mask is then full); ``prefix = 0`` is plain causal."""
    params: dict[str, Any] = {"seed": seed}
    if prefix is None:
        params["prefix_fraction"] = f = _seeded_fraction(seed)
        prefix = int(f * seqlen)
    p = _clamped(params, "prefix", _non_negative("prefix", prefix), seqlen)
    out = _Slices()
    _prefix_causal(out, 0, seqlen, p)
    return _mask("prefix_lm_causal", seqlen, out, params)


def prefix_lm_varlen(seqlen: int, *, seed: int = 0, prefix: int | None = None,
                     documents: Any = None, histogram: Any = None) -> AttnMask:
    """Per document: ``lj ≤ max(li, p_d − 1)`` with ``p_d = min(prefix, document length)``.

    Default prefix: ``max(1, floor(f · median document length))``, ``f`` seeded in [0.25, 0.75)
    (a fraction of seqlen would exceed most documents and make them all bidirectional)."""
    docs, params = _documents(seqlen, seed, documents, histogram)
    if prefix is None:
        params["prefix_fraction"] = f = _seeded_fraction(seed)
        prefix = max(1, int(f * float(np.median(docs))))
    p = _clamped(params, "prefix", _non_negative("prefix", prefix), max(docs))
    out = _Slices()
    for start, length in zip(_starts(docs), docs):
        _prefix_causal(out, start, length, min(p, length))
    return _mask("prefix_lm_varlen", seqlen, out, params, docs)


def global_sliding_window(seqlen: int, *, seed: int = 0, window: int = WINDOW,
                          global_tokens: int = GLOBAL_TOKENS) -> AttnMask:
    """``i < g or j < g or |i − j| ≤ window`` (Longformer-style global tokens at the start).

    ``global_tokens`` is clamped to seqlen, ``window`` to the remaining length − 1."""
    params: dict[str, Any] = {"seed": seed}
    g = _clamped(params, "global_tokens", _non_negative("global_tokens", global_tokens), seqlen)
    w = _clamped(params, "window", _positive("window", window), max(seqlen - g - 1, 0))
    out = _Slices()
    out.add(0, g, 0, seqlen, SliceKind.FULL)        # global queries see everything
    out.add(g, seqlen, 0, g, SliceKind.FULL)        # every query sees the global keys
    _band(out, g, seqlen - g, w)                    # the band is translation invariant
    return _mask("global_sliding_window", seqlen, out, params)


def varlen_block_causal(seqlen: int, *, seed: int = 0, block: int = BLOCK,
                        documents: Any = None, histogram: Any = None) -> AttnMask:
    """Per document: ``⌊lj / block⌋ ≤ ⌊li / block⌋`` (block-causal, e.g. video frames).

    Blocks restart at each document; a document's last block may be partial, so neither
    seqlen nor the document lengths need to be multiples of ``block``."""
    block = _positive("block", block)
    docs, params = _documents(seqlen, seed, documents, histogram)
    params["block"] = block
    out = _Slices()
    for start, length in zip(_starts(docs), docs):
        for b0 in range(0, length, block):
            b1 = min(b0 + block, length)
            out.add(start + b0, start + b1, start, start + b1, SliceKind.FULL)
    return _mask("varlen_block_causal", seqlen, out, params, docs)


PATTERNS: dict[str, Builder] = {
    "full": full,
    "causal": causal,
    "sliding_window": sliding_window,
    "sliding_window_causal": sliding_window_causal,
    "varlen_full": varlen_full,
    "varlen_causal": varlen_causal,
    "varlen_full_long": varlen_full_long,
    "varlen_causal_long": varlen_causal_long,
    "shared_question": shared_question,
    "causal_blockwise": causal_blockwise,
    "prefix_lm_causal": prefix_lm_causal,
    "prefix_lm_varlen": prefix_lm_varlen,
    "global_sliding_window": global_sliding_window,
    "varlen_block_causal": varlen_block_causal,
}

DOCUMENT_PATTERNS = frozenset(n for n, b in PATTERNS.items()
                              if "documents" in inspect.signature(b).parameters)


def pattern_params(name: str) -> tuple[str, ...]:
    """The parameter names pattern ``name`` accepts (besides seqlen and seed)."""
    if name not in PATTERNS:
        raise MaskError(f"unknown mask pattern {name!r}; known: {', '.join(sorted(PATTERNS))}")
    return tuple(p for p in inspect.signature(PATTERNS[name]).parameters
                 if p not in ("seqlen", "seed"))


def build(name: str, seqlen: int, *, seed: int = 0, **params: Any) -> AttnMask:
    """Build pattern ``name`` at ``seqlen`` tokens; ``params`` override the pattern's defaults.

    Besides the 14 ``PATTERNS``, ``EXTRA_PATTERNS`` holds ``custom`` (a user's slice list) and
    ``block_sparse`` (random blocks at a given density, for block-sparse kernels)."""
    if name in EXTRA_PATTERNS:
        return EXTRA_PATTERNS[name](seqlen, seed=seed, **params)
    known = pattern_params(name)
    if not _is_int(seqlen) or seqlen <= 0:
        raise MaskError(f"seqlen must be a positive integer, got {seqlen!r}")
    if not _is_int(seed) or seed < 0:
        raise MaskError(f"seed must be a non-negative integer, got {seed!r}")
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise MaskError(f"mask {name!r}: unknown parameter(s) {', '.join(unknown)}; "
                        f"accepted: {', '.join(known) or 'none'}")
    return PATTERNS[name](int(seqlen), seed=int(seed), **params)


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


def gate_seqlen(name: str, seqlen: int, target: int, params: Mapping[str, Any]) -> int:
    """The length of the reduced problem the correctness gate checks: ``target`` capped at
    ``seqlen``, rounded down to a multiple of a custom mask's base length or a block-sparse
    mask's block."""
    n = min(int(target), int(seqlen))
    if name == CUSTOM:
        base = params.get("base_seqlen") or custom(seqlen, **params).params["base_seqlen"]
        n = max(base, n // base * base)
    elif name == BLOCK_SPARSE:
        block = params.get("block", SPARSE_BLOCK)
        n = max(block, n // block * block)
    return n


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
    from .varlen import STREAM_PARAMS, rng  # local: varlen imports this module

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


EXTRA_PATTERNS: dict[str, Builder] = {CUSTOM: custom, BLOCK_SPARSE: block_sparse}
