"""The configs and scripts that produce published results: config/gpu.yaml and render_results."""

import hashlib
import json
import re
import subprocess
import sys

import pandas as pd
import pytest

from snakemake_run import REPO

from longca.api import config, kernels
from longca.api import masks
from longca.api import cell


def test_gpu_config_is_the_paper_scale_grid():
    cfg = config.validate(config.merge_files([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"]))
    # Every kernel LongCA has except the unfused reference (its scores alone need ~275 GB at 32K), the
    # block-sparse kernels that run only per-head patterns (config/sparse.yaml's study) and FlashMask
    # (Paddle's: added by `--config kernels=[...]` where a Paddle GPU build is; in the grid it would
    # leave every published table 448 cells short of complete), and the deterministic-backward variants
    # (a comparison with their default kernel, measured beside it: fp8_deterministic_h200_2026-11-29's
    # stage; in the grid they would add a backward per cell of two kernels to every table).
    per_head_only = {n for n in kernels.names() if getattr(kernels.get(n), "head_masks", False)}
    assert per_head_only == {"ffa_block_sparse", "flex_block_sparse", "vsa_triton", "vsa_cuda", "flashinfer_block_sparse"}
    variants = {n for n in kernels.names() if kernels.get(n).deterministic}
    assert variants == {"flash_attn3_deterministic", "cudnn_fe_deterministic"}
    assert set(cfg["kernels"]) == set(kernels.names()) - {"sdpa_math", "flashmask"} - per_head_only - variants - {
        n for n in kernels.names() if n.startswith("test_")}
    assert {e.name for e in config.mask_entries(cfg)} == set(masks.PATTERNS)
    assert min(cfg["seqlens"]) == 1024 and max(cfg["seqlens"]) >= 32768
    assert (cfg["dtypes"], cfg["batch"], cfg["heads_q"], cfg["heads_kv"], cfg["head_dim"]) == \
        (["bfloat16"], 1, 64, 8, 128)
    assert set(cfg["directions"]) == {"fwd", "bwd"}
    # The CUDA defaults: timed by budget, in a resident measuring process.
    assert (cfg["timing"]["warmup_ms"], cfg["timing"]["warmup_max_ms"], cfg["timing"]["rep_ms"]) == (25, 1000, 100)
    assert cfg["isolation"] == "resident"
    # CP at every size up to a node: one GPU measures cp_size 1, the rest are rows saying what they need.
    # LongCA's six strategies, PyTorch's and MagiAttention's own CP beside them.
    assert set(cfg["cp_strategies"]) == {"ring", "allgather", "ulysses", "usp", "double_ring", "groupcast",
                                         "torch_cp", "magi"}
    assert cfg["cp_sizes"] == [1, 2, 4, 8]


def test_render_results_reports_exactly_the_cells_that_finished(tmp_path):
    """A run can stop mid-grid (its time budget): the published report shows the finished cells and nothing else."""
    cells = tmp_path / "results" / "cells" / "kernels"
    for mask in ("full", "causal"):
        out = cells / "sdpa" / mask / "float32_fwd_128.json"
        out.parent.mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "longca", "run-cell", "--kernel", "sdpa", "--mask", mask, "--seqlen",
                        "128", "--heads-q", "2", "--heads-kv", "2", "--head-dim", "16", "--gate-seqlen", "64",
                        "--reps", "2", "--isolation", "none", "--out", str(out)], check=True, cwd=REPO)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "render_results.py"), str(tmp_path / "results"),
                           str(tmp_path / "published")], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    published = tmp_path / "published"
    rows = pd.read_parquet(published / "kernels.parquet")
    assert sorted(rows["mask"]) == ["causal", "full"] and (rows["status"] == "ok").all()
    html = (published / "report.html").read_text()
    assert "sdpa/full/float32_fwd_128" in html and "sdpa/causal/float32_fwd_128" in html
    assert (published / "figures" / "kernels_full.png").exists()
    assert not (published / "figures" / "kernels_varlen_causal.png").exists()  # no cells, no figure
    # Rendered with the config of a grid these two cells only start: the report and not_measured.txt
    # name the grid's cells that have no row, and the figures and answers leave them out.
    grid = tmp_path / "grid.yaml"
    grid.write_text("kernels: [sdpa]\nmasks: [full, causal, sliding_window]\nseqlens: [128]\ndirections: [fwd]\n"
                    "dtypes: [float32]\nheads_q: 2\nheads_kv: 2\nhead_dim: 16\ngate_seqlen: 64\ncp_strategies: []\n")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "render_results.py"), str(tmp_path / "results"),
                           str(tmp_path / "partial"), "--config", str(grid)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 cells of the grid have no row (not_measured.txt)" in proc.stdout
    listed = (tmp_path / "partial" / "not_measured.txt").read_text().splitlines()
    assert [line for line in listed if not line.startswith("#")] == ["sdpa/sliding_window/float32_fwd_128"]
    html = (tmp_path / "partial" / "report.html").read_text()
    assert 'id="not-measured"' in html and "1 cells of this grid have no row yet (sdpa 1)" in html
    assert "<code>sdpa/sliding_window/float32_fwd_128</code>" in html
    assert not (tmp_path / "partial" / "figures" / "kernels_sliding_window.png").exists()
    # Kernel cells restored from an archive have no CP cells: --cp keeps a published CP table beside them.
    cp = REPO / "docs/results/h100_2026-11-23/cp.parquet"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "render_results.py"), str(tmp_path / "results"),
                           str(tmp_path / "with_cp"), "--cp", str(cp)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(pd.read_parquet(tmp_path / "with_cp" / "cp.parquet")) == len(pd.read_parquet(cp)) > 0
    assert "kernel cells, " + str(len(pd.read_parquet(cp))) + " CP cells" in proc.stdout


