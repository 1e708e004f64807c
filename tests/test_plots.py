"""Figures: what is drawn where (bars, status markers, ceiling lines, CP efficiency), on synthetic rows."""

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest
import report_data as rd
from matplotlib.patches import Rectangle

from longca.results import plots


def _markers(fig):
    return sorted(t.get_text() for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith("marker-"))


def _bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]


def _legend_texts(fig):
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


@pytest.fixture(scope="module")
def kernels():
    return rd.kernels_df()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_throughput_bars_only_for_correct_cells_and_markers_for_the_rest(kernels):
    fig = plots.kernel_throughput_figure(kernels, "sliding", rd.CEILINGS)
    fwd, bwd = fig.axes[:2]
    assert fwd.get_title() == "sliding — forward" and bwd.get_title() == "sliding — backward"
    sub = kernels[kernels["mask"] == "sliding"]
    for ax, direction in ((fwd, "fwd"), (bwd, "bwd")):
        ok = sub[(sub["direction"] == direction) & (sub["status"] == "ok")]
        assert sorted(round(b.get_height(), 6) for b in _bars(ax)) == sorted(round(v, 6) for v in ok["tflops"])
    # fast_kernel: error at 128 and timeout at 256 forward, wrong at 64 backward; never_kernel unsupported.
    assert _markers(fig) == sorted(["!", "T", "W"] + ["X"] * 6)
    assert [t.get_text() for t in fwd.get_xticklabels()] == ["64", "128", "256"]


def test_throughput_draws_the_ceiling_and_a_legend_for_every_marker(kernels):
    fig = plots.kernel_throughput_figure(kernels, "causal", rd.CEILINGS)
    for ax in fig.axes[:2]:
        lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("matmul ceiling")]
        assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(3.0)
        assert ax.get_ylim()[1] >= 3.0
    legend = _legend_texts(fig)
    assert {"fast_kernel", "slow_kernel", "never_kernel"} <= set(legend)
    assert any(t.startswith("matmul ceiling, bfloat16: 3 TFLOPs/s") for t in legend)
    for marker, label in (("X", "unsupported"), ("E", "out of memory"), ("W", "failed correctness"),
                          ("!", "error / crashed"), ("T", "timed out")):
        assert f"{marker} = {label}" in legend
    assert _markers(fig).count("E") == 2  # slow_kernel at 256, forward and backward


def test_no_ceiling_line_without_a_measurement_for_the_dtype(kernels):
    for ceilings in (None, {"matmul": [{**rd.CEILINGS["matmul"][0], "dtype": "float16"}]}):
        fig = plots.kernel_throughput_figure(kernels, "causal", ceilings)
        assert not [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_label().startswith("matmul")]


def test_each_dtype_gets_its_own_row_of_panels():
    df = rd.kernels_df(dtypes=("bfloat16", "float16"))
    fig = plots.kernel_throughput_figure(df, "causal", rd.CEILINGS)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["causal — forward — bfloat16", "causal — backward — bfloat16",
                      "causal — forward — float16", "causal — backward — float16"]
    # The bfloat16 ceiling is drawn on the bfloat16 panels only.
    assert [bool([ln for ln in ax.get_lines() if ln.get_label().startswith("matmul")]) for ax in fig.axes] == \
        [True, True, False, False]


def test_memory_lines_per_kernel_on_gpu_and_a_note_on_cpu(kernels):
    fig = plots.kernel_memory_figure(kernels, "causal")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"fast_kernel", "slow_kernel"}
    assert list(lines["fast_kernel"].get_ydata()) == [64, 128, 256]  # MiB
    assert ax.get_yscale() == "log"
    assert _markers(fig).count("E") == 2 and _markers(fig).count("X") == 6

    cpu = plots.kernel_memory_figure(rd.kernels_df(device="cpu"), "causal")
    assert "recorded on GPU only" in " ".join(t.get_text() for t in cpu.texts)


