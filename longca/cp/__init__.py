"""Context-parallel (CP) strategies: one module each, one registry.

``get(name)`` returns the strategy class; ``build(name, group, options)`` an instance on a process
group.  Like kernels, a strategy that needs a missing library is still registered and reports
``Unsupported`` with the reason when planned.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ..registry import Registry
from .base import Strategy, Unsupported

# Modules that are machinery, not strategies (everything else in this package registers some).
_MACHINERY = frozenset({"base", "blocks", "layout", "local", "fused", "comm", "ring_engine", "a2a",
                        "sequence_parallel"})
REGISTRY: Registry[type[Strategy]] = Registry("CP strategy", __name__, __path__,
                                              lambda module: module not in _MACHINERY and not module.startswith("_"))
register, names, get = REGISTRY.register, REGISTRY.names, REGISTRY.get


def build(name: str, group=None, options: dict | None = None) -> Strategy:
    return get(name)(group, options)


def source_files(name: str) -> list[Path]:
    """The code that computes strategy ``name``'s cells: its module and the shared CP machinery."""
    here = Path(__file__).resolve().parent
    own = Path(inspect.getfile(get(name)))
    return [own] + sorted(here / f"{m}.py" for m in _MACHINERY)


__all__ = ["Strategy", "Unsupported", "REGISTRY", "register", "get", "build", "names", "source_files"]
