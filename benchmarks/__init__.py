"""The fidelity study: how LongCA's published tables were made and checked, apart from the tool.

``longca`` is the benchmark a user runs; this package is what the project ran on GPUs to publish
its tables (docs/results/) and to check that the workflow measures what a bare loop measures.  It
uses ``longca``'s public API only (tests/test_layout.py checks that, and that ``longca`` never imports
it).  Each module is a script, ``python benchmarks/<name>.py --help``, whose functions tests import
as ``benchmarks.<name>``; ``pip install -e .`` installs the package beside ``longca``.

Running a published grid (bash)
    ``gpu_grid.sh`` (the workflow on a GPU machine within a time budget), ``device_run.sh`` (the first
    8K run), ``build_kernels.sh`` and ``keep_cuda_arch.py`` (the optional Hopper kernel libraries).
Keeping and publishing a table
    ``restore_cells.py`` (published cells back into a run directory), ``render_results.py`` (tables,
    figures and report from the cells a run finished).
Comparing tables
    ``compare_gpus.py`` (two GPUs), ``run_to_run.py`` (one table measured twice), ``magi_blog_figures.py``
    (the MagiAttention blog's charts as numbers), ``cp_summary.py`` (a CP table's best strategies
    and its ratios to another CP table).
Checking the measurement
    ``bench_pipeline.py`` (the workflow against a bare loop), ``bench_kernels.py`` (the harness against
    a bare loop), ``timing_series.py`` (every timing sample), ``peak_memory.py``, ``memory_order.py``
    and ``memory_ways.py`` (what the memory figure counts, and its two ways of reading it), ``full_check.py`` (each kernel × mask at full size against a
    float32 reference), ``cp_full_check.py`` (each CP strategy likewise), ``check_lse_ops.py`` (CP's
    local-kernel entry points).
Costs of the tool itself
    ``bench_workflow.py`` (the workflow's overhead per cell), ``bench_masks.py`` (building masks),
    ``bench_cp.py`` (CP strategies), ``bench_triton_block_sparse.py`` (LongCA's Triton kernel),
    ``cell_cost.py`` (what a kernel cell costs from nothing, part by part).

Shared: ``workflow_config`` (the workflow's config as a run resolves it) and ``timing_series``'s cell
names and settings (``memory_order``, ``memory_ways``, ``peak_memory``).
"""
