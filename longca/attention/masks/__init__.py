"""Attention masks as lists of rectangular slices.

Every kernel and CP strategy reads a mask from one representation: an ``AttnMask`` made of
non-overlapping ``AttnSlice`` rectangles, each FULL, CAUSAL, INV_CAUSAL or BI_CAUSAL inside its
rectangle (the convention of MagiAttention's ``AttnMaskType``).  Patterns are built as slices and
never by materialising a ``seqlen × seqlen`` matrix, so building a 1M-token mask costs as much as
its number of documents, not its area.

One module per idea, imports running one way (``slices`` ← ``_shapes`` ← builders ← ``patterns``):

* ``slices``       — ``SliceKind``, ``AttnSlice``, ``AttnMask``, exact areas, ``check_disjoint``;
* ``patterns``     — the 14 ``PATTERNS`` (one small builder each), ``build``, ``pattern_params``,
  ``gate_seqlen``;
* ``custom``       — ``from_slices`` and the ``custom`` pattern (a config slice list);
* ``block_sparse`` — random tiles at a given density, for block-sparse kernels;
* ``_shapes`` / ``_checks`` — what the builders share: slice lists, bands, prefixes; parameter
  checks.

``MaskError`` lives in ``longca.attention.errors`` (``varlen`` raises it too) and is re-exported
here.  Rules, defaults and clamping are documented in ``docs/masks.md``.
"""

from ..errors import MaskError
from .block_sparse import BLOCK_SPARSE, SPARSE_BLOCK, block_sparse
from .custom import CUSTOM, custom, from_slices
from .head_blocks import (  # noqa: F401
    BLOCK_SPARSE_HEADS, GATE_MULTIPLE, HEAD_PATTERNS, VARIABLE_BLOCK_SPARSE_HEADS, HeadBlockMask,
    VariableBlockMask, block_sparse_heads, kernel_takes, variable_block_sparse_heads)
from .patterns import (
    BLOCK,
    DOCUMENT_PATTERNS,
    EXTRA_PATTERNS,
    GLOBAL_TOKENS,
    PATTERNS,
    WINDOW,
    Builder,
    build,
    causal,
    causal_blockwise,
    full,
    gate_seqlen,
    global_sliding_window,
    pattern_params,
    prefix_lm_causal,
    prefix_lm_varlen,
    shared_question,
    sliding_window,
    sliding_window_causal,
    varlen_block_causal,
    varlen_causal,
    varlen_causal_long,
    varlen_full,
    varlen_full_long,
)
from .slices import AttnMask, AttnSlice, SliceKind, check_disjoint

__all__ = [
    "BLOCK", "BLOCK_SPARSE", "CUSTOM", "DOCUMENT_PATTERNS", "EXTRA_PATTERNS", "GLOBAL_TOKENS", "PATTERNS",
    "SPARSE_BLOCK", "WINDOW", "AttnMask", "AttnSlice", "Builder", "MaskError", "SliceKind", "block_sparse",
    "build", "causal", "causal_blockwise", "check_disjoint", "custom", "from_slices", "full", "gate_seqlen",
    "global_sliding_window", "pattern_params", "prefix_lm_causal", "prefix_lm_varlen", "shared_question",
    "sliding_window", "sliding_window_causal", "varlen_block_causal", "varlen_causal", "varlen_causal_long",
    "varlen_full", "varlen_full_long",
]
