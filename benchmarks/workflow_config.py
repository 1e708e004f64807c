"""The workflow's config as a run resolves it, for the study's scripts (``benchmarks``).

The study imports as the package ``benchmarks`` (``pip install -e .`` installs it beside ``longca``;
on a machine given only the working tree, ``PYTHONPATH`` at the checkout), its scripts run as
``python benchmarks/<script>.py``.
"""

from __future__ import annotations

from pathlib import Path

from longca import config as longca_config

REPO = Path(__file__).resolve().parent.parent
# The workflow's default config, which Snakemake reads before any --configfile.
WORKFLOW_CONFIG = REPO / "config" / "config.yaml"


def merged(*files) -> dict:
    """The config that ``snakemake --configfile FILES...`` starts from, not yet validated."""
    return longca_config.merge_files([WORKFLOW_CONFIG, *map(Path, files)])


def resolved(*files) -> dict:
    """The config a run with ``--configfile FILES...`` resolves, validated (a bad key is named)."""
    return longca_config.validate(merged(*files))
