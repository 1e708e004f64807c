"""Figures: what is drawn where (bars, status markers, ceiling lines, CP efficiency), on synthetic rows."""

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image
import report_data as rd

from longca.results import plots


def _markers(fig):
    return sorted(t.get_text() for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith("marker-"))


def _legend_texts(fig):
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


@pytest.fixture(scope="module")
def kernels():
    return rd.kernels_df()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _kernel_lines(ax):
    """The throughput panel's data lines by kernel (each line's gid is ``kernel-<name>``)."""
    return {ln.get_gid()[len("kernel-"):]: ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("kernel-")}


def test_throughput_lines_only_for_correct_cells_and_markers_for_the_rest(kernels):
    fig = plots.kernel_throughput_figure(kernels, "sliding", rd.CEILINGS)
    fwd, bwd = fig.axes[:2]
    assert fwd.get_title() == "sliding — forward" and bwd.get_title() == "sliding — backward"
    sub = kernels[kernels["mask"] == "sliding"]
    for ax, direction in ((fwd, "fwd"), (bwd, "bwd")):
        lines = _kernel_lines(ax)
        # One line per kernel with a number; never_kernel (all unsupported) has none.
        assert set(lines) == {"fast_kernel", "slow_kernel"}
        for kernel, line in lines.items():
            ok = sub[(sub["direction"] == direction) & (sub["kernel"] == kernel) & (sub["status"] == "ok")]
            drawn = {int(x): float(y) for x, y in zip(line.get_xdata(), line.get_ydata()) if np.isfinite(y)}
            assert drawn == pytest.approx(dict(zip(ok["seqlen"].astype(int), ok["tflops"])))
    # fast_kernel forward: a number at 64 only (error at 128, timeout at 256) — one point, no line on.
    assert list(_kernel_lines(fwd)["fast_kernel"].get_xdata()) == [64]
    # fast_kernel: error at 128 and timeout at 256 forward, wrong at 64 backward; never_kernel unsupported.
    assert _markers(fig) == sorted(["!", "T", "W"] + ["X"] * 6)
    # Lengths are log2-spaced and labelled as lengths.
    assert fwd.get_xscale() == "log"
    assert [t.get_text() for t in fwd.get_xticklabels()] == ["64", "128", "256"]


def test_throughput_markers_sit_below_the_lines_in_the_kernels_colour(kernels):
    colors = plots.series_colors(kernels["kernel"])
    fig = plots.kernel_throughput_figure(kernels, "causal", rd.CEILINGS, colors=colors)
    fwd = fig.axes[0]
    marks = [t for t in fwd.texts if (t.get_gid() or "").startswith("marker-")]
    # never_kernel: X at every length, slow_kernel: E at 256 — each in its kernel's colour.
    assert sorted((t.get_text(), t.get_position()[0]) for t in marks) == \
        [("E", 256.0)] + [("X", x) for x in (64.0, 128.0, 256.0)]
    by_text = {t.get_text(): t for t in marks}
    assert by_text["X"].get_color() == colors["never_kernel"] and by_text["E"].get_color() == colors["slow_kernel"]
    # In a band below zero: the axis starts below 0, the markers are drawn there (axes coordinates),
    # and every tick label is a real throughput (>= 0).
    assert fwd.get_ylim()[0] < 0
    zero = fwd.transAxes.inverted().transform(fwd.transData.transform((64, 0)))[1]
    assert all(0 < t.get_position()[1] < zero for t in marks)
    assert min(fwd.get_yticks()) >= 0
    # One kernel's markers share a row of the band.
    assert len({t.get_position()[1] for t in marks if t.get_text() == "X"}) == 1


