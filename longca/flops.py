"""``longca.flops``: the public name (docs/architecture.md, "Public names") of ``attention_flops``, kept for code outside this
repository; it lives in ``longca.attention.flops``."""

from .attention.flops import attention_flops  # noqa: F401
