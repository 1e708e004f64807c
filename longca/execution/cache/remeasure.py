"""Measure chosen cells again: their rows and stored parts set aside, never deleted.

A cell's row file is what Snakemake counts as done, its copy under ``results/kept/`` is written
back when the cell runs again, and its parts in ``results/store/`` are what the cell is composed
of: deleting the row alone brings the same figures back.  ``set_aside`` moves all three, for the
parts asked (by default the timing and the memory, the ones a noisy machine spoils; the gate's
verdict only when named), into ``results/replaced/<time>/`` under the same relative paths, so the
next ``snakemake all`` measures exactly those parts again and the old ones stay on disk.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ... import run_dir
from . import kept_rows
from .parts import PARTS, part_settings

DEFAULT_PARTS = ("time", "memory")
# Row columns that hold a setting's mapping as JSON text (the store keeps the mapping).
_JSON_SETTINGS = ("kernel_options", "mask_params")


def _settings(row: dict) -> dict:
    return {k: json.loads(v) if k in _JSON_SETTINGS and isinstance(v, str) else v for k, v in row.items()}


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def stored_parts(store: Path, row: dict, parts) -> list[Path]:
    """The store's records of ``parts`` measured with this row's settings (any code version)."""
    settings = _settings(row)
    found = []
    for part in parts:
        wanted = part_settings(part, settings)
        for record in sorted((store / part).glob("*/*.json")):
            try:
                if _same(json.loads(record.read_text())["settings"], wanted):
                    found.append(record)
            except (OSError, ValueError, KeyError):
                continue
    return found


def set_aside(row_files, parts=DEFAULT_PARTS, root: str | os.PathLike = ".") -> tuple[Path, list[Path]]:
    """Move each row file (``results/cells/...``), its kept copy and its stored ``parts`` under
    ``results/replaced/<time>/``; returns that folder and the files moved.  A row file that holds
    no JSON object is moved alone (nothing tells which parts it had)."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(PARTS)}")
    root = Path(root)
    cells, store = root / run_dir.CELLS, root / run_dir.STORE
    to_move = []
    for name in row_files:
        path = Path(name) if Path(name).is_absolute() else root / name
        try:
            path.relative_to(cells)
        except ValueError:
            raise ValueError(f"{name}: not a cell's row file under {run_dir.CELLS}/") from None
        if not path.exists():
            raise ValueError(f"{name}: no such row file")
        to_move.append(path)
        kept = root / kept_rows.KEPT / path.relative_to(cells)
        to_move += [kept] if kept.exists() else []
        try:
            row = json.loads(path.read_text())
        except (OSError, ValueError):
            row = None
        if isinstance(row, dict) and row.get("kind", "kernel") == "kernel":
            to_move += stored_parts(store, row, parts)
    folder = root / run_dir.REPLACED / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = []
    for path in dict.fromkeys(to_move):
        target = folder / path.relative_to(root / run_dir.ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved.append(target)
    return folder, moved
