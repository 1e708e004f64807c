"""The store: every measured part of every kernel cell, kept by its key, never deleted by a run.

A cell's row is composed from its parts (``longca.execution.cache.parts``): the gate's verdict,
the timing and the memory.  Each part is written here as soon as it is measured, under
``results/store/<part>/<key>.json``, outside the files Snakemake owns (Snakemake deletes a job's
outputs before it runs it again, and every output of a failed job).  A cell asked to run again
measures only the parts whose key it does not find: a fix to the gate re-runs gates on the
existing timings, a job lost to ``scancel`` or a time limit loses no finished part, and
``scripts/restore_cells.py`` puts published timings here so that a republication measures only
what changed.  To measure a part again whatever its key, remove its folder (``rm -r
results/store/time``).

Free of heavy imports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ... import run_dir
from .atomic import write_json_atomic

# The Snakefile points measuring processes at the run's store (absolute, whatever their cwd).
STORE_ENV = "LONGCA_STORE"
DEFAULT = Path(run_dir.STORE)


class Store:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, part: str, key: str) -> Path:
        return self.root / part / key[:2] / f"{key}.json"

    def get(self, part: str, key: str) -> dict[str, Any] | None:
        """The stored value of ``part`` under ``key``, or None (absent or unreadable)."""
        try:
            return json.loads(self.path(part, key).read_text())["value"]
        except (OSError, ValueError, KeyError):
            return None

    def put(self, part: str, key: str, value: dict[str, Any], settings: dict[str, Any], fingerprint: str) -> None:
        """Keep ``value`` with what it was measured with (atomically: a reader sees all or nothing)."""
        record = {"part": part, "key": key, "settings": settings, "fingerprint": fingerprint, "value": value}
        write_json_atomic(record, self.path(part, key))


def root_from_env() -> str | None:
    """Where the run's store is, if the workflow named one (``STORE_ENV``).  A client sends it with
    each cell, so that a long-lived measuring process serves whichever run asks."""
    return os.environ.get(STORE_ENV) or None


def at(root: str | os.PathLike | None) -> Store | None:
    """The store at ``root``; None (no root): measure everything."""
    return Store(root) if root else None


def from_env() -> Store | None:
    return at(root_from_env())