def test_a_gap_between_lengths_with_a_number_breaks_the_line(kernels):
    df = kernels.copy()
    at = (df["kernel"] == "fast_kernel") & (df["mask"] == "causal") & (df["seqlen"] == 128) & (df["direction"] == "fwd")
    df.loc[at, "status"] = "oom"
    line = _kernel_lines(plots.kernel_throughput_figure(df, "causal").axes[0])["fast_kernel"]
    assert list(line.get_xdata()) == [64, 128, 256] and np.isnan(line.get_ydata()[1])


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
    # (the values themselves: test_tables.test_best_per_kernel_mask)
    fig = plots.kernel_mask_matrix_figure(kernels, masks=["sliding", "causal"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["sliding", "causal"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fast_kernel", "never_kernel", "slow_kernel"]
    texts = [t.get_text() for t in ax.texts]
    assert "2\n@256" in texts and "0.5\n@64\n!T" in texts and "X" in texts


def test_cp_figures_draw_a_line_per_strategy_markers_and_reference_lines(kernels):
    cp = rd.cp_df()
    fig = plots.cp_scaling_figure(cp, "causal", rd.CEILINGS)
    assert len(fig.axes) == 4  # (fwd, bwd) × (64, 128 tokens per GPU)
    assert fig.axes[0].get_title().endswith("64 tokens per GPU")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "4"]
    assert {"ring (fast_kernel)", "ulysses (fast_kernel)"} <= set(_legend_texts(fig))
    assert _markers(fig) == ["E", "E"]  # ulysses at cp_size 4, 128 tokens per GPU, fwd and bwd
    assert any(ln.get_label().startswith("matmul ceiling per GPU") for ln in fig.axes[0].get_lines())

    # Against the best single-GPU kernel on the same total length (64 tokens per GPU: 64, 128, 256).
    eff = plots.cp_efficiency_figure(cp, kernels, "causal")
    unit = [ln for ln in eff.axes[0].get_lines() if ln.get_label() == "the best single-GPU kernel"]
    assert len(unit) == 1 and unit[0].get_ydata()[0] == 1.0
    ys = sorted(round(float(y), 6) for ln in eff.axes[0].get_lines() if ln not in unit for y in ln.get_ydata())
    assert ys == [0.175, 0.225, 0.35, 0.45, 1.0, 1.0]


def test_cp_figures_on_an_empty_table_say_there_is_nothing(kernels):
    empty = rd.empty_cp_df()
    for fig in (plots.cp_scaling_figure(empty, "causal"), plots.cp_efficiency_figure(empty, kernels, "causal")):
        assert "no CP cells for mask causal" in " ".join(t.get_text() for t in fig.texts)


def test_saved_figures_decode_with_a_real_size(kernels, tmp_path):
    data = plots.FigureData(kernels, rd.cp_df(), ceilings=rd.CEILINGS, masks=["causal"])
    drawn = plots.draw_all(data, tmp_path, cp_masks=["causal"])
    assert {name: sorted(paths) for name, paths in drawn.items()} == {
        "matrix": [None], "throughput": ["causal"], "memory": ["causal"], "memory_model": ["causal"], "cp_scaling": ["causal"],
        "cp_efficiency": ["causal"], "cp_predicted": ["causal"]}
    for name in ("kernels_causal", "memory_causal", "cp_scaling_causal", "cp_efficiency_causal", "kernel_mask_matrix"):
        image = mpimg.imread(tmp_path / f"{name}.png")
        assert image.shape[0] > 200 and image.shape[1] > 400
        assert image[..., :3].std() > 0.05  # not a blank canvas
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


def test_a_mask_without_rows_gets_a_figure_that_says_so(kernels):
    fig = plots.kernel_throughput_figure(kernels, "nothing_here")
    assert "no kernel cells for mask nothing_here" in " ".join(t.get_text() for t in fig.texts)
    assert plots.kernel_mask_matrix_figure(kernels.iloc[0:0]).texts


def test_series_colours_are_stable_and_distinct():
    a = plots.series_colors(["b", "a", "c"])
    assert a == plots.series_colors(["c", "b", "a", "a"])
    assert len(set(a.values())) == 3


def test_device_ratio_heatmap_writes_each_ratio_and_a_dash_where_none(kernels):
    from longca.results import tables

    faster = kernels.assign(tflops=kernels["tflops"] * 1.25)
    ratios = tables.best_kernel_ratios(tables.device_ratios(kernels, faster))
    ratios = ratios[~((ratios["mask"] == "sliding") & (ratios["seqlen"] == 64))]  # a hole
    fig = plots.device_ratio_figure(ratios, "old", "new", masks=["sliding", "causal"])
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["new / old, fastest kernel — forward — bfloat16",
                                                         "new / old, fastest kernel — backward — bfloat16"]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("–") == 1 and texts.count("1.25") == len(texts) - 1
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["sliding", "causal"]
    empty = plots.device_ratio_figure(ratios.iloc[0:0], "old", "new")
    assert "no kernel cell measured ok on both old and new" in [t.get_text() for t in empty.texts]


def test_saved_figures_are_palette_pngs_that_look_the_same(kernels, tmp_path):
    # The report embeds every figure, so save() keeps a 256-colour palette: compare with the
    # figure as matplotlib writes it (RGBA) pixel by pixel.
    fig = plots.kernel_throughput_figure(kernels, "causal", rd.CEILINGS)
    fig.savefig(tmp_path / "raw.png", dpi=plots.DPI, format="png", bbox_inches="tight", pad_inches=0.15)
    plots.save(fig, tmp_path / "kept.png")
    with Image.open(tmp_path / "kept.png") as kept, Image.open(tmp_path / "raw.png") as raw:
        assert kept.mode == "P" and raw.mode == "RGBA"
        assert kept.size == raw.size
        diff = np.abs(np.asarray(kept.convert("RGB"), dtype=int) - np.asarray(raw.convert("RGB"), dtype=int))
    assert diff.mean() < 1.0 and (diff.max(axis=2) > 32).mean() < 0.001
    assert (tmp_path / "kept.png").stat().st_size < (tmp_path / "raw.png").stat().st_size


def test_a_png_with_transparency_is_left_as_it_is(tmp_path):
    image = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    image.save(tmp_path / "clear.png")
    plots.compact_png(tmp_path / "clear.png")
    with Image.open(tmp_path / "clear.png") as again:
        assert again.mode == "RGBA" and again.getpixel((0, 0)) == (255, 0, 0, 0)
