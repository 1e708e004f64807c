# Cell rows → one Parquet table per kind (schema: longca.results.parquet, docs/results-schema.md).


localrules:
    aggregate_kernels,
    aggregate_cp,


rule aggregate_kernels:
    input:
        KERNEL_ROW_FILES,
    output:
        run_dir.KERNEL_TABLE,
    params:
        table="kernels",
        models=longca_config.label_models(CFG),  # each row's `model` column, from its mask's presets
    script:
        "../scripts/aggregate.py"


rule aggregate_cp:
    # Written (empty, with the full schema) even before any CP cell exists, so readers can rely on it.
    input:
        CP_ROW_FILES,
    output:
        run_dir.CP_TABLE,
    params:
        table="cp",
    script:
        "../scripts/aggregate.py"
