# Cell rows → one Parquet table (schema: longca.results, docs/results-schema.md).


localrules:
    aggregate_kernels,


rule aggregate_kernels:
    input:
        [cell.path for cell in KERNEL_CELLS],
    output:
        "results/kernels.parquet",
    run:
        from longca.results import aggregate

        aggregate(input, output[0])
