# LongCA: kernel × mask × seqlen (× cp_size) grid → cached cells → Parquet → figures → HTML report.
# Run from the repository root: `snakemake all` (the default profile in profiles/default sets cores etc.).
import os
import sys

from snakemake.utils import min_version

min_version("9.0")

# The package lives next to this file; an editable install finds it too, this makes a bare checkout work,
# and PYTHONPATH makes the jobs (run-cell, the worker) import this same copy of the package.
sys.path.insert(0, workflow.basedir)
os.environ["PYTHONPATH"] = os.pathsep.join([workflow.basedir] + [p for p in [os.environ.get("PYTHONPATH")] if p])

# Snakemake's own YAML error names neither file nor line: read the embedded config once first, so a
# typo in it stops here naming both (a --configfile is parsed before this file; see the README).
from longca.config import load_yaml

load_yaml(os.path.join(workflow.basedir, "config", "config.yaml"))


configfile: os.path.join(workflow.basedir, "config", "config.yaml")


# The screen shows LongCA's lines, warnings and errors; Snakemake's job blocks go to its log
# (.snakemake/log/), and to the screen too with --verbose (longca/execution/processes/console.py).
from longca.execution.processes import console

console.quiet_screen(workflow.output_settings.verbose, workflow.output_settings.dryrun)


include: "workflow/rules/common.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/cp.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/plots.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        run_dir.KERNEL_TABLE,
        run_dir.CP_TABLE,
        run_dir.REPORT,
        # The cells too: Snakemake does not make an input of an up-to-date table again, so a cell file
        # removed to be measured again would otherwise stay missing; as a target it is run, and the
        # tables after it.
        KERNEL_ROW_FILES,
        CP_ROW_FILES,


# Once the jobs are planned (real runs only): the cell jobs report how the measurements go in one
# line every 30 s (longca/execution/processes/progress.py).
onstart:
    from longca.execution.processes import progress

    progress.start(planned_cell_jobs())


# A job that dies (cancelled, killed at its time limit, node lost) leaves its cells without rows:
# give them failure rows naming the job's log, so the tables show them; their files stay missing,
# so the next run resubmits exactly those cells.
onerror:
    from longca.results import lost_cells

    lost_cells.record(CFG, KERNEL_CELLS, CP_CELLS, main_log=log, slurm_logdir=lost_cells.slurm_logdir(workflow))


onsuccess:
    from longca.execution.cache import kept_rows
    from longca.results import closing, lost_cells

    lost_cells.clear()  # every cell has its own row now: the stand-ins of an earlier failed run go
    kept_rows.release()  # and the copies kept for a rerun after a failed job
    if (closing_line := closing.line(run_dir.ROOT)):  # the run's last line: where to look, what is there
        console.closing_line_last(closing_line)
