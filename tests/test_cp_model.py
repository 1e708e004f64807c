"""``longca predict``'s model (longca/results/cp_model.py) against the published CP tables: its byte
formulas are what the strategies counted, it reproduces the cp_size-1 rows it was fitted on, and the command
refuses what it cannot model with a message (the published check page: lab/tests/test_cp_model_check.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from longca.results import cp_model

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
TABLES = [("cp_4xh100_graphs_2026-11-27", "h100_2026-11-23"), ("cp_2xh200_2026-11-27", "h200_2026-11-23")]


@pytest.mark.parametrize("cp_dir, kernel_dir", TABLES)
def test_the_byte_formulas_are_what_each_strategy_sent(cp_dir, kernel_dir):
    cp = pd.read_parquet(RESULTS / cp_dir / "cp.parquet")
    checked = 0
    for row in cp[(cp["status"] == "ok") & (cp["cp_size"] > 1)].itertuples():
        sent = cp_model.sent_bytes(row.strategy, row.direction, row.cp_size, row.tokens_per_rank, row.heads_q,
                                   row.heads_kv, row.head_dim)
        if sent is None:
            continue
        checked += 1
        # A document mask's row adds a few KiB of range metadata to the K/V shards.
        assert sent["overlap"] + sent["wait"] == pytest.approx(row.comm_bytes, rel=1e-3), row.cell_id
    assert checked >= 100


def test_ulysses_replicates_kv_heads_beyond_the_kv_head_count():
    q, kv = cp_model.shard_bytes(1024, 64, 8, 128)
    at8 = cp_model.sent_bytes("ulysses", "fwd", 8, 1024, 64, 8, 128)["wait"]
    at16 = cp_model.sent_bytes("ulysses", "fwd", 16, 1024, 64, 8, 128)["wait"]
    assert at8 == pytest.approx(7 / 8 * (2 * q + kv))
    assert at16 == pytest.approx(15 / 16 * (2 * q + 2 * kv))


def test_a_ring_across_nodes_goes_at_the_networks_speed():
    links = cp_model.Links(nvlink_gbs=200.0, gpus_per_node=8, network_gbs=50.0)
    assert cp_model.comm_seconds(1e9, 8, links, "ring") == pytest.approx(1 / 200)
    assert cp_model.comm_seconds(1e9, 16, links, "ring") == pytest.approx(1 / 50)
    # An all-to-all over 16 ranks: 8 of 15 peers are outside the node.
    assert cp_model.comm_seconds(1e9, 16, links, "a2a") == pytest.approx(8 / 15 / 50)


def test_the_model_reproduces_the_cp_size_1_rows_it_was_fitted_on():
    """At cp_size 1 nothing moves and the efficiency is fitted on the row itself: the model gives the
    measured figure back, for every strategy, mask, direction and length."""
    cp = pd.read_parquet(RESULTS / "cp_2xh200_2026-11-27" / "cp.parquet")
    kernels = pd.read_parquet(RESULTS / "h200_2026-11-23" / "kernels.parquet")
    model = cp_model.fit(cp, kernels, cp["cp_size"] > 1)
    one = cp[(cp["status"] == "ok") & (cp["cp_size"] == 1) & cp["strategy"].isin(list(cp_model.BYTES))]
    checked = 0
    for row in one.itertuples():
        step = model.step(cp_model.Cell.from_row(row))
        if step["why"] is not None:
            assert (row.strategy, row.direction) == ("double_ring", "bwd"), step["why"]
            continue
        checked += 1
        assert step["tflops_per_gpu"] == pytest.approx(row.tflops_per_gpu, rel=1e-9), row.cell_id
    assert checked >= 100
    magi = cp[(cp["strategy"] == "magi") & (cp["status"] == "ok")].iloc[0]
    assert model.step(cp_model.Cell.from_row(magi))["why"].startswith("MagiAttention sends only")


def test_tiles_count_what_a_tiled_kernel_touches():
    from longca.attention import masks

    assert cp_model.tiles(masks.build("full", 1024).slices) == (64, 1024)
    assert cp_model.tiles(masks.build("causal", 1024).slices) == (36, 1024)  # 8 × 9 / 2
    doc = masks.build("varlen_causal", 8192, seed=1)
    touched, _ = cp_model.tiles(doc.slices)
    assert doc.area() / cp_model.TILE ** 2 < touched < 2 * doc.area() / cp_model.TILE ** 2


def _predict(*args):
    return subprocess.run([sys.executable, "-m", "longca", "predict",
                           "--cp", str(RESULTS / "cp_4xh100_graphs_2026-11-27" / "cp.parquet"),
                           "--kernels", str(RESULTS / "h100_2026-11-23" / "kernels.parquet"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_predict_prints_a_row_per_strategy_and_size_and_refuses_what_it_cannot_model():
    out = _predict("--mask", "causal", "--cp-sizes", "8", "64", "--strategies", "ring", "ulysses", "magi")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("# predicted, not measured")
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [(s, p) for p in ("8", "64") for s in ("ring", "ulysses", "magi")]
    assert all(float(r[2]) > 0 for r in rows if r[0] != "magi")
    assert all("not modelled" in " ".join(r) for r in rows if r[0] == "magi")
    bad = _predict("--mask", "nope")
    assert bad.returncode == 2 and "mask 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    bad = _predict("--strategies", "warp_drive")
    assert bad.returncode == 2 and "'warp_drive'" in bad.stderr


def test_predict_refuses_what_the_strategy_refuses_and_marks_the_best():
    """Ulysses at 96 GPUs: 96 does not divide the 64 query heads, so no figure; ring there has one."""
    out = _predict("--strategies", "ulysses", "ring", "--cp-sizes", "8", "96")
    assert out.returncode == 0, out.stderr
    rows = {tuple(line.split()[:2]): line for line in out.stdout.splitlines()[2:]}
    assert rows[("ulysses", "96")].split(None, 2)[2] == "refused: Ulysses degree 96 does not divide the 64 query heads"
    assert float(rows[("ring", "96")].split()[2]) > 0
    for size in ("8", "96"):  # one best per size, marked
        assert [line.split()[3] for (s, p), line in rows.items() if p == size and "refused" not in line].count("*") == 1


def test_predict_names_a_missing_or_swapped_table_and_survives_a_closed_pipe(tmp_path):
    missing = _predict_tables(tmp_path / "nosuch.parquet", RESULTS / "h100_2026-11-23" / "kernels.parquet")
    assert missing.returncode == 2 and "nosuch.parquet: no such file" in missing.stderr
    swapped = _predict_tables(RESULTS / "h100_2026-11-23" / "kernels.parquet",
                              RESULTS / "cp_4xh100_graphs_2026-11-27" / "cp.parquet")
    assert swapped.returncode == 2 and "not a cp table" in swapped.stderr and "Traceback" not in swapped.stderr
    piped = subprocess.run(f"{sys.executable} -m longca predict --cp {RESULTS / 'cp_4xh100_graphs_2026-11-27' / 'cp.parquet'} "
                           f"--kernels {RESULTS / 'h100_2026-11-23' / 'kernels.parquet'} | head -1",
                           shell=True, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert piped.stdout.startswith("# predicted, not measured") and "Traceback" not in piped.stderr, piped.stderr


def _predict_tables(cp, kernels):
    return subprocess.run([sys.executable, "-m", "longca", "predict", "--cp", str(cp), "--kernels", str(kernels)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_the_prediction_figure_draws_predicted_measured_and_published_series():
    from longca.results import plots

    predicted = pd.DataFrame({"strategy": ["ring"] * 3, "cp_size": [1, 8, 64], "tflops_per_gpu": [500, 400, None]})
    measured = pd.DataFrame({"strategy": ["ring"], "cp_size": [1], "tflops_per_gpu": [510.0]})
    published = pd.DataFrame({"strategy": ["ring"], "cp_size": [8], "tflops_per_gpu": [420.0], "label": ["theirs"]})
    fig = plots.cp_prediction_figure(predicted, measured, "t", published)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["ring (predicted)", "ring (measured)", "theirs"]
    assert list(fig.axes[0].get_lines()[0].get_xdata()) == [1, 8]  # no point where the model gives none


def test_slice_tiles_counts_the_tiles_a_dense_slice_touches():
    """Against a count on the slice's dense pattern: per 128-row tile, the key tiles from its first
    to its last attended column, for every kind of slice at random shapes and offsets."""
    import numpy as np

    from longca.attention.masks import AttnSlice, SliceKind

    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(200):
        q0, lq, k0, lk = (int(x) for x in rng.integers([0, 1, 0, 1], [300, 600, 300, 600]))
        kind = list(SliceKind)[int(rng.integers(0, 4))]
        s = AttnSlice(q0, q0 + lq, k0, k0 + lk, kind)
        if s.area() == 0:
            continue
        dense = s.dense().numpy()
        expected = 0
        for a in range(0, lq, cp_model.TILE):
            cols = np.flatnonzero(dense[a:a + cp_model.TILE].any(0))
            if cols.size:
                expected += cols.max() // cp_model.TILE - cols.min() // cp_model.TILE + 1
        assert cp_model.slice_tiles(s) == expected, s
        checked += 1
    assert checked >= 100


@pytest.mark.slow
def test_the_reports_model_figure_predicts_from_the_runs_tables_or_says_why_not():
    from longca.results import plots

    cp = pd.read_parquet(RESULTS / "cp_4xh100_graphs_2026-11-27" / "cp.parquet")
    kernels = pd.read_parquet(RESULTS / "h100_2026-11-23" / "kernels.parquet")
    result = cp_model.report_prediction(cp, kernels, "causal")
    assert set(result["predicted"]["cp_size"]) == {1, 2, 4, 8, 16, 32, 64, 96}
    assert "a model, not a measurement" in result["caption"]
    assert "fitted without cp_size 4 and checked on its" in result["caption"]
    fig = plots.cp_model_figure(cp, kernels, "causal")
    labels = {line.get_label() for line in fig.axes[0].get_lines()}
    assert "ring (predicted)" in labels and "ring (measured)" in labels
    only_one = cp[cp["cp_size"] == 1]
    assert cp_model.report_prediction(only_one, kernels, "causal")["why"].startswith("no prediction")
    no_ffa = kernels[kernels["kernel"] != "ffa"]
    assert "no ok ffa row on the full mask" in cp_model.report_prediction(cp, no_ffa, "causal")["why"]


def test_predict_sets_a_tables_measured_exposed_communication_beside_the_models(tmp_path):
    # The published tables predate cp_exposed_comm: two rows are given measured values here, to see
    # them printed beside the model's figure for the same cells; the rest print nothing.
    cp = pd.read_parquet(RESULTS / "cp_4xh100_graphs_2026-11-27" / "cp.parquet")
    pick = cp[(cp["status"] == "ok") & (cp["strategy"] == "ring") & (cp["mask"] == "causal")].index[:2]
    cp["exposed_comm_ms"] = None
    cp["step_ms_local_comm_p20"] = cp["step_ms_local_comm_p80"] = None
    cp.loc[pick, "exposed_comm_ms"] = [0.125, 0.25]
    cp.loc[pick, "step_ms_local_comm_p20"] = 1.0
    cp.loc[pick, "step_ms_local_comm_p80"] = 1.5
    for column in ("exposed_comm_ms", "step_ms_local_comm_p20", "step_ms_local_comm_p80"):
        cp[column] = cp[column].astype(float)
    path = tmp_path / "cp.parquet"
    cp.to_parquet(path)
    out = _predict_tables(path, RESULTS / "h100_2026-11-23" / "kernels.parquet")
    assert out.returncode == 0, out.stderr
    measured = [line for line in out.stdout.splitlines() if line.startswith("ring") and ("0.125" in line or "0.250" in line)]
    assert len(measured) == 2 and "# measured, the fitted table's rows" in out.stdout
    plain = _predict()
    assert "# measured" not in plain.stdout
