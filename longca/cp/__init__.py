"""Context-parallel (CP) strategies: one module each, one registry.

``get(name)`` returns the strategy class; ``build(name, group, options)`` an instance on a process
group.  Like kernels, a strategy that needs a missing library is still registered and reports
``Unsupported`` with the reason when planned.
"""

from __future__ import annotations

import ast
import inspect
import pkgutil
from pathlib import Path

from ..registry import Registry
from .base import Strategy, Unsupported

_HERE = Path(__file__).resolve().parent


def _registers(module: str) -> bool:
    """Whether ``module`` of this package is a strategy module: one that registers strategies, i.e.
    imports ``register`` from here (``from . import register``), whether or not it registers one
    in this process (``testing`` does only under ``LONGCA_TEST_KERNELS=1``)."""
    tree = ast.parse((_HERE / f"{module}.py").read_text())
    return any(isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module
               and any(alias.name == "register" for alias in node.names) for node in ast.walk(tree))


# The shared CP machinery: every module of this package that registers no strategy.
_MACHINERY = frozenset(m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg and not _registers(m.name))
REGISTRY: Registry[type[Strategy]] = Registry("CP strategy", __name__, __path__,
                                              lambda module: module not in _MACHINERY and not module.startswith("_"))
register, names, get = REGISTRY.register, REGISTRY.names, REGISTRY.get


def build(name: str, group=None, options: dict | None = None) -> Strategy:
    return get(name)(group, options)


def _choices() -> dict[str, list[str]]:
    from .. import kernels
    from .layout import LAYOUTS
    from .local import LOCAL_CALLS

    return {"local_kernel": ["auto", *kernels.names()], "local_calls": list(LOCAL_CALLS),
            "layout": ["auto", *LAYOUTS]}


def option_problem(name: str, key: str, value) -> str | None:
    """Why ``value`` is not one strategy ``name``'s option ``key`` takes (for config validation, before
    any work), or None.  Names are checked against what exists; a number (a degree, a window, a
    margin) must be a whole number >= 0, 0 meaning the strategy's own choice."""
    default = get(name).options[key]
    choices = _choices().get(key)
    if choices is not None:
        return None if value in choices else f"{value!r} is not one of {', '.join(choices)}"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"{value!r} is not true or false"
    if isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"{value!r} is not a whole number >= 0"
    if isinstance(default, str) and not isinstance(value, str):
        return f"{value!r} is not a name"
    return None


def source_files(name: str) -> list[Path]:
    """The code that computes strategy ``name``'s cells: its module and the shared CP machinery."""
    own = Path(inspect.getfile(get(name)))
    return [own] + sorted(_HERE / f"{m}.py" for m in _MACHINERY)


__all__ = ["Strategy", "Unsupported", "REGISTRY", "register", "get", "build", "names", "option_problem",
           "source_files"]
