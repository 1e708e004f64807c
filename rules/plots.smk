# Figures from the Parquet table, one per mask.


localrules:
    plot_kernel_mask,


rule plot_kernel_mask:
    input:
        "results/kernels.parquet",
    output:
        report(
            "results/figures/kernels_{mask}.png",
            caption="../workflow/report/kernel_figure.rst",
            category="Kernels",
        ),
    script:
        "../workflow/scripts/plot_kernel_mask.py"
