# The kernel × mask heatmap of the best TFLOPs/s per cell.
from longca.results.parquet import load
from longca.results.plots import kernel_mask_matrix_figure, save

sm = snakemake  # noqa: F821
save(kernel_mask_matrix_figure(load(sm.input.table), masks=list(sm.params.masks)), sm.output[0])
