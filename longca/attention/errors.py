"""The one error type of the attention model's input.

Masks, document sampling and mask conversion all raise ``MaskError``; it lives in this leaf module,
which imports nothing, so that ``masks`` and ``varlen`` both import it at module top and the
imports run one way: ``errors`` ← ``varlen`` ← ``masks`` (re-exported as
``longca.attention.masks.MaskError``).
"""

from __future__ import annotations


class MaskError(ValueError):
    """Bad mask input; the message names the offending parameter."""
