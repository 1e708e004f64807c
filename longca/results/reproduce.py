"""The one command that measures a kernel row's cell alone, built from the row and the run's config.

``longca run-cell --settings '<json>' --out <the cell's row file>``: the settings are exactly what the
workflow passes that cell (``longca.config.cell_settings``, so its cache key), and the file is the
cell's own (``longca.cells``).  Run in the run's directory it writes that cell's row; anywhere else it
needs nothing but LongCA (no config file, no Snakemake).  Outside a workflow run it reads no store
(unless ``LONGCA_STORE`` names one): every part is measured.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping

from .. import config as longca_config
from ..cells import KernelCell

PROGRAM = "longca run-cell"


def command(config: Mapping[str, Any], row: Mapping[str, Any]) -> str | None:
    """The command for ``row`` (its kernel, mask, seqlen, direction and dtype), or None when the
    config's grid has no such cell (a row of another run)."""
    cell = KernelCell(str(row["kernel"]), str(row["mask"]), int(row["seqlen"]), str(row["direction"]), str(row["dtype"]))
    try:
        settings = longca_config.cell_settings(dict(config), cell.kernel, cell.mask, cell.seqlen, cell.direction,
                                               cell.dtype)
    except (KeyError, TypeError, ValueError):
        return None
    return f"{PROGRAM} --settings {shlex.quote(json.dumps(settings, sort_keys=True))} --out {cell.path}"


def commands(config: Mapping[str, Any] | None, rows) -> list[str | None]:
    """``command`` of each row of a kernel table (None throughout without a config)."""
    if not config or rows.empty:
        return [None] * len(rows)
    return [command(config, row) for row in rows.to_dict("records")]
