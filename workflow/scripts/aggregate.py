# Cell rows → one Parquet table; `params.table` names the schema (longca.results.parquet).  A script, not a
# `run:` block: Snakemake re-parses the whole workflow for every `run:` job (~5 s), and a shell
# command would hit the 128 KiB argument limit with a large grid's input list.
from longca.results import parquet as results

schema = {"kernels": results.KERNEL_SCHEMA, "cp": results.CP_SCHEMA}[snakemake.params.table]  # noqa: F821
results.aggregate(snakemake.input, snakemake.output[0], schema=schema,  # noqa: F821
                  models=dict(getattr(snakemake.params, "models", None) or {}))  # noqa: F821
