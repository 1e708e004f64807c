# The per-mask kernel figures: TFLOPs/s by seqlen (with the ceiling line) and peak memory by seqlen.
from longca.execution.measure import ceilings
from longca.results.parquet import load
from longca.results.plots import kernel_figures

sm = snakemake  # noqa: F821
kernel_figures(load(sm.input.table), sm.wildcards.mask, sm.output.throughput, sm.output.memory,
               ceilings=ceilings.load(sm.input.ceilings))
