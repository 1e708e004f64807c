"""``longca.flops``: the name DESIGN.md's contract gives ``attention_flops``, kept for code outside this
repository; it lives in ``longca.attention.flops``."""

from .attention.flops import attention_flops  # noqa: F401
