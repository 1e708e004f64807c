"""The correctness gate's mask: a cell's pattern at the gate's short length, its structure kept.

The gate compares a kernel with an exact reference on a short problem (``gate_seqlen`` tokens), so
the reference stays affordable.  Rebuilt at that length with its default parameters a pattern can
lose what makes it a pattern: a 1,024-token window covers a 1,024-token sequence (the mask is
``full``), the seeded documents of a short sequence are one document (``varlen_causal`` is
``causal``).  A kernel that mishandles windows, global tokens, blocks, prefixes or document
boundaries would then pass.  So the gate's mask keeps the full-size mask's shape:

* lengths (window, global tokens, block, prefix) are scaled by ``gate / seqlen`` and then held
  inside the range where they still shape the mask (a window below a quarter of the sequence,
  a prefix that is neither empty nor everything, a block shorter than the longest document);
* documents are the full-size mask's, scaled; when fewer than ``MIN_DOCUMENTS`` survive, the gate
  uses ``MIN_DOCUMENTS`` documents of uneven lengths whose boundaries fall inside kernel tiles;
* ``full`` and ``causal`` have nothing to keep; ``custom``, ``block_sparse`` and
  ``block_sparse_heads`` already keep their shape at a multiple of their base length or block
  (``gate_seqlen``; config holds a ``block_sparse_heads`` gate length to a multiple of its block);
  ``variable_block_sparse_heads`` keeps its unit and kept fraction, with mean tiles that still
  vary at the gate's length (``variable_gate_params``).

``gate_params`` returns the parameters to build the pattern with at the gate length;
``tests/test_gate_masks.py`` holds every pattern to "never full or causal unless it is one".
"""

from __future__ import annotations

from typing import Any, Callable

from .block_sparse import BLOCK_SPARSE
from .custom import CUSTOM
from .head_blocks import BLOCK_SPARSE_HEADS, VARIABLE_BLOCK_SPARSE_HEADS, variable_gate_params
from .patterns import DOCUMENT_PATTERNS
from .slices import AttnMask

MIN_DOCUMENTS = 3
# Uneven shares of the gate's length for its documents when the full-size mask has too few.
FALLBACK_SHARES = (0.41, 0.34, 0.25)
# Kernels tile queries and keys by 64 or 128 (16 for the smallest); a boundary on a multiple of
# this would be checked only where tiles line up with it.
TILE = 16


def _scaled(value: int, ratio: float) -> int:
    return int(round(value * ratio))


def _inside(value: int, low: int, high: int) -> int:
    return max(min(value, high), min(low, high))


def _off_tile(boundary: int) -> int:
    return boundary + 3 if boundary % TILE == 0 else boundary


def gate_documents(mask: AttnMask, n: int) -> list[int]:
    """Document lengths for the gate: the mask's documents scaled to ``n`` tokens (boundaries
    rounded, documents that vanish dropped), or uneven fallback documents if fewer than
    ``MIN_DOCUMENTS`` remain.  The first document stays first (a question stays the question)."""
    ratio = n / mask.seqlen_q
    bounds, position = [], 0
    for length in mask.documents or (mask.seqlen_q,):
        position += length
        bounds.append(min(_scaled(position, ratio), n))
    bounds[-1] = n
    cut = sorted({b for b in bounds if 0 < b < n})
    if len(cut) + 1 < MIN_DOCUMENTS:
        cut, share = [], 0.0
        for fraction in FALLBACK_SHARES[:-1]:
            share += fraction
            cut.append(_off_tile(int(share * n)))
    edges = [0, *cut, n]
    return [b - a for a, b in zip(edges, edges[1:]) if b > a]


def _window(value: int, ratio: float, room: int) -> int:
    # At least a sixty-fourth of the sequence (a band several tokens wide), at most a quarter (so
    # the band never covers the sequence).
    return _inside(_scaled(value, ratio), max(2, room // 64), max(1, room // 4))


# Per parameter: how its full-size value becomes the gate's, from (value, ratio, n, documents).
SCALERS: dict[str, Callable[[int, float, int, list[int]], int]] = {
    "window": lambda w, r, n, docs: _window(w, r, n),
    "global_tokens": lambda g, r, n, docs: _inside(_scaled(g, r), max(1, n // 128), max(1, n // 8)),
    # A block shorter than the longest document, or every document is one block (block diagonal).
    "block": lambda b, r, n, docs: _inside(_scaled(b, r), 2, max(2, max(docs) // 3)),
}


def _prefix(pattern: str, value: int, ratio: float, n: int, docs: list[int]) -> int:
    # Neither 0/1 (causal) nor the whole span (full): inside [an eighth, seven eighths].
    span = max(docs) if pattern == "prefix_lm_varlen" else n
    return _inside(_scaled(value, ratio), max(2, span // 8), max(2, span - span // 8))


# Patterns that keep their shape at any multiple of their base length or block: the gate builds
# them with these parameters of the cell's mask (a per-head pattern keeps its heads too).
KEPT_AT_GATE: dict[str, tuple[str, ...]] = {
    CUSTOM: ("slices", "base_seqlen"),
    BLOCK_SPARSE: ("block", "density", "causal"),
    BLOCK_SPARSE_HEADS: ("kept", "block", "heads", "group"),
}


# Patterns with a rule of their own: (the cell's mask, the gate's length) → parameters.
REBUILT_AT_GATE: dict[str, Callable[[Any, int], dict[str, Any]]] = {
    VARIABLE_BLOCK_SPARSE_HEADS: variable_gate_params,
}


def gate_params(pattern: str, mask: AttnMask, n: int) -> dict[str, Any]:
    """The parameters to build ``pattern`` with at ``n`` tokens so that it keeps the shape of
    ``mask`` (the cell's full-size mask, its resolved parameters in ``mask.params``)."""
    if pattern in REBUILT_AT_GATE:
        return REBUILT_AT_GATE[pattern](mask, n)
    if pattern in KEPT_AT_GATE:
        return {k: mask.params[k] for k in KEPT_AT_GATE[pattern] if k in mask.params}
    ratio = n / mask.seqlen_q
    params: dict[str, Any] = {}
    docs = [n]
    if pattern in DOCUMENT_PATTERNS:
        docs = gate_documents(mask, n)
        params["documents"] = docs
    if pattern == "global_sliding_window":
        params["global_tokens"] = SCALERS["global_tokens"](mask.params["global_tokens"], ratio, n, docs)
        params["window"] = _window(mask.params["window"], ratio, n - params["global_tokens"])
    else:
        for name, scale in SCALERS.items():
            if name in mask.params:
                params[name] = scale(mask.params[name], ratio, n, docs)
    if "prefix" in mask.params:
        params["prefix"] = _prefix(pattern, mask.params["prefix"], ratio, n, docs)
    return params