def _without_images_and_stamp(html: str) -> str:
    html = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "IMG", html)  # figures' bytes vary with matplotlib
    html = re.sub(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC", "generated", html)
    # "This report was built with": the machine that renders (its OS kernel, Python), not the data.
    return re.sub(r'<table id="report-software">.*?</table>', "BUILT-WITH", html, flags=re.S)


# A published run's report is not committed: scripts/render_results.py rebuilds it from the run's
# kernels.parquet (the command on its page).  What the report said when it was published is kept as
# the SHA-256 of its text without the figures' bytes, the generation time and the renderer's software
# (_without_images_and_stamp), first taken from the report.html committed until 99241b7, now as the
# report's code renders it from the committed Parquet: a rebuild must give that text back, every
# table, number and winner.  The report's code changed since the reports were first published
# (figure sections from longca/results/figures.py; shape, model and reproduce columns; the memory
# model's columns) and the table it renders did not (kernels.parquet round-trips byte for byte
# below): a change to the report's code re-publishes these digests, as it re-rendered the committed
# reports before.
PUBLISHED_REPORTS = {
    "h100_2026-11-23": (3360, 288, "bd77735e9b9c99ac101e494464dd47c34f3cded1175a73ccbaf600564aecea08"),
    "h200_2026-11-23": (3360, 0, "5f551744eb74fc74e947b5a2526c60676f29eb0031b915c622470e71f34f19f5"),
    "sparse_h100_2026-11-27": (470, 0, "c547f6f692d0a53b0f5368dd54205b42fd367311293694d531717419976296cc"),
    "sparse_h200_2026-11-27": (484, 0, "b34ed74b0623405413cdec692a5e1b114ec7c2f4e226b6d32dd75a461fa3cfba"),
    "sparse_variable_2026-11-28/h100": (200, 0, "76c1f2d727ba1cb4981cacb91f5e575adac979a62044355e878b544b8da67fac"),
    "sparse_variable_2026-11-28/h200": (200, 0, "21d7e6a6c22a3fd4a2a854d141f083bcdfe8fe4b9b341b9b68e78455c0212895"),
}


def _shown_figures(run: str) -> set[str]:
    """The images the run's page (its README.md, else its folder's) shows from the run's folder: their
    names, which a rebuild must draw again under figures/."""
    folder = REPO / "docs" / "results" / run
    page = folder / "README.md" if (folder / "README.md").is_file() else folder.parent / "README.md"
    shown = set()
    for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", page.read_text()):
        path = (page.parent / target).resolve()
        if folder.resolve() in path.parents:
            shown.add(path.name)
    return shown


def _render_command(run: str) -> str:
    """The rebuild command as the run's page states it."""
    published = f"docs/results/{run}"
    return (f"python scripts/render_results.py {published}/kernels.parquet OUT --config config/gpu.yaml "
            f"{published}/overrides.yaml")


@pytest.mark.slow
@pytest.mark.parametrize(("run", "cells", "cp_cells", "digest"),
                         [(run, *v) for run, v in PUBLISHED_REPORTS.items()])
def test_a_fresh_clone_renders_the_published_report_from_the_committed_parquet(tmp_path, run, cells, cp_cells,
                                                                             digest):
    """A published run: the committed kernels.parquet (and cp.parquet beside it) alone gives back
    its report (every table, number and winner; the figures' pixels and the generation time aside),
    by the command its page states, with every figure its page shows."""
    published = REPO / "docs" / "results" / run
    page = published / "README.md" if (published / "README.md").is_file() else published.parent / "README.md"
    command = _render_command(run)
    assert command in " ".join(page.read_text().replace("`", " ").split()), "the page states no rebuild command"
    proc = subprocess.run([sys.executable, *command.replace("OUT", str(tmp_path / "again")).split()[1:]],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{cells} kernel cells, {cp_cells} CP cells" in proc.stdout
    again = (tmp_path / "again" / "report.html").read_text()
    assert hashlib.sha256(_without_images_and_stamp(again).encode()).hexdigest() == digest, \
        "the rebuilt report differs from the published one"
    assert (tmp_path / "again" / "kernels.parquet").read_bytes() == (published / "kernels.parquet").read_bytes()
    # The cells the table lacks are derived from it and its grid: the committed list is that list.
    gaps = [p / "not_measured.txt" for p in (tmp_path / "again", published)]
    assert [g.exists() for g in gaps] == [gaps[1].exists()] * 2
    assert not gaps[1].exists() or gaps[0].read_text() == gaps[1].read_text()
    assert sorted(p.name for p in (tmp_path / "again" / "figures").glob("kernels_*.png")) == \
        sorted(f"kernels_{m}.png" for m in set(pd.read_parquet(published / "kernels.parquet")["mask"]))
    drawn = {p.name for p in (tmp_path / "again" / "figures").glob("*.png")}
    assert _shown_figures(run) <= drawn, sorted(_shown_figures(run) - drawn)


TABLES = ["h100_2026-11-23", "h200_2026-11-23"]


def _table(run: str) -> pd.DataFrame:
    return pd.read_parquet(REPO / "docs" / "results" / run / "kernels.parquet")


@pytest.mark.parametrize("run", TABLES)
def test_a_published_table_holds_every_cell_of_its_grid_gated(run):
    """What the issue's check asks of a published table: each row a cell of its grid, once, and no
    cell left out (an oom or unsupported cell is a row, not a gap) but those its not_measured.txt
    names, exactly (a table a run has not finished says which cells it lacks); every ok row passed
    the correctness gate and was timed."""
    published = REPO / "docs" / "results" / run
    grid = config.validate(config.merge_files([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml", published / "overrides.yaml"]))
    grid_cells = {c.name for c in config.kernel_cells(grid)}
    table = _table(run)
    gaps = published / "not_measured.txt"
    declared = ({line for line in gaps.read_text().splitlines() if line and not line.startswith("#")}
                if gaps.exists() else set())
    assert table["cell_id"].is_unique
    assert not set(table["cell_id"]) - grid_cells, "rows that are no cell of the grid"
    assert not declared & set(table["cell_id"]), "cells named not measured that have a row"
    assert set(table["cell_id"]) | declared == grid_cells, sorted(grid_cells - set(table["cell_id"]) - declared)[:5]
    ok = table[table["status"] == "ok"]
    assert len(ok) and (ok["gate_error"] <= ok["gate_tolerance"]).all()
    assert (ok["median_ms"] > 0).all() and ok["p20_ms"].le(ok["p80_ms"]).all()
    assert set(table["status"]) <= set(cell.STATUSES)


@pytest.mark.parametrize("run", TABLES)
def test_every_ok_published_row_was_gated_with_its_masks_structure_and_states_its_memory(run):
    """The gate's bar: every ok row records the gate's length and the attended pairs of the mask it
    was gated with, and no pattern but full and causal was gated as full or as causal (at the
    gate's length a window, a document or a prefix must still change the mask); each states the
    memory one call needs."""
    ok = _table(run).query("status == 'ok'")
    assert ok["gate_seqlen"].notna().all() and ok["gate_area"].notna().all()
    assert (ok["peak_mem_bytes"] > 0).all()
    n = ok["gate_seqlen"].astype("int64")
    structured = ~ok["pattern"].isin(["full", "causal"])
    as_full_or_causal = ok["gate_area"].eq(n * n) | ok["gate_area"].eq(n * (n + 1) // 2)
    assert not (structured & as_full_or_causal).any(), \
        sorted(ok.loc[structured & as_full_or_causal, "cell_id"])[:5]


def test_the_published_memory_of_a_cell_agrees_on_both_gpus():
    """Memory a user can plan with: a cell's need is the same on an H100 and an H200 (within 5 %)
    in at least 95 % of the cells ok on both."""
    h100, h200 = (_table(run).set_index("cell_id") for run in TABLES)
    both = h100.index[(h100["status"] == "ok") & h200["status"].reindex(h100.index).eq("ok")]
    ratio = h100.loc[both, "peak_mem_bytes"] / h200.loc[both, "peak_mem_bytes"]
    assert len(both) > 2000 and ((ratio - 1).abs() <= 0.05).mean() >= 0.95


def test_each_kernel_mask_and_direction_ok_in_a_table_passed_the_full_size_check():
    """The full-size check (scripts/full_check.py at 8K, against float32 attention) is published
    beside the tables: each kernel × mask × direction with an ok row in either table was checked
    there, and was right."""
    checked = {}
    # checks.parquet: one row per check file full_check.py wrote (its "row", "code" and "settings"), in
    # the order the archive listed them, so a check run again later overrides the earlier one as before.
    checks = pd.read_parquet(REPO / "docs" / "results" / "full_check_h200_2026-11-26" / "checks.parquet")
    for row in checks.itertuples():
        checked[(row.kernel, row.mask, row.direction)] = row.status
    assert "wrong" not in checked.values()
    for run in TABLES:
        ok = _table(run).query("status == 'ok'")
        unchecked = {k for k in zip(ok["kernel"], ok["mask"], ok["direction"]) if checked.get(k) != "ok"}
        assert not unchecked, (run, sorted(unchecked)[:5])


def test_render_results_names_a_missing_parquet(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "render_results.py"),
                           str(tmp_path / "nope" / "kernels.parquet"), str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "nope/kernels.parquet: no such file" in proc.stderr


@pytest.mark.parametrize("stage", sorted((REPO / "docs" / "results").glob("*/overrides_*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_published_stage_measures_cells_of_its_table_with_the_table_settings(stage):
    """A stage file (gpu_grid.sh --overrides) narrows the published grid: it must name only cells of
    that run's table (config/gpu.yaml + its overrides.yaml) and give each the settings the table
    keeps, or its rows would be cells of another grid (and restore_cells.py would drop them).  A
    stage narrows the table's grid as it was: over its overrides (the kernels it had then)."""
    grid = [REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml", stage.parent / "overrides.yaml"]
    table = config.validate(config.merge_files(grid))
    narrowed = config.validate(config.merge_files(grid + [stage]))
    table_cells = set(config.kernel_cells(table))
    cells = list(config.kernel_cells(narrowed))
    assert cells, f"{stage.name} names no cell"
    assert not set(cells) - table_cells, f"{stage.name}: cells outside the table"
    for c in cells:
        args = (c.kernel, c.mask, c.seqlen, c.direction, c.dtype)
        assert config.cell_settings(narrowed, *args) == config.cell_settings(table, *args), (stage.name, c)


CP_TABLES = [REPO / "docs" / "results" / name
             for name in ("cp_4xh100_2026-11-27", "cp_4xh100_graphs_2026-11-27", "cp_2xh200_2026-11-27",
                          "cp_4xh100_magi_2026-11-27", "cp_4xh200_2026-11-27", "cp_4xh100_64k_2026-11-27",
                          "cp_groupcast_4xh100_2026-11-28")]
# Strategies that are a library's own CP (its own dispatch and local calls), not LongCA's blocks.
LIBRARY_CP = ("torch_cp", "magi")
# ok rows at cp_size 2 and 4 a table holds: the publications at least 150 (the bar); the
# 64K table re-measures three masks after a change to the local call, and the groupcast table
# compares four strategies, so they have fewer.
MIN_OK_ABOVE_ONE = {"cp_4xh100_64k_2026-11-27": 113, "cp_groupcast_4xh100_2026-11-28": 128}


@pytest.mark.parametrize("table_dir", CP_TABLES, ids=lambda p: p.name)
def test_a_published_cp_table_is_cells_of_its_grid_gated_and_timed_by_the_slowest_rank(table_dir):
    """A published CP table: each row a cell of its grid (config/gpu.yaml + its overrides.yaml) with the
    settings that grid gives it; every ok row passed the gate, its time is the slowest rank's (per
    step the max over ranks, so its median is at least every rank's own median), its per-GPU
    TFLOPs/s is FLOPs / cp_size / that time; at least 150 ok rows at cp_size 2 and 4; our strategies
    ran FFA one call per block (the row says so)."""
    grid = config.validate(config.merge_files([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml",
                                               table_dir / "overrides.yaml"]))
    cells = {c.name: c for c in config.cp_cells(grid)}
    table = pd.read_parquet(table_dir / "cp.parquet")
    assert table["cell_id"].is_unique and set(table["cell_id"]) <= set(cells)
    for row in table.itertuples():
        c = cells[row.cell_id]
        settings = config.cp_cell_settings(grid, c.strategy, c.mask, c.tokens_per_rank, c.cp_size, c.direction,
                                           c.dtype)
        assert json.loads(row.strategy_options) == settings.get("strategy_options", {}), row.cell_id
        assert (row.seqlen, row.cp_size) == (settings["seqlen"], settings["cp_size"]), row.cell_id
    ok = table[table["status"] == "ok"]
    assert set(table["status"]) <= {"ok", "unsupported"}
    assert (ok["gate_error"] <= ok["gate_tolerance"]).all()
    assert all(m >= max(r) * (1 - 1e-9) for m, r in zip(ok["median_ms"], ok["rank_median_ms"]))
    per_gpu = ok["flops"] / ok["cp_size"] / (ok["median_ms"] * 1e-3) / 1e12
    assert ((per_gpu / ok["tflops_per_gpu"] - 1).abs() < 1e-9).all()
    assert len(ok[ok["cp_size"] > 1]) >= MIN_OK_ABOVE_ONE.get(table_dir.name, 150)
    ours = ok[~ok["strategy"].isin(LIBRARY_CP)]
    assert set(ours["local_kernel"]) == {"ffa"}
    assert {json.loads(n)["local_calls"] for n in ours["notes"]} == {"fused"}
    if "timed_via" in table.columns and table["cuda_graph"].any():  # timed as the kernels are
        assert (ok["timed_via"] == "graph").all() and ok["host_ms"].notna().all()
        assert grid["timing"]["cuda_graph"] and ok["cuda_graph"].all()


@pytest.mark.parametrize("page, kernel_table", [(CP_TABLES[1], "h100_2026-11-23"), (CP_TABLES[2], "h200_2026-11-23"),
                                                (CP_TABLES[3], "h100_2026-11-23"), (CP_TABLES[4], "h200_2026-11-23"),
                                                (CP_TABLES[5], "h100_2026-11-23"), (CP_TABLES[6], "h100_2026-11-23")],
                         ids=lambda p: getattr(p, "name", p))
def test_the_cp_pages_best_strategy_table_is_what_its_parquet_says(page, kernel_table):
    """The table on a graph-timed CP page is lab/longca_lab/cp_summary.py's output on the committed
    Parquet and the kernel table of the same GPU model, line for line."""
    from longca_lab.cp_summary import best_table
    from longca.api import parquet

    table = best_table(parquet.load(page / "cp.parquet"),
                       parquet.load(REPO / "docs" / "results" / kernel_table / "kernels.parquet"), 0.05)
    assert table in (page / "README.md").read_text()


def test_the_4xh200_cp_table_is_run_1_completed_by_run_2_and_its_run_to_run_page_is_the_scripts():
    """cp_4xh200: each run's own table is committed; the published one is run 1's rows plus run 2's
    for the cells run 1 did not reach, and run_to_run.md is lab/longca_lab/run_to_run.py on the two."""
    from longca_lab.run_to_run import summary
    from longca.api import parquet

    page = CP_TABLES[4]
    table, run1, run2 = (parquet.load(page / f) for f in ("cp.parquet", "cp_run1.parquet", "cp_run2.parquet"))
    only_run2 = run2[~run2["cell_id"].isin(run1["cell_id"])]
    assert len(only_run2) > 0 and len(table) == len(run1) + len(only_run2)
    expected = pd.concat([run1, only_run2]).set_index("cell_id").sort_index()
    got = table.set_index("cell_id").sort_index()
    assert got.index.equals(expected.index)
    assert (got["median_ms"].fillna(-1) == expected["median_ms"].fillna(-1)).all()
    assert summary(run1, run2) in (page / "run_to_run.md").read_text()


@pytest.mark.parametrize("run", ["sparse_h100_2026-11-27", "sparse_h200_2026-11-27"])
def test_the_sparse_page_quotes_its_table(run):
    """The sparse study's page prints what lab/longca_lab/sparse_summary.py computes from the committed
    Parquet (its report is rebuilt from it above)."""
    from longca_lab import sparse_summary

    published = REPO / "docs" / "results" / run
    table = sparse_summary.kernel_table(pd.read_parquet(published / "kernels.parquet"), 0.05)
    assert table in (published / "README.md").read_text()
    assert table.count("\n") == 41  # header rule + 40 groups: 2 blocks x 5 fractions x 2 lengths x 2 directions
