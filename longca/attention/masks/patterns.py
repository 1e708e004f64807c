"""The 14 benchmark patterns, one small builder each, and ``build``, which resolves them by name.

``PATTERNS`` maps the 14 benchmark pattern names to one small builder each; ``build`` resolves
defaults, validates parameters and records every resolved value (window, prefix, block, seed,
documents source …) in ``AttnMask.params``.  Random choices come only from ``seed`` (see
``longca.attention.varlen``).  Besides them ``build`` knows the ``EXTRA_PATTERNS``: ``custom``
(``custom.py``) and ``block_sparse`` (``block_sparse.py``).  Rules, defaults and clamping are
documented in ``docs/masks.md``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import numpy as np

from .. import varlen
from ..errors import MaskError
from ._checks import _clamped, _is_int, _non_negative, _positive
from ._shapes import _band, _causal_band, _mask, _prefix_causal, _Slices
from .block_sparse import BLOCK_SPARSE, SPARSE_BLOCK, block_sparse
from .custom import CUSTOM, custom
from .slices import AttnMask, AttnSlice, SliceKind

# ---------------------------------------------------------------------------------------------
# Pattern builders.  Each returns non-overlapping slices (rectangles that do not even overlap as
# rectangles), built in time proportional to the number of documents or blocks.
# ---------------------------------------------------------------------------------------------

Builder = Callable[..., AttnMask]

WINDOW = 1024         # sliding-window half-width, as MagiAttention's benchmark
BLOCK = 1024          # block size of varlen_block_causal
GLOBAL_TOKENS = 64    # global tokens of global_sliding_window


def _starts(documents: tuple[int, ...]) -> list[int]:
    out, pos = [], 0
    for d in documents:
        out.append(pos)
        pos += d
    return out


def _documents(seqlen: int, seed: int, documents: Any, histogram: Any,
               long: dict[str, Any] | None = None) -> tuple[tuple[int, ...], dict[str, Any]]:
    """Resolve the documents of a document pattern and the params that record how."""
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


EXTRA_PATTERNS: dict[str, Builder] = {CUSTOM: custom, BLOCK_SPARSE: block_sparse}


def gate_seqlen(name: str, seqlen: int, target: int, params: Mapping[str, Any]) -> int:
    """The length at which the correctness gate checks a cell: ``target`` capped at
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
