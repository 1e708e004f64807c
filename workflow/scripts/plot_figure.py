# One figure of longca/results/figures.py (params.figure), for the mask of its file where it is drawn per mask.
from longca.execution.measure import ceilings
from longca.results import plots
from longca.results.parquet import load

sm = snakemake  # noqa: F821
inputs = dict(sm.input.items())
data = plots.FigureData(load(inputs["kernels"]), load(inputs["cp"]) if "cp" in inputs else None,
                        ceilings=ceilings.load(inputs["ceilings"]) if "ceilings" in inputs else None,
                        masks=list(sm.params.masks))
plots.draw(sm.params.figure, data, sm.wildcards.get("mask"), sm.output[0])
