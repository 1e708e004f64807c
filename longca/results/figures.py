"""The figures a run draws, each declared once.

A figure's workflow rule (``plot_<name>``), its file, its caption (``captions/<name>.rst``, rendered by
``snakemake --report`` and by LongCA's HTML report), its place and words in the HTML report and its
drawing (the function ``drawing`` of ``plots``) all derive from its ``FigureSpec`` here.  A new figure
is its drawing in ``plots.py``, its line below and its caption file.  This module imports nothing
heavy: the workflow reads it when it builds its rules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FigureSpec:
    name: str
    file: str                  # its PNG's stem under the run's figures/, "{mask}" where drawn per mask
    per: str | None            # "mask": one per mask of the grid; "cp_mask": per mask with CP cells; None: one
    reads: tuple[str, ...]     # the run's files it is drawn from: "kernels" (always), "cp", "ceilings"
    drawing: str               # the function of longca.results.plots that draws it: (FigureData, mask) -> Figure
    title: str                 # the HTML report's, "{mask}" filled in
    alt: str
    category: str              # snakemake --report's grouping and label
    subcategory: str
    label: str

    def html_id(self, mask: str | None) -> str:
        return "fig-" + self.name.replace("_", "-") + (f"-{mask}" if mask else "")


FIGURES: dict[str, FigureSpec] = {f.name: f for f in (
    FigureSpec("matrix", "kernel_mask_matrix", None, ("kernels",), "matrix_figure",
               "Kernel × mask: best TFLOPs/s", "heatmap of the best TFLOPs/s per kernel and mask",
               "Kernels", "Overview", "kernel × mask, best TFLOPs/s"),
    FigureSpec("throughput", "kernels_{mask}", "mask", ("kernels", "ceilings"), "throughput_figure",
               "{mask}: TFLOPs/s by sequence length",
               "TFLOPs/s against sequence length for mask {mask}, one line per kernel",
               "Kernels", "Throughput", "TFLOPs/s by seqlen"),
    FigureSpec("memory", "memory_{mask}", "mask", ("kernels",), "memory_figure",
               "{mask}: peak memory by sequence length",
               "peak memory by sequence length for mask {mask}, one line per kernel",
               "Kernels", "Peak memory", "peak memory by seqlen"),
    FigureSpec("memory_model", "fits_{mask}", "mask", ("kernels",), "memory_model_drawing",
               "{mask}: the longest length that fits (memory model)",
               "measured peak memory by sequence length for mask {mask} with the fitted memory model out to "
               "the GPU's memory, one line per kernel",
               "Kernels", "Memory model", "memory model and the longest length that fits"),
    FigureSpec("cp_scaling", "cp_scaling_{mask}", "cp_mask", ("kernels", "cp", "ceilings"), "cp_scaling_drawing",
               "{mask}: CP per-GPU TFLOPs/s",
               "per-GPU TFLOPs/s against cp_size for mask {mask}, one line per strategy",
               "Context parallelism", "Per-GPU TFLOPs/s", "per-GPU TFLOPs/s by cp_size"),
    FigureSpec("cp_efficiency", "cp_efficiency_{mask}", "cp_mask", ("kernels", "cp"), "cp_efficiency_drawing",
               "{mask}: CP efficiency", "CP efficiency against cp_size for mask {mask}",
               "Context parallelism", "Efficiency", "efficiency vs one GPU"),
    FigureSpec("cp_predicted", "cp_predicted_{mask}", "cp_mask", ("kernels", "cp"), "cp_predicted_figure",
               "{mask}: CP at larger GPU counts (predicted, not measured)",
               "predicted per-GPU TFLOPs/s against cp_size for mask {mask}, with the measured points",
               "Context parallelism", "Predicted", "predicted per-GPU TFLOPs/s to 96 GPUs"),
)}


def masks_of(spec: FigureSpec, masks: list[str], cp_masks: list[str]) -> list[str | None]:
    """The masks ``spec`` is drawn for in a run whose grid has ``masks`` and CP cells on ``cp_masks``."""
    return {"mask": list(masks), "cp_mask": list(cp_masks), None: [None]}[spec.per]
