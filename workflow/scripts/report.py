# The self-contained HTML report (a script: see aggregate.py for why not `run:`).
from longca.report import render
from longca.results import load

sm = snakemake  # noqa: F821
render(load(sm.input.table), dict(zip(sm.params.masks, sm.input.figures)), sm.output[0], config=sm.params.config)
