# The machine's ceilings, then the figures (workflow/scripts/plot_figure.py calls longca.results.plots, which draws
# longca.results.tables; captions: longca/results/captions/, shared with the HTML report).
from pathlib import Path

from longca.execution.cache.fingerprint import files_fingerprint
from longca.results import figures


def code_fingerprint(*paths: str) -> str:
    """The fingerprint of files of this checkout, as for cells (code lines, not names): a param, so
    changing the plotting or report code redraws the figures and the report."""
    return files_fingerprint([Path(workflow.basedir, p) for p in paths])


# The figures draw the tables of longca/results/tables.py: editing either redraws them.
PLOT_CODE = code_fingerprint("longca/results/plots.py", "longca/results/figures.py", "longca/results/tables.py",
                             "longca/results/cp_model.py", "longca/execution/measure/ceilings.py")
# CP figures exist once CP cells do (one per mask the CP grid covers); with none, the report says so.
CP_MASKS = [m for m in MASK_NAMES if m in {c.mask for c in ALL_CP_CELLS}]


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


# One rule per figure of longca/results/figures.py, named plot_<figure>: its files, inputs and caption
# all come from the figure's declaration there.
RUN_FILES = {"kernels": run_dir.KERNEL_TABLE, "cp": run_dir.CP_TABLE, "ceilings": run_dir.CEILINGS}

for spec in figures.FIGURES.values():

    rule:
        name:
            f"plot_{spec.name}"
        input:
            **{table: RUN_FILES[table] for table in spec.reads},
        output:
            report(
                run_dir.figure(spec.file),
                caption=figure_captions.path(spec.name),
                category=spec.category,
                subcategory=spec.subcategory,
                labels={**({"mask": "{mask}"} if spec.per else {}), "figure": spec.label},
            ),
        params:
            figure=spec.name,
            masks=MASK_NAMES,
            code=PLOT_CODE,
        localrule: True
        script:
            "../scripts/plot_figure.py"


def figure_files(spec):
    """The files of figure ``spec`` this run draws (the report's inputs)."""
    return [run_dir.figure(spec.file).format(mask=mask) for mask in figures.masks_of(spec, MASK_NAMES, CP_MASKS)]
