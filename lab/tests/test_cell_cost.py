"""lab/longca_lab/cell_cost.py over the committed from-nothing runs: the figures their page quotes."""

from pathlib import Path

import pandas as pd

from longca_lab import cell_cost

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "lab" / "data" / "from_nothing_h100_2026-11-27"
PUBLISHED = REPO / "docs" / "results" / "h100_2026-11-23" / "kernels.parquet"
PUBLISHED_H200 = REPO / "docs" / "results" / "h200_2026-11-23" / "kernels.parquet"


def test_the_totals_split_a_cells_wall_into_its_parts_and_gpu_work():
    rows = cell_cost.load(str(DATA / "kernels_run2.parquet"))
    text = cell_cost.totals(rows)
    assert "cells: 429, measured whole: 429 (348 ok, 81 unsupported)" in text
    assert "wall / GPU work: 2.96" in text
    ok = rows[rows["status"] == "ok"]
    assert (ok["gpu_s"] > 0).all() and (rows.loc[rows["status"] != "ok", "gpu_s"] == 0).all()
    # Every ok cell measured its three parts; their sum fits in the cell's wall.
    assert (ok[cell_cost.PARTS].sum(axis=1) <= ok["wall_s"]).all()


def test_reused_parts_leave_a_row_out_of_what_a_cell_costs_from_nothing(tmp_path):
    rows = pd.read_parquet(DATA / "kernels_run1.parquet")
    rows.loc[rows.index[:40], "parts_reused"] = "gate,time"
    rows.to_parquet(tmp_path / "k.parquet")
    assert "cells: 440, measured whole: 400" in cell_cost.totals(cell_cost.load(str(tmp_path / "k.parquet")))


def test_a_kernels_first_use_is_its_costliest_cell_of_its_first_second(tmp_path):
    """Rows carry ``timed_at`` in whole seconds: of two cells timed in the first second, the one
    whose wall holds the first use (compilation before its timing) came first, whatever the rows' order."""
    rows = pd.read_parquet(DATA / "kernels_run2.parquet")
    flex = rows[(rows.kernel == "flex") & (rows.status == "ok")].sort_values("timed_at").index[:2]
    rows.loc[flex, "timed_at"] = "2026-01-01T00:00:00+00:00"  # before every other row, the same second
    rows.loc[flex[0], "wall_s"] = 1.0
    rows.loc[flex[1], "wall_s"] = 9.0
    for order in (flex, flex[::-1]):
        path = tmp_path / "k.parquet"
        pd.concat([rows.loc[order], rows.drop(flex)]).to_parquet(path)
        loaded = cell_cost.load(str(path))
        first = loaded.loc[flex[1]]  # the 9 s one
        named = f"| flex | {first['mask']} {first['seqlen'] // 1024}K {first['direction']} | {9.0 - first['gpu_s']:.2f} ("
        assert named in cell_cost.first_use(loaded)


def test_the_page_quotes_the_memory_comparison_and_the_estimate():
    rows = cell_cost.load(str(DATA / "kernels_run2.parquet"))
    published = cell_cost.load(str(PUBLISHED))
    memory = cell_cost.memory_against(rows, published)
    assert "348 cells; byte-identical 287 (82%); within 1 % 348 (100%)" in memory
    quoted = (DATA / "cell_cost_run2.md").read_text()
    assert memory in quoted and cell_cost.estimate(rows, published, "gpu work") in quoted
    assert "4.12 h" in cell_cost.estimate(rows, published, "gpu work")


H200 = DATA.parent / "from_nothing_2xh200_2026-11-28"


def _totals_quoted(rows_file: Path, quoted_in: Path, *lines: str) -> pd.DataFrame:
    """A page's rows, once ``cell_cost.totals`` of them says each of ``lines`` and ``quoted_in`` quotes it."""
    rows = cell_cost.load(str(rows_file))
    text = cell_cost.totals(rows)
    assert all(line in text for line in lines), text
    assert text in quoted_in.read_text()
    return rows


def _wall_over_gpu(rows: pd.DataFrame) -> str:
    return f"{rows.wall_s.sum() / rows.gpu_s.sum():.2f}"


def test_the_2xh200_page_quotes_what_cell_cost_computes_from_its_rows():
    rows = _totals_quoted(H200 / "kernels.parquet", H200 / "cell_cost.md",
                          "cells: 1344, measured whole: 1344 (1128 ok, 216 unsupported)",
                          "mean cell wall: 0.563 s", "wall / GPU work: 1.80")
    assert (rows.loc[rows["status"] == "ok", "memory_via"] == "timing").all()
    page = (H200 / "README.md").read_text()
    quoted = (H200 / "cell_cost.md").read_text()
    assert "**1,344 cells in 431 s**" in page
    published = cell_cost.load(str(PUBLISHED_H200))
    memory = cell_cost.memory_against(rows, published)
    assert "1128 cells; byte-identical 875 (78%); within 1 % 1126 (100%)" in memory and memory in quoted
    assert "2.17 h" in cell_cost.estimate(rows, published, "gpu work")


