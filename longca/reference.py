"""``longca.reference``: the name DESIGN.md's contract gives the exact reference (``attention``), kept
for code outside this repository; it lives in ``longca.attention.reference``."""

from .attention.reference import attention  # noqa: F401