def test_matrix_holds_the_best_value_per_kernel_and_mask(kernels):
    best = plots.best_per_kernel_mask(kernels).set_index(["direction", "kernel", "mask"])
    assert best.loc[("fwd", "fast_kernel", "causal"), "tflops"] == pytest.approx(2.0)
    assert best.loc[("fwd", "fast_kernel", "causal"), "seqlen"] == 256
    assert best.loc[("fwd", "fast_kernel", "sliding"), "failed"] == "!T"
    assert best.loc[("fwd", "slow_kernel", "causal"), "failed"] == "E"
    assert np.isnan(best.loc[("fwd", "never_kernel", "causal"), "tflops"])
    assert best.loc[("fwd", "never_kernel", "causal"), "failed"] == "X"

    fig = plots.kernel_mask_matrix_figure(kernels, masks=["sliding", "causal"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["sliding", "causal"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fast_kernel", "never_kernel", "slow_kernel"]
    texts = [t.get_text() for t in ax.texts]
    assert "2\n@256" in texts and "0.5\n@64\n!T" in texts and "X" in texts


def test_cp_efficiency_compares_with_the_single_gpu_kernel_at_tokens_per_rank(kernels):
    eff = plots.cp_efficiency(rd.cp_df(), kernels).set_index("cell_id")
    ring = eff.loc["ring/causal/bfloat16_fwd_64x2"]
    # 64 tokens per rank: fast_kernel causal bf16 fwd at 64 is 0.5 TFLOPs/s; ring reaches 0.45 per GPU.
    assert ring["tokens_per_rank"] == 64 and ring["seqlen"] == 128
    assert ring["baseline_tflops"] == pytest.approx(0.5) and ring["efficiency"] == pytest.approx(0.9)
    assert ring["baseline_cell_id"] == "fast_kernel/causal/bfloat16_fwd_64"
    assert eff.loc["ulysses/causal/bfloat16_bwd_64x4", "efficiency"] == pytest.approx(0.7)
    oom = eff.loc["ulysses/causal/bfloat16_fwd_128x4"]
    assert np.isnan(oom["efficiency"]) and oom["baseline_note"] == "the CP cell is oom"


def test_cp_efficiency_says_why_a_baseline_is_missing(kernels):
    cp = rd.cp_df(with_tokens_per_rank=False)  # tokens per rank derived: seqlen // cp_size
    assert "tokens_per_rank" not in cp.columns or cp["tokens_per_rank"].isna().all()
    cp.loc[0, "mask"] = "no_such_mask"  # no kernel cell for it
    cp.loc[1, "local_kernel"] = "never_kernel"  # its kernel cells are all unsupported
    eff = plots.cp_efficiency(cp, kernels)
    assert eff.loc[0, "tokens_per_rank"] == 64 and np.isnan(eff.loc[0, "efficiency"])
    assert eff.loc[0, "baseline_note"].startswith("no single-GPU fast_kernel cell at 64 tokens")
    assert eff.loc[1, "baseline_note"] == f"single-GPU cell never_kernel/causal/bfloat16_{cp.loc[1, 'direction']}_64 " \
                                          "is unsupported"
    assert eff.loc[2:, "efficiency"].notna().sum() == len(cp) - 2 - 2  # all but these two and the OOM pair


def test_cp_efficiency_matches_rows_whose_shapes_were_not_recorded(kernels):
    # Missing values (NaN in pandas) on both sides still name the same problem.
    k, cp = kernels.copy(), rd.cp_df()
    for col in ("batch", "heads_q", "heads_kv", "head_dim"):
        k[col], cp[col] = np.nan, np.nan
    eff = plots.cp_efficiency(cp, k).set_index("cell_id")
    assert eff.loc["ring/causal/bfloat16_fwd_64x2", "efficiency"] == pytest.approx(0.9)
    # A recorded shape that differs is another problem: no baseline.
    cp["heads_q"] = 8
    assert plots.cp_efficiency(cp, k)["efficiency"].isna().all()


def test_cp_figures_draw_a_line_per_strategy_markers_and_reference_lines(kernels):
    cp = rd.cp_df()
    fig = plots.cp_scaling_figure(cp, "causal", rd.CEILINGS)
    assert len(fig.axes) == 4  # (fwd, bwd) × (64, 128 tokens per GPU)
    assert fig.axes[0].get_title().endswith("64 tokens per GPU")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["2", "4"]
    assert {"ring (fast_kernel)", "ulysses (fast_kernel)"} <= set(_legend_texts(fig))
    assert _markers(fig) == ["E", "E"]  # ulysses at cp_size 4, 128 tokens per GPU, fwd and bwd
    assert any(ln.get_label().startswith("matmul ceiling per GPU") for ln in fig.axes[0].get_lines())

    eff = plots.cp_efficiency_figure(cp, kernels, "causal")
    unit = [ln for ln in eff.axes[0].get_lines() if ln.get_label().startswith("single-GPU")]
    assert len(unit) == 1 and unit[0].get_ydata()[0] == 1.0
    ys = sorted(round(float(y), 6) for ln in eff.axes[0].get_lines() if not ln.get_label().startswith("single")
                for y in ln.get_ydata())
    assert ys == [0.7, 0.7, 0.9, 0.9]


def test_cp_figures_on_an_empty_table_say_there_is_nothing(kernels):
    empty = rd.empty_cp_df()
    assert plots.cp_efficiency(empty, kernels).empty
    for fig in (plots.cp_scaling_figure(empty, "causal"), plots.cp_efficiency_figure(empty, kernels, "causal")):
        assert "no CP cells for mask causal" in " ".join(t.get_text() for t in fig.texts)


def test_saved_figures_decode_with_a_real_size(kernels, tmp_path):
    plots.kernel_figures(kernels, "causal", tmp_path / "k.png", tmp_path / "m.png", ceilings=rd.CEILINGS)
    plots.cp_figures(rd.cp_df(), kernels, "causal", tmp_path / "s.png", tmp_path / "e.png")
    plots.save(plots.kernel_mask_matrix_figure(kernels), tmp_path / "x.png")
    for name in ("k", "m", "s", "e", "x"):
        image = mpimg.imread(tmp_path / f"{name}.png")
        assert image.shape[0] > 200 and image.shape[1] > 400
        assert image[..., :3].std() > 0.05  # not a blank canvas
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


def test_seqlen_labels():
    assert [plots.seqlen_label(n) for n in (512, 1024, 32768, 1536, 1000, 2 ** 20)] == \
        ["512", "1K", "32K", "1536", "1000", "1M"]


def test_a_mask_without_rows_gets_a_figure_that_says_so(kernels):
    fig = plots.kernel_throughput_figure(kernels, "nothing_here")
    assert "no kernel cells for mask nothing_here" in " ".join(t.get_text() for t in fig.texts)
    assert plots.kernel_mask_matrix_figure(kernels.iloc[0:0]).texts


def test_series_colours_are_stable_and_distinct():
    a = plots.series_colors(["b", "a", "c"])
    assert a == plots.series_colors(["c", "b", "a", "a"])
    assert len(set(a.values())) == 3
