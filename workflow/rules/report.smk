# One self-contained HTML report; it depends on every table, figure and the ceilings, so asking for
# results/report.html builds everything.


localrules:
    html_report,


# The report shows the tables of longca/results/tables.py: editing them rebuilds it too.
REPORT_CODE = code_fingerprint("longca/results/report.py", "longca/results/tables.py", "longca/results/reproduce.py",
                               "longca/results/templates/report.html.j2",
                               "longca/results/templates/report_env_table.html.j2")


rule html_report:
    input:
        table=run_dir.KERNEL_TABLE,
        cp=run_dir.CP_TABLE,
        ceilings=run_dir.CEILINGS,
        **{name: figure_files(spec) for name, spec in figures.FIGURES.items()},
    output:
        report(
            run_dir.REPORT,
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
