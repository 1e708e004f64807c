# The per-mask CP figures: per-GPU TFLOPs/s against cp_size, efficiency against one GPU, and the CP model's
# prediction for larger GPU counts.
from longca.execution.measure import ceilings
from longca.results.parquet import load
from longca.results.plots import cp_figures

sm = snakemake  # noqa: F821
cp_figures(load(sm.input.cp), load(sm.input.kernels), sm.wildcards.mask, sm.output.scaling, sm.output.efficiency,
           ceilings=ceilings.load(sm.input.ceilings), prediction_out=sm.output.prediction)