def test_the_flex_prepare_ab_quotes_its_rows():
    old, new = (cell_cost.load(str(H200 / f"flex_ab_{side}.parquet")) for side in ("old", "new"))
    quoted = (H200 / "flex_ab.md").read_text()
    both = cell_cost.side_by_side(old, new, ("old (prepare compiles)", "new"))
    assert both in quoted and "| all | 130 | 1.148 | 1.038 | 0.90 |" in both
    assert "cells: 162, measured whole: 162" in cell_cost.totals(new)
    assert "ratio 0.6536-0.8561" in cell_cost.memory_against(new, old)


def _cells(wall_s, warmup_ms, median_ms=36_000.0, reps=5, seqlen=65536):
    """Two ok cells of one kernel and length measured whole (36 s calls, so hours show)."""
    return pd.DataFrame([{"kernel": "k", "mask": m, "seqlen": seqlen, "direction": "fwd", "dtype": "bfloat16",
                          "status": "ok", "wall_s": wall_s, "median_ms": median_ms, "reps": reps,
                          "warmup_spent_ms": warmup_ms, "time_wall_s": wall_s, "parts_reused": None}
                         for m in ("causal", "full")])


def test_the_estimate_takes_the_runs_warm_up_in_place_of_the_published_one(tmp_path):
    """A published cell warmed up for 3 calls and the run, under a newer protocol, for 1: the
    estimate keeps the published timed calls and takes the run's warm-up and overhead."""
    import pytest

    run, published = _cells(wall_s=324.0, warmup_ms=36_000.0), _cells(wall_s=396.0, warmup_ms=108_000.0)
    for frame, name in ((run, "run"), (published, "published")):
        frame.to_parquet(tmp_path / f"{name}.parquet")
    run, published = (cell_cost.load(str(tmp_path / f"{n}.parquet")) for n in ("run", "published"))
    # 5 timed calls, the run's 1 warm-up and 3 more: 4 calls beyond the timed ones; 2 x 9 x 36 s = 0.18 h
    text = cell_cost.estimate(run, published)
    assert "64K 4;" in text and "from nothing on one GPU: 0.18 h" in text
    # the old definition keeps the published 3-call warm-up: 2 x (8 + 3) x 36 s = 0.22 h
    text = cell_cost.estimate(run, published, "gpu work")
    assert "64K 3;" in text and "from nothing on one GPU: 0.22 h" in text
    with pytest.raises(SystemExit, match="estimate-keeps"):
        cell_cost.estimate(run, published, "everything")


WARMUP = DATA.parent / "from_nothing_warmup_h200_2026-11-28"


def test_the_warmup_page_quotes_what_cell_cost_computes_from_its_rows():
    stage = cell_cost.load(str(WARMUP / "kernels.parquet"))
    text = cell_cost.totals(stage)
    assert "cells: 1344, measured whole: 1344 (1128 ok, 216 unsupported)" in text
    assert "mean cell wall: 0.497 s" in text and "wall / GPU work: 1.90" in text
    quoted = (WARMUP / "cell_cost.md").read_text()
    assert text in quoted
    rows = pd.concat([stage, cell_cost.load(str(WARMUP / "long_new.parquet"))], ignore_index=True)
    published = cell_cost.load(str(PUBLISHED_H200))
    estimate = cell_cost.estimate(rows, published)
    assert estimate in quoted and "1.80 h" in estimate and "64K 5, 128K 4" in estimate
    old = pd.concat([stage, cell_cost.load(str(WARMUP / "long_old.parquet"))], ignore_index=True)
    assert "2.10 h" in cell_cost.estimate(old, published)
    h100 = cell_cost.load(str(REPO / "docs" / "results" / "h100_2026-11-23" / "kernels.parquet"))
    assert cell_cost.estimate(rows, h100).splitlines()[-1] in (WARMUP / "estimate_h100_table.md").read_text()
    page = (WARMUP / "README.md").read_text()
    assert "**1,344 cells in 384 s**" in page and "**1.80 h on one H200**" in page


def test_the_warmup_ab_pages_quote_their_rows():
    import json

    from longca_lab import warmup_ab

    old, new = (cell_cost.load(str(WARMUP / f"long_{side}.parquet")) for side in ("old", "new"))
    both = cell_cost.side_by_side(old, new, ("untimed replay (2177873)", "probe-seeded (549cbd0)"))
    assert both in (WARMUP / "long_ab.md").read_text() and "| all | 58 | 7.058 | 5.929 | 0.84 |" in both
    rows = [json.loads(line) for line in (WARMUP / "warmup_ab_rounds.jsonl").read_text().splitlines()]
    summary = warmup_ab.summary(rows)
    assert summary.strip() == (WARMUP / "warmup_ab.md").read_text().strip()
    assert "8 cells: probe-seeded / untimed replay median 1.0000, range 0.9862-1.0008" in summary


