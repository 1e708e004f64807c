# One CP cell = one torchrun job = one row (longca cp-cell starts torchrun and guarantees the row).


def cp_cell_settings(wildcards) -> str:
    settings = longca_config.cp_cell_settings(CFG, wildcards.strategy, wildcards.mask, int(wildcards.tokens),
                                              int(wildcards.cp_size), wildcards.direction, wildcards.dtype)
    return json.dumps(settings, sort_keys=True)


def cp_cell_nodes(wildcards) -> int:
    return longca_config.cp_nodes(int(wildcards.cp_size), CFG["ranks_per_node"])


@functools.lru_cache(maxsize=None)
def cached_cp_fingerprint(strategy: str) -> str:
    from longca import cp as longca_cp

    local_kernel = {**longca_cp.get(strategy).options, **CFG["cp_options"].get(strategy, {})}.get("local_kernel")
    return cp_fingerprint(strategy, local_kernel)


rule cp_cell:
    output:
        "results/cells/cp/{strategy}/{mask}/{dtype}_{direction}_{tokens}x{cp_size}.json",
    log:
        "results/logs/cp/{strategy}/{mask}/{dtype}_{direction}_{tokens}x{cp_size}.log",
    params:
        settings=cp_cell_settings,
        fingerprint=lambda wc: cached_cp_fingerprint(wc.strategy),
    threads: MEASURE_THREADS
    resources:
        **SLURM_RESOURCES,
        # Locally a CP cell holds cp_size GPUs (`--resources gpu=N` keeps cells from sharing GPUs).
        # On SLURM a cell spanning several nodes is one task per node (srun starts torchrun on each)
        # with its GPUs per node as gres: the plugin's `gpu` is a per-job total.
        gpu=lambda wc: int(wc.cp_size) if GPUS and cp_cell_nodes(wc) == 1 else 0,
        gres=lambda wc: f"gpu:{CFG['ranks_per_node']}" if GPUS and cp_cell_nodes(wc) > 1 else "",
        nodes=cp_cell_nodes,
        tasks=cp_cell_nodes,
        mpi=lambda wc: "srun" if cp_cell_nodes(wc) > 1 else "",
    shell:
        "{PYTHON} -m longca cp-cell --settings {params.settings:q} --threads {threads} "
        "--timeout {CP_TIMEOUT_S} --fingerprint {params.fingerprint} "
        "--cell-id {wildcards.strategy}/{wildcards.mask}/{wildcards.dtype}_{wildcards.direction}_{wildcards.tokens}x{wildcards.cp_size} "
        "--out {output} 2> {log}"
