"""``longca.reference``: the public name (docs/architecture.md, "Public names") of the exact reference (``attention``), kept
for code outside this repository; it lives in ``longca.attention.reference``."""

from .attention.reference import attention  # noqa: F401
