"""Atomic file writes: a reader (or a Snakemake killed mid-write) sees the whole file or none of it.

Kept free of heavy imports: the thin ``run-cell`` client writes rows with it."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def write_json_atomic(row: dict[str, Any], path: str | os.PathLike) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(row, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())  # the rename must not become visible before the data
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new temporary file next to ``path``, opened for writing.  Not ``mkstemp``: its files are
    0600 whatever the umask, and rows are results others read (0644 under the usual umask 022)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:  # 48 random bits taken already: draw again
            continue
