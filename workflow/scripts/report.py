# The self-contained HTML report (a script: see aggregate.py for why not `run:`).
from longca.execution.measure import ceilings
from longca.results.parquet import load
from longca.results.report import Figures, render

sm = snakemake  # noqa: F821
figures = Figures(throughput=dict(zip(sm.params.masks, sm.input.throughput)),
                  memory=dict(zip(sm.params.masks, sm.input.memory)),
                  matrix=sm.input.matrix,
                  cp_scaling=dict(zip(sm.params.cp_masks, sm.input.cp_scaling)),
                  cp_efficiency=dict(zip(sm.params.cp_masks, sm.input.cp_efficiency)),
                  cp_prediction=dict(zip(sm.params.cp_masks, sm.input.cp_prediction)))
render(load(sm.input.table), sm.output[0], cp=load(sm.input.cp), figures=figures,
       ceilings=ceilings.load(sm.input.ceilings), config=dict(sm.params.config), masks=list(sm.params.masks))
