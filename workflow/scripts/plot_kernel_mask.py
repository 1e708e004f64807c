# One figure per mask from the kernels table (a script: see aggregate.py for why not `run:`).
from longca.plots import kernel_throughput_figure
from longca.results import load

kernel_throughput_figure(load(snakemake.input[0]), snakemake.wildcards.mask, snakemake.output[0])  # noqa: F821
