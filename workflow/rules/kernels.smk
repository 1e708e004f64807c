# One kernel cell = one measurement = one JSON row.  Its params are its resolved settings plus the
# fingerprint of the code that computes it, so Snakemake's params rerun-trigger reruns exactly the
# cells whose settings or code changed.  run-cell measures in the device's resident process (GPU
# default, longca/execution/processes/resident.py) or a forked child of the warm worker (CPU default, longca/execution/processes/worker.py):
# a crash, hang or memory exhaustion still writes the row, atomically.

# Inside a cluster job the group's cells run here, in the job's Snakemake, one after another, and
# share one worker or lane that ends with the job (longca/execution/cluster/placement.py): no
# `srun` step and no second Snakemake per cell.
CELLS_IN_JOB_PROCESS = placement.cells_in_job_process(PLACEMENT)
placement.scope_servers_to_job(PLACEMENT)
# ... started now, while this Snakemake builds its DAG, not by the first cell.
placement.prestart_job_server(workflow, CFG, PLACEMENT)
KERNEL_CELL_FLAGS = longca_config.cell_limits({**CFG, "isolation": placement.kernel_cell_isolation(CFG, PLACEMENT)})


rule kernel_cell:
    output:
        cells.KERNEL_FILE,
    log:
        cells.KERNEL_LOG,
    params:
        settings=kernel_cell_settings,
        fingerprint=lambda wc: cached_kernel_fingerprint(wc.kernel),
    threads: CELL_THREADS
    # On a cluster, many small cells share one job (profiles/slurm sets group-components).
    group:
        None if CELLS_IN_JOB_PROCESS else "kernel_cells"
    localrule: CELLS_IN_JOB_PROCESS
    resources:
        **CELL_RESOURCES,
    shell:
        # The row's cell_id (longca/cells.py) is derived from the settings.
        "{PYTHON} -m longca run-cell --settings {params.settings:q} --threads {MEASURE_THREADS} {KERNEL_CELL_FLAGS} "
        "--out {output} 2> {log}"
