"""The lab: studies of LongCA itself, how its published tables were measured and checked.

``longca`` is the benchmark a user runs; this package is what the project ran on GPUs to check that
the workflow measures what a bare loop measures, and to study its costs.  It reaches the tool through
``longca.api`` only (tests/test_lab_boundary.py checks that, and that ``longca`` never imports it).
Each module is a script, ``python lab/longca_lab/<name>.py --help``, whose functions the lab's tests
import as ``longca_lab.<name>``; ``pip install -e lab`` installs it beside ``longca`` (lab/README.md).
The scripts a user of the tool runs (the grid within a time budget, building kernels, rendering a
published run, comparing two GPUs, the full-size checks) are in ``scripts/``, not here.

Comparing tables
    ``run_to_run.py`` (one table measured twice), ``magi_blog_figures.py``
    (the MagiAttention blog's charts as numbers), ``cp_summary.py`` (a CP table's best strategies
    and its ratios to another CP table).
Checking the measurement
    ``bench_pipeline.py`` (the workflow against a bare loop), ``bench_kernels.py`` (the harness against
    a bare loop), ``timing_series.py`` (every timing sample), ``peak_memory.py``, ``memory_order.py``
    and ``memory_ways.py`` (what the memory figure counts, and its two ways of reading it),
    ``cp_model_check.py`` and ``collective_bandwidth.py`` (``longca predict``'s model against the
    published CP tables, and the collectives it is fitted on).
Costs of the tool itself
    ``bench_workflow.py`` (the workflow's overhead per cell), ``bench_masks.py`` (building masks),
    ``bench_cp.py`` (CP strategies), ``bench_triton_block_sparse.py`` (LongCA's Triton kernel),
    ``cell_cost.py`` (what a kernel cell costs from nothing, part by part).

Shared: ``workflow_config`` (the workflow's config as a run resolves it) and ``timing_series``'s cell
names and settings (``memory_order``, ``memory_ways``, ``peak_memory``).
"""
