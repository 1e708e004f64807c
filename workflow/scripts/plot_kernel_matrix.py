# The kernel × mask heatmap of the best TFLOPs/s per cell.
from longca.plots import kernel_mask_matrix_figure, save
from longca.results import load

sm = snakemake  # noqa: F821
save(kernel_mask_matrix_figure(load(sm.input.table), masks=list(sm.params.masks)), sm.output[0])