def test_the_blockmask_ab_quotes_its_rows():
    old, new, band = (cell_cost.load(str(WARMUP / f"blockmask_{side}.parquet")) for side in ("old", "new", "band"))
    quoted = (WARMUP / "blockmask_ab.md").read_text()
    both = cell_cost.side_by_side(old, new, ("compiled create_block_mask (5285a9c)", "row table (36f9621)"))
    assert both in quoted and "| all | 168 | 0.827 | 0.679 | 0.82 |" in both
    assert "154 (92%)" in cell_cost.memory_against(new, old)
    banded = cell_cost.memory_against(band, old)
    assert banded in quoted and "67 cells; byte-identical 37 (55%); within 1 % 67 (100%)" in banded


ONE_GPU = DATA.parent / "from_nothing_1xh200_2026-11-28"


def test_the_one_gpu_page_quotes_what_cell_cost_computes_from_its_rows():
    stage = _totals_quoted(ONE_GPU / "kernels.parquet", ONE_GPU / "cell_cost.md",
                           "cells: 1344, measured whole: 1344 (1128 ok, 216 unsupported)",
                           "mean cell wall: 0.498 s", "wall / GPU work: 1.90")
    h200 = cell_cost.load(str(PUBLISHED_H200))
    with_long = pd.concat([stage, cell_cost.load(str(WARMUP / "long_new.parquet"))], ignore_index=True)
    assert "1.81 h" in cell_cost.estimate(with_long, h200)
    memory = cell_cost.memory_against(stage, cell_cost.load(str(WARMUP / "kernels.parquet")))
    assert "1128 cells; byte-identical 1092 (97%); within 1 % 1128 (100%)" in memory
    assert _wall_over_gpu(stage[stage.kernel != "flex"]) == "1.53"
    page = (ONE_GPU / "README.md").read_text()
    assert "**1.81 h on one H200**" in page and "Without `flex`: **1.53 ×**" in page
    assert "1,128 of 1,128 ok cells are within 1 %" in page


COMPILE_CACHE = DATA.parent / "compile_cache_h200_2026-11-28"


def test_the_compile_cache_page_quotes_what_cell_cost_computes_from_its_rows():
    before, after = (cell_cost.load(str(COMPILE_CACHE / f"{run}.parquet")) for run in ("a", "b"))
    for rows, quoted in ((before, "mean cell wall: 0.492 s"), (after, "mean cell wall: 0.277 s")):
        assert quoted in cell_cost.totals(rows)
    assert "wall / GPU work: 2.82" in cell_cost.totals(before) and "wall / GPU work: 1.83" in cell_cost.totals(after)
    assert cell_cost.totals(after) in (COMPILE_CACHE / "cell_cost_b.md").read_text()
    page = (COMPILE_CACHE / "README.md").read_text()
    for kernel in sorted(set(before.kernel)):
        a, b = before[before.kernel == kernel], after[after.kernel == kernel]
        row = (f"| `{kernel}` | {len(a)} | {a.wall_s.sum():.1f} | {a.gpu_s.sum():.1f} | {_wall_over_gpu(a)} "
               f"| {b.wall_s.sum():.1f} | {b.gpu_s.sum():.1f} | {_wall_over_gpu(b)} |")
        assert row in page
    memory = cell_cost.memory_against(after, before)
    assert "420 cells; byte-identical 409 (97%); within 1 % 420 (100%)" in memory
    assert "420 of 420 cells within 1 %, 409 byte-identical" in page
    both = before.merge(after, on=cell_cost.KEY, suffixes=("_a", "_b"))
    assert f"{(both.median_ms_b / both.median_ms_a).median():.4f}" == "0.9997"
    assert "Medians B / A: 0.9997" in page


def test_the_compile_cache_stage_quotes_what_cell_cost_computes_from_its_rows():
    stage = _totals_quoted(COMPILE_CACHE / "stage.parquet", COMPILE_CACHE / "stage_cell_cost.md",
                           "cells: 1344, measured whole: 1343 (1127 ok, 216 unsupported)",
                           "mean cell wall: 0.430 s", "wall / GPU work: 1.71")
    assert _wall_over_gpu(stage[stage.whole & (stage.kernel != "flex")]) == "1.52"
    memory = cell_cost.memory_against(stage, cell_cost.load(str(ONE_GPU / "kernels.parquet")))
    assert "1127 cells; byte-identical 1111 (99%); within 1 % 1127 (100%)" in memory
    with_long = pd.concat([stage, cell_cost.load(str(WARMUP / "long_new.parquet"))], ignore_index=True)
    assert "1.80 h" in cell_cost.estimate(with_long, cell_cost.load(str(PUBLISHED_H200)))
    page = (COMPILE_CACHE / "README.md").read_text()
    assert "**1.71 ×**" in page and "Without `flex`: 1.52 ×" in page and "**1.80 h on one H200**" in page
    assert "1,127 of 1,127 ok cells measured whole within 1 %" in page
