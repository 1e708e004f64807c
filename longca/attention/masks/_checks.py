"""Parameter checks the mask builders share: integers, positivity, clamping (MaskError names the
parameter)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import MaskError


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
