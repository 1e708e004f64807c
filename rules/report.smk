# One self-contained HTML report.


localrules:
    html_report,


rule html_report:
    input:
        table="results/kernels.parquet",
        figures=expand("results/figures/kernels_{mask}.png", mask=MASK_NAMES),
    output:
        "results/report.html",
    run:
        from longca.report import render
        from longca.results import load

        render(load(input.table), dict(zip(MASK_NAMES, input.figures)), output[0], config=CFG)
