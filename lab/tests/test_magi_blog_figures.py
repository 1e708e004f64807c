"""lab/longca_lab/magi_blog_figures.py reads bar heights back off a chart drawn in the blog's layout."""

from pathlib import Path

import numpy as np
import pytest
from longca_lab import magi_blog_figures as figures

REPO = Path(__file__).resolve().parents[2]

BASE, STEP = 4108, 466  # axis row; pixels per 100 TFLOPs/s


def chart(heights: dict) -> np.ndarray:
    """A white 11904 x 4704 chart: gridlines every 100 TFLOPs/s, the axis, one bar per
    (seqlen index, kernel) in ``heights``, and a line of another colour across some bars' feet."""
    image = np.full((4704, 11904, 3), 255, dtype=np.int16)
    for i in range(1, 9):
        image[BASE - i * STEP - 4:BASE - i * STEP + 5] = figures.GRID_GREY
    image[BASE - 5:BASE + 6] = figures.AXIS_GREY
    names = list(figures.PALETTE)
    for (g, kernel), tflops in heights.items():
        left = int(figures.FIRST_SLOT_X + g * figures.GROUP_PITCH + names.index(kernel) * figures.SLOT_WIDTH)
        top = int(round(BASE - 5 - tflops / 100 * STEP))
        image[top:BASE - 5, left + 2:left + 205] = figures.PALETTE[kernel]
    # Another series' line running along the axis across the first group's bars (not its own slots:
    # there a line and a bar of a few TFLOPs/s look alike, in the blog's charts as here).
    first_flex = int(figures.FIRST_SLOT_X + 3 * figures.SLOT_WIDTH)
    image[BASE - 30:BASE - 18, figures.FIRST_SLOT_X:first_flex] = figures.PALETTE["flex"]
    return image


def test_bar_heights_come_back_within_a_tflop_and_missing_bars_stay_missing():
    heights = {(0, "fa3"): 558.0, (0, "sdpa"): 533.0, (2, "cudnn"): 546.0, (5, "ffa"): 634.0, (5, "fa2"): 41.0}
    found = {(s, k): t for s, k, t in figures.bars(chart(heights))}
    expected = {(figures.SEQLENS[g], k): t for (g, k), t in heights.items()}
    assert set(found) == set(expected)  # nothing invented where no bar is drawn
    for key, tflops in expected.items():
        # the bar's top is 5 px above the axis centre line's edge: within a TFLOP/s at 4.66 px each
        assert found[key] == pytest.approx(tflops + 5 / STEP * 100, abs=1.0)


def test_an_image_of_another_size_is_refused():
    with pytest.raises(ValueError, match="not laid out like the blog's kernel charts"):
        figures.bars(np.full((100, 200, 3), 255, dtype=np.int16))
