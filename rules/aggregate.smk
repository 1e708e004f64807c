# Cell rows → one Parquet table (schema: longca.results, docs/results-schema.md).


localrules:
    aggregate_kernels,
    aggregate_cp,


rule aggregate_kernels:
    input:
        [cell.path for cell in KERNEL_CELLS],
    output:
        "results/kernels.parquet",
    run:
        from longca.results import aggregate

        aggregate(input, output[0])


rule aggregate_cp:
    # Written (empty, with the full schema) even before any CP cell exists, so readers can rely on it.
    input:
        [cell.path for cell in CP_CELLS],
    output:
        "results/cp.parquet",
    run:
        from longca.results import CP_SCHEMA, aggregate

        aggregate(input, output[0], schema=CP_SCHEMA)
