# One self-contained HTML report.


localrules:
    html_report,


rule html_report:
    input:
        table="results/kernels.parquet",
        figures=expand("results/figures/kernels_{mask}.png", mask=MASK_NAMES),
    output:
        "results/report.html",
    params:
        masks=MASK_NAMES,
        config=CFG,  # shown in the report, so a config change rebuilds it
    script:
        "../workflow/scripts/report.py"
