"""An optional library, imported on an adapter's first use and kept.

Never at registry load: a missing (or broken, or too old) library makes the kernel's cells
``unsupported`` with the reason, instead of failing ``import longca.kernels``.
"""

from __future__ import annotations

from typing import Any, Callable


class Unusable(Exception):
    """Raised by a loader whose library cannot serve for a reason of its own (an old release, a CPU
    build, a missing entry point or extension): the message is the whole reason."""


class Library:
    """``load()`` imports and returns what the adapter calls, once.  ``library()`` is that (None when
    it is missing); ``library.missing()`` is None or why not: an ``Unusable``'s message, or for any
    other exception ``"{what} is not importable ({exception}); {install}"``."""

    def __init__(self, load: Callable[[], Any], what: str = "", install: str = ""):
        self._load, self.what, self.install = load, what, install
        self.cache_clear()

    def cache_clear(self) -> None:
        """Forget the outcome: the next use imports again (tests that install a stand-in library)."""
        self._tried, self._value, self._error = False, None, None

    def __call__(self) -> Any:
        if not self._tried:
            self._tried = True
            try:
                self._value = self._load()
            except Unusable as exc:
                self._error = str(exc)
            except Exception as exc:  # noqa: BLE001 — ImportError, a missing name, a broken build
                self._error = f"{self.what} is not importable ({type(exc).__name__}: {exc}); {self.install}"
        return self._value

    def missing(self) -> str | None:
        self()
        return self._error
