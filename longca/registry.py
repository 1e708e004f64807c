"""One registry for every plug-in kind: kernels (``longca.kernels``) and CP strategies (``longca.cp``).

A registry maps a name to what was registered under it (a kernel adapter instance, a strategy class:
anything with a ``name``), and finds its members by importing the modules of its package on first
use, so adding one is a module that calls ``register`` and nothing else.  Optional libraries are
imported inside members, never at registration, so a missing library makes cells ``unsupported``
instead of failing import.

It looks names up and computes nothing: no measurement's cache key covers it (a member's own module
is in the key of every cell it measures, ``longca.execution.cache.fingerprint``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Members of one kind by name.  ``package`` is the package whose modules register them and
    ``path`` its ``__path__``; ``is_member_module(name)`` says which of its modules hold members
    (the others are shared machinery, imported by the members themselves)."""

    def __init__(self, kind: str, package: str, path: Iterable[str],
                 is_member_module: Callable[[str], bool]) -> None:
        self.kind = kind
        self._package = package
        self._modules = tuple(sorted(m.name for m in pkgutil.iter_modules(path) if is_member_module(m.name)))
        self._members: dict[str, T] = {}
        self._loaded = False

    def register(self, member: T) -> T:
        name = member.name
        if name in self._members:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._members[name] = member
        return member

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self._modules:
                importlib.import_module(f"{self._package}.{module}")

    def names(self) -> list[str]:
        self._load()
        return sorted(self._members)

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._members[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._members))}") from None
