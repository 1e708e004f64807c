# One CP cell = one torchrun job = one row (longca cp-cell starts torchrun and guarantees the row;
# its cell_id comes from its settings, longca/cells.py).


def cp_cell_settings(wildcards) -> str:
    settings = longca_config.cp_cell_settings(CFG, wildcards.strategy, wildcards.mask, int(wildcards.tokens),
                                              int(wildcards.cp_size), wildcards.direction, wildcards.dtype)
    return json.dumps(settings, sort_keys=True)


@functools.lru_cache(maxsize=None)
def cached_cp_fingerprint(strategy: str) -> str:
    from longca import cp as longca_cp

    local_kernel = {**longca_cp.get(strategy).options, **CFG["cp_options"].get(strategy, {})}.get("local_kernel")
    return cp_fingerprint(strategy, local_kernel)


def cp_job_resource(key: str):
    """One sbatch resource of a CP cell's job, by its size (longca.execution.cluster.slurm_jobs)."""
    return lambda wc: slurm_jobs.cp_cell_resources(CFG, int(wc.cp_size))[key]


rule cp_cell:
    output:
        cells.CP_FILE,
    log:
        cells.CP_LOG,
    params:
        settings=cp_cell_settings,
        fingerprint=lambda wc: cached_cp_fingerprint(wc.strategy),
    threads: MEASURE_THREADS
    resources:
        # Locally a CP cell holds cp_size GPUs of the `gpu` resource (one per visible device), so it
        # never shares a GPU with another cell.  On SLURM it is one job of ceil(cp_size /
        # ranks_per_node) nodes, one task per node (srun starts a torchrun agent on each), with each
        # node's GPUs as gres (longca.execution.cluster.slurm_jobs).
        **SLURM_RESOURCES,
        **({} if PLACEMENT != placement.LOCAL else {"gpu": lambda wc: int(wc.cp_size) if GPUS else 0,
                                                    "cpus_per_task": MEASURE_THREADS}),
        **({} if PLACEMENT == placement.LOCAL else
           {key: cp_job_resource(key) for key in slurm_jobs.cp_cell_resources(CFG, 1)}),
    shell:
        "{PYTHON} -m longca cp-cell --job-started $(date +%s.%N) --isolation {ISOLATION} "
        "--settings {params.settings:q} --threads {resources.cpus_per_task} "
        "--timeout {CP_TIMEOUT_S} --fingerprint {params.fingerprint} --out {output} 2> {log}"


# A CP cell this run cannot place (more ranks than GPUs here): an `unsupported` row at once, saying
# why, in a file of its own, so that a run with enough GPUs measures the cell.
rule cp_cell_unplaced:
    output:
        cells.CP_UNPLACED_FILE,
    params:
        settings=cp_cell_settings,
        reason=lambda wc: UNPLACED_CP[cells.CPCell(wc.strategy, wc.mask, int(wc.tokens), int(wc.cp_size),
                                                   wc.direction, wc.dtype)],
    localrule: True
    shell:
        "{PYTHON} -m longca cp-cell --settings {params.settings:q} --unsupported {params.reason:q} --out {output}"
