"""The kernel registry: one adapter per name, one module per kernel family.

Adding a kernel = one adapter class in a module of this package (a new family = a new module,
found automatically) and one ``register`` call there; nothing else changes.  Optional libraries are imported inside
adapters, never here, so a missing library makes cells ``unsupported`` instead of failing import.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

from .base import Kernel

_REGISTRY: dict[str, Kernel] = {}
# Every module of this package except the shared base and private helpers (_name) is a family.
_FAMILIES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                          if m.name != "base" and not m.name.startswith("_")))
_loaded = False


def register(kernel: Kernel) -> Kernel:
    if kernel.name in _REGISTRY:
        raise ValueError(f"kernel {kernel.name!r} registered twice")
    _REGISTRY[kernel.name] = kernel
    return kernel


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for family in _FAMILIES:
            importlib.import_module(f"{__name__}.{family}")


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get(name: str) -> Kernel:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def source_file(name: str) -> Path:
    """The module that defines kernel ``name`` (part of its cells' cache key)."""
    return Path(inspect.getfile(type(get(name))))


__all__ = ["Kernel", "register", "get", "names", "source_file"]
