"""The kernel registry: one adapter per name, one module per kernel family.

Adding a kernel = one adapter class in a module of this package (a new family = a new module,
found automatically) and one ``register`` call there; nothing else changes.  Optional libraries are imported inside
adapters, never here, so a missing library makes cells ``unsupported`` instead of failing import.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ..registry import Registry
from .base import Kernel

# Every module of this package except the shared base and private helpers (_name) is a family.
REGISTRY: Registry[Kernel] = Registry("kernel", __name__, __path__,
                                      lambda module: module != "base" and not module.startswith("_"))
register, names, get = REGISTRY.register, REGISTRY.names, REGISTRY.get


def source_file(name: str) -> Path:
    """The module that defines kernel ``name`` (part of its cells' cache key)."""
    return Path(inspect.getfile(type(get(name))))


def source_files(name: str) -> list[Path]:
    """Every file kernel ``name``'s cells depend on besides the problem's code: the module that
    defines it, the modules of this package its class inherits from (not ``base``, which is in
    every key) and the mask code it declares (a ``mask_code`` tuple of paths relative to the package root, on
    the kernels that run a pattern of their own, e.g. ``block_sparse_heads``)."""
    kernel = get(name)
    here = Path(__file__).parent
    files = [Path(inspect.getfile(cls)) for cls in type(kernel).__mro__
             if cls.__module__.startswith(__name__ + ".") and cls.__module__ != f"{__name__}.base"]
    files += [here.parent / p for p in getattr(kernel, "mask_code", ())]
    return list(dict.fromkeys(files))


__all__ = ["Kernel", "REGISTRY", "register", "get", "names", "source_file", "source_files"]
