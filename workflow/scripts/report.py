# The self-contained HTML report (a script: see aggregate.py for why not `run:`).
from longca.execution.measure import ceilings
from longca.results import figures
from longca.results.parquet import load
from longca.results.report import Figures, render

sm = snakemake  # noqa: F821
drawn = Figures({name: dict(zip(figures.masks_of(spec, sm.params.masks, sm.params.cp_masks), sm.input[name]))
                 for name, spec in figures.FIGURES.items()})
render(load(sm.input.table), sm.output[0], cp=load(sm.input.cp), figures=drawn,
       ceilings=ceilings.load(sm.input.ceilings), config=dict(sm.params.config), masks=list(sm.params.masks))
