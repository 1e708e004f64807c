"""Context-parallel (CP) strategies: one module each, one registry.

``get(name)`` returns the strategy class; ``build(name, group, options)`` an instance on a process
group.  Like kernels, a strategy that needs a missing library is still registered and reports
``Unsupported`` with the reason when planned.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

from .base import Strategy, Unsupported

_REGISTRY: dict[str, type[Strategy]] = {}
# Modules that are machinery, not strategies (everything else in this package registers some).
_MACHINERY = frozenset({"base", "blocks", "layout", "local", "comm", "ring_engine", "a2a", "sequence_parallel"})
_STRATEGY_MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                                 if m.name not in _MACHINERY and not m.name.startswith("_")))
_loaded = False


def register(cls: type[Strategy]) -> type[Strategy]:
    if cls.name in _REGISTRY:
        raise ValueError(f"CP strategy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in _STRATEGY_MODULES:
            importlib.import_module(f"{__name__}.{module}")


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get(name: str) -> type[Strategy]:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown CP strategy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def build(name: str, group=None, options: dict | None = None) -> Strategy:
    return get(name)(group, options)


def source_files(name: str) -> list[Path]:
    """The code that computes strategy ``name``'s cells: its module and the shared CP machinery."""
    here = Path(__file__).resolve().parent
    own = Path(inspect.getfile(get(name)))
    return [own] + sorted(here / f"{m}.py" for m in _MACHINERY)


__all__ = ["Strategy", "Unsupported", "register", "get", "build", "names", "source_files"]
