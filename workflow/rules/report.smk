# One self-contained HTML report; it depends on every table, figure and the ceilings, so asking for
# results/report.html builds everything.


localrules:
    html_report,


# The report shows the tables of longca/results/tables.py: editing them rebuilds it too.
REPORT_CODE = code_fingerprint("longca/results/report.py", "longca/results/tables.py",
                               "longca/results/templates/report.html.j2",
                               "longca/results/templates/report_env_table.html.j2")


rule html_report:
    input:
        table="results/kernels.parquet",
        cp="results/cp.parquet",
        ceilings="results/ceilings.json",
        throughput=expand("results/figures/kernels_{mask}.png", mask=MASK_NAMES),
        memory=expand("results/figures/memory_{mask}.png", mask=MASK_NAMES),
        matrix="results/figures/kernel_mask_matrix.png",
        cp_scaling=expand("results/figures/cp_scaling_{mask}.png", mask=CP_MASKS),
        cp_efficiency=expand("results/figures/cp_efficiency_{mask}.png", mask=CP_MASKS),
        cp_prediction=expand("results/figures/cp_predicted_{mask}.png", mask=CP_MASKS),
    output:
        report(
            "results/report.html",
            caption=figure_captions.path("html_report"),
            category="Report",
            labels={"file": "report.html"},
        ),
    params:
        masks=MASK_NAMES,
        cp_masks=CP_MASKS,
        config=CFG,  # shown in the report, so a config change rebuilds it
        code=REPORT_CODE,
    script:
        "../scripts/report.py"
