# The machine's ceilings, then the figures (scripts under workflow/scripts call longca.execution.measure.ceilings and
# longca.results.plots, which draws longca.results.tables; captions: longca/results/captions/, shared with the HTML report).
from pathlib import Path

from longca.execution.cache.fingerprint import files_fingerprint


def code_fingerprint(*paths: str) -> str:
    """The fingerprint of files of this checkout, as for cells (code lines, not names): a param, so
    changing the plotting or report code redraws the figures and the report."""
    return files_fingerprint([Path(workflow.basedir, p) for p in paths])


# The figures draw the tables of longca/results/tables.py: editing either redraws them.
PLOT_CODE = code_fingerprint("longca/results/plots.py", "longca/results/tables.py", "longca/results/cp_model.py",
                             "longca/execution/measure/ceilings.py")
# CP figures exist once CP cells do (one per mask the CP grid covers); with none, the report says so.
CP_MASKS = [m for m in MASK_NAMES if m in {c.mask for c in ALL_CP_CELLS}]


localrules:
    plot_kernel_mask,
    plot_kernel_matrix,
    plot_cp_mask,


rule ceilings:
    # A real measurement (dense matmul rate per dtype) on the cells' device with the cells' threads;
    # figures draw it as a line.  Reruns when the device, the dtypes or its code change (like a cell,
    # not when `threads`, `gpus` or limits do).
    output:
        run_dir.CEILINGS,
    log:
        run_dir.CEILINGS_LOG,
    params:
        device=CFG["device"],
        dtypes=CFG["dtypes"],
        fingerprint=files_fingerprint([Path(workflow.basedir, "longca", "execution", "measure", f) for f in ("ceilings.py", "timing.py")]),
    threads: MEASURE_THREADS
    resources:
        **GPU_JOB_RESOURCES,
    script:
        "../scripts/ceilings.py"


rule plot_kernel_mask:
    input:
        table=run_dir.KERNEL_TABLE,
        ceilings=run_dir.CEILINGS,
    output:
        throughput=report(
            run_dir.figure("kernels_{mask}"),
            caption=figure_captions.path("kernel_figure"),
            category="Kernels",
            subcategory="Throughput",
            labels={"mask": "{mask}", "figure": "TFLOPs/s by seqlen"},
        ),
        memory=report(
            run_dir.figure("memory_{mask}"),
            caption=figure_captions.path("memory_figure"),
            category="Kernels",
            subcategory="Peak memory",
            labels={"mask": "{mask}", "figure": "peak memory by seqlen"},
        ),
    params:
        code=PLOT_CODE,
    script:
        "../scripts/plot_kernel_mask.py"


rule plot_kernel_matrix:
    input:
        table=run_dir.KERNEL_TABLE,
    output:
        report(
            run_dir.figure("kernel_mask_matrix"),
            caption=figure_captions.path("matrix_figure"),
            category="Kernels",
            subcategory="Overview",
            labels={"figure": "kernel × mask, best TFLOPs/s"},
        ),
    params:
        masks=MASK_NAMES,
        code=PLOT_CODE,
    script:
        "../scripts/plot_kernel_matrix.py"


rule plot_cp_mask:
    input:
        cp=run_dir.CP_TABLE,
        kernels=run_dir.KERNEL_TABLE,
        ceilings=run_dir.CEILINGS,
    output:
        scaling=report(
            run_dir.figure("cp_scaling_{mask}"),
            caption=figure_captions.path("cp_scaling_figure"),
            category="Context parallelism",
            subcategory="Per-GPU TFLOPs/s",
            labels={"mask": "{mask}", "figure": "per-GPU TFLOPs/s by cp_size"},
        ),
        efficiency=report(
            run_dir.figure("cp_efficiency_{mask}"),
            caption=figure_captions.path("cp_efficiency_figure"),
            category="Context parallelism",
            subcategory="Efficiency",
            labels={"mask": "{mask}", "figure": "efficiency vs one GPU"},
        ),
        prediction=report(
            run_dir.figure("cp_predicted_{mask}"),
            caption=figure_captions.path("cp_prediction_figure"),
            category="Context parallelism",
            subcategory="Predicted",
            labels={"mask": "{mask}", "figure": "predicted per-GPU TFLOPs/s to 96 GPUs"},
        ),
    params:
        code=PLOT_CODE,
    script:
        "../scripts/plot_cp_mask.py"
