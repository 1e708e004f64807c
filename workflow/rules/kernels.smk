# One kernel cell = one measurement = one JSON row.  Its params are its resolved settings plus the
# fingerprint of the code that computes it, so Snakemake's params rerun-trigger reruns exactly the
# cells whose settings or code changed.  run-cell measures in the device's resident process (GPU
# default, longca/execution/processes/resident.py) or a forked child of the warm worker (CPU default, longca/execution/processes/worker.py):
# a crash, hang or memory exhaustion still writes the row, atomically.


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
        "kernel_cells"
    resources:
        **CELL_RESOURCES,
    shell:
        # The row's cell_id (longca/cells.py) is derived from the settings.
        "{PYTHON} -m longca run-cell --settings {params.settings:q} --threads {MEASURE_THREADS} {LIMIT_FLAGS} "
        "--out {output} 2> {log}"
