"""The workflow's config as a run resolves it, for the lab's scripts.

Snakemake reads ``config/config.yaml`` before any ``--configfile``; these read the same files the
same way, through the tool's public names.
"""

from __future__ import annotations

from pathlib import Path

from longca.api import config as longca_config

REPO = Path(__file__).resolve().parents[2]
# The workflow's default config, which Snakemake reads before any --configfile.
WORKFLOW_CONFIG = REPO / "config" / "config.yaml"


def merged(*files) -> dict:
    """The config that ``snakemake --configfile FILES...`` starts from, not yet validated."""
    return longca_config.merge_files([WORKFLOW_CONFIG, *map(Path, files)])


def resolved(*files) -> dict:
    """The config a run with ``--configfile FILES...`` resolves, validated (a bad key is named)."""
    return longca_config.validate(merged(*files))
