# The per-mask CP figures: per-GPU TFLOPs/s against cp_size, and efficiency against one GPU.
from longca import ceilings
from longca.plots import cp_figures
from longca.results import load

sm = snakemake  # noqa: F821
cp_figures(load(sm.input.cp), load(sm.input.kernels), sm.wildcards.mask, sm.output.scaling, sm.output.efficiency,
           ceilings=ceilings.load(sm.input.ceilings))
