"""What a cell measures and how: the correctness gate and timing of a kernel cell (``cell``,
``timing``, ``graphed``), a CP cell on every rank (``cp_cell``, ``cp_rank``: what torchrun starts),
the environment a row records (``env``), the machine's matmul ceiling (``ceilings``) and ``longca
check`` (``check``).  Where and how a cell runs is the other rooms of ``longca.execution``.

This module stays free of torch: the processes that run cells call ``measure_cell`` and
``load_measuring_code``, and the measuring code (torch, the kernels) is loaded here on first use, after a
process has chosen its GPU (``CUDA_VISIBLE_DEVICES``) and before it forks its children.
"""

from __future__ import annotations

from typing import Any


def load_measuring_code() -> None:
    """Import the measuring code (and torch with it) without running anything on a device."""
    from . import cell  # noqa: F401


def measure_cell(settings: dict[str, Any], store) -> dict[str, Any]:
    """One kernel cell from its settings, parts found in ``store`` reused: its row (never raises)."""
    from .cell import CellSpec, run_cell

    return run_cell(CellSpec.from_dict(settings), store)
