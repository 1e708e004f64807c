"""``longca.masks``: the public name (docs/architecture.md, "Public names") of the masks (``build``, ``PATTERNS``, ``AttnMask``
…), kept for code outside this repository; they live in ``longca.attention.masks``."""

from .attention.masks import PATTERNS, AttnMask, AttnSlice, MaskError, SliceKind, build, from_slices  # noqa: F401
