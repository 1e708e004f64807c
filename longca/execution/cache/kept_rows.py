"""Kept rows: a copy of every row a cell writes, outside what Snakemake may delete.

When a job fails, Snakemake deletes the outputs of every job in it, the cells that had already
finished included: a SLURM group of kernel cells that is cancelled or hits its time limit would
lose all its work.  So each cell also writes its row under ``results/kept/`` (the same relative
path as under ``results/cells/``) together with the settings and the code fingerprint it was
measured with, and a cell asked to run again first looks there: a row of the same settings and
code is written back instead of measured again.  A change of settings or code still re-measures
(Snakemake reruns the cell because its params changed, and the kept row no longer matches).
A run that succeeds drops the copies whose cell files exist (``release``): kept rows stand only
between a failed run and the next, so ``--forcerun`` after a good run measures again.

Free of heavy imports: the thin ``run-cell`` client uses it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ... import run_dir
from .atomic import write_json_atomic

CELLS = Path(run_dir.CELLS)
KEPT = Path(run_dir.KEPT)
# The Snakefile puts each kernel's code fingerprint here (JSON object), so that the client can
# check a kept row without importing torch to compute it.
FINGERPRINTS_ENV = "LONGCA_KERNEL_FINGERPRINTS"


def kept_path(out: str | os.PathLike) -> Path | None:
    """Where the kept copy of the row at ``out`` lives; None for a file outside results/cells."""
    out = Path(out)
    try:
        relative = out.relative_to(CELLS) if not out.is_absolute() else out.relative_to(Path.cwd() / CELLS)
    except ValueError:
        return None
    return KEPT / relative


def kernel_fingerprint(kernel: str) -> str | None:
    """The fingerprint the Snakefile computed for ``kernel`` (None outside a workflow run)."""
    try:
        return json.loads(os.environ.get(FINGERPRINTS_ENV, "{}")).get(kernel)
    except ValueError:
        return None


def keep(out: str | os.PathLike, settings: dict, fingerprint: str | None, row: dict) -> None:
    path = kept_path(out)
    if path is None or not fingerprint:
        return
    write_json_atomic({"settings": settings, "fingerprint": fingerprint, "row": row}, path)


def recall(out: str | os.PathLike, settings: dict, fingerprint: str | None) -> dict | None:
    """The kept row for ``out`` if it was measured with exactly these settings and this code."""
    if not fingerprint:
        return None
    kept = _read(out)
    if kept is None or not same_settings(kept, settings) or kept.get("fingerprint") != fingerprint:
        return None
    return kept.get("row")


def row_for_settings(out: str | os.PathLike, settings: dict) -> dict | None:
    """The kept row for ``out`` if it was measured with these settings, whatever its code (for a
    report of a failed run; a cell that runs again checks the code too, with ``recall``)."""
    kept = _read(out)
    return kept.get("row") if kept is not None and same_settings(kept, settings) else None


def same_settings(kept: dict, settings: dict) -> bool:
    # Through JSON, so that tuples and lists, ints and floats compare as they were written.
    return json.loads(json.dumps(settings, sort_keys=True)) == kept.get("settings")


def _read(out: str | os.PathLike) -> dict | None:
    path = kept_path(out)
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def release() -> int:
    """Drop the kept copies of rows whose cell file exists (after a run that succeeded: Snakemake
    has recorded those files).  A copy whose file is gone stays: it may be the only one left."""
    dropped = 0
    for path in KEPT.rglob("*.json") if KEPT.exists() else ():
        if (CELLS / path.relative_to(KEPT)).exists():
            path.unlink()
            dropped += 1
    for folder in sorted((p for p in KEPT.rglob("*") if p.is_dir()), reverse=True) if KEPT.exists() else ():
        if not any(folder.iterdir()):
            folder.rmdir()  # deepest first, so emptied parents go too
    if KEPT.exists() and not any(KEPT.iterdir()):
        KEPT.rmdir()
    return dropped
