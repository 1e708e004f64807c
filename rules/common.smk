# Config validation and grid expansion: everything the other rules ask about the grid.
import json

from longca import config as longca_config
from longca.fingerprint import kernel_fingerprint

# Validated before any job starts; a bad key stops here with a message naming it.
CFG = longca_config.validate(config)
KERNEL_CELLS = list(longca_config.kernel_cells(CFG))
MASK_NAMES = [entry.name for entry in longca_config.mask_entries(CFG)]
PYTHON = sys.executable


wildcard_constraints:
    seqlen=r"\d+",
    direction="fwd|bwd",


def kernel_cell_settings(wildcards) -> str:
    """The cell's resolved settings as JSON: a Snakemake param, hence part of the cache key."""
    settings = longca_config.cell_settings(CFG, wildcards.kernel, wildcards.mask, int(wildcards.seqlen),
                                           wildcards.direction, wildcards.dtype)
    return json.dumps(settings, sort_keys=True)


def cell_threads(wildcards) -> int:
    # CPU cells take every core they are given one at a time, so concurrent cells never share cores
    # and skew each other's timings.
    return CFG["threads"] or workflow.cores
