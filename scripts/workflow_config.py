"""The workflow's config as a run resolves it, for the scripts beside it (``scripts/``).

They run as ``python scripts/<name>.py`` and import each other as plain modules (the script's folder
is the first entry of ``sys.path``; the tests put ``scripts/`` there through pytest's ``pythonpath``).
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
