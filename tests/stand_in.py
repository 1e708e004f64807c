"""Stand-in libraries for the kernel adapters' CPU tests: a module path put into ``sys.modules`` (for
the test only, through ``monkeypatch``) with the names an adapter looks up, each following the real
library's documented semantics in plain torch (the tests that use them say how)."""

import sys
import types

from longca import kernels


def install_library(monkeypatch, dotted: str, **names) -> types.ModuleType:
    """``dotted`` (e.g. ``magi_attention.functional``) and each package above it as empty modules
    linked to their children; ``names`` set on the innermost one, which is returned."""
    parts = dotted.split(".")
    parent = None
    for depth in range(1, len(parts) + 1):
        module = types.ModuleType(".".join(parts[:depth]))
        monkeypatch.setitem(sys.modules, module.__name__, module)
        if parent is not None:
            setattr(parent, parts[depth - 1], module)
        parent = module
    for name, value in names.items():
        setattr(parent, name, value)
    return parent


def fresh_adapter(kernel: str):
    """A new instance of a registered kernel's adapter, which finds the stand-in (the registered one
    may have cached "missing" from an earlier test)."""
    adapter = type(kernels.get(kernel))()
    assert adapter.available() is None, adapter.available()
    return adapter
