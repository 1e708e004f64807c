"""What the study scripts under benchmarks/ share: this checkout's ``longca`` and the workflow's
config as a run resolves it.

Run as ``python benchmarks/<script>.py``, a script finds this module beside it (Python puts the
script's folder first on ``sys.path``); importing it makes ``longca`` importable from this checkout
where the package is not installed (a GPU machine given only the working tree).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from longca import config as longca_config  # noqa: E402

# The workflow's default config, which Snakemake reads before any --configfile.
WORKFLOW_CONFIG = REPO / "config" / "config.yaml"


def merged(*files) -> dict:
    """The config that ``snakemake --configfile FILES...`` starts from, not yet validated."""
    return longca_config.merge_files([WORKFLOW_CONFIG, *map(Path, files)])


def resolved(*files) -> dict:
    """The config a run with ``--configfile FILES...`` resolves, validated (a bad key is named)."""
    return longca_config.validate(merged(*files))
