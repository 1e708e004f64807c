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
    run:
        from longca.plots import kernel_throughput_figure
        from longca.results import load

        kernel_throughput_figure(load(input[0]), wildcards.mask, output[0])
