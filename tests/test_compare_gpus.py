"""scripts/compare_gpus.py on the published H100 and H200 tables, as a user runs it: the figure,
and printed ratios that are what the two Parquet files say."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
H100 = REPO / "docs/results/h100_2026-11-23/kernels.parquet"
H200 = REPO / "docs/results/h200_2026-11-23/kernels.parquet"


def _run(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts/compare_gpus.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_the_published_tables_side_by_side(tmp_path):
    out = tmp_path / "ratio.png"
    proc = _run(H100, H200, out, "--labels", "H100", "H200", "--config", REPO / "config/gpu.yaml")
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 10_000
    a, b = pd.read_parquet(H100), pd.read_parquet(H200)
    keys = ["kernel", "mask", "seqlen", "direction", "dtype"]
    both = a[a.status == "ok"].merge(b[b.status == "ok"], on=keys, suffixes=("_a", "_b"))
    assert f"{len(both)} kernel cells ok on both" in proc.stdout
    both["ratio"] = both["tflops_b"] / both["tflops_a"]
    fa4_bwd = both[(both.kernel == "flash_attn4") & (both.direction == "bwd")]["ratio"]
    assert f"| flash_attn4 | bwd | {len(fa4_bwd)} | {fa4_bwd.median():.3f} |" in proc.stdout
    # one heatmap row per mask x length x direction with a kernel on both, the fastest on each side
    full = both[(both["mask"] == "full") & (both.seqlen == 8192) & (both.direction == "fwd")]
    best_a, best_b = full.loc[full.tflops_a.idxmax()], full.loc[full.tflops_b.idxmax()]
    assert (f"| full | 8K | fwd | {best_a.kernel} {best_a.tflops_a:.0f} | {best_b.kernel} {best_b.tflops_b:.0f} | "
            f"{best_b.tflops_b / best_a.tflops_a:.3f} |") in proc.stdout


@pytest.mark.parametrize("missing", ["a", "b"])
def test_a_missing_table_is_named(tmp_path, missing):
    paths = {"a": H100, "b": H200, missing: tmp_path / "nope.parquet"}
    proc = _run(paths["a"], paths["b"], tmp_path / "x.png")
    assert proc.returncode == 2 and "nope.parquet: no such file" in proc.stderr


def test_memory_agreement_counts_cells_within_five_percent(tmp_path):
    """The memory section: cells with a figure on both, the share within 5 %, the farthest cells."""
    a = pd.read_parquet(H100)
    a = a[a.status == "ok"].head(20).copy()
    a["peak_mem_bytes"] = 100 * 2 ** 20
    b = a.copy()
    b.loc[b.index[:3], "peak_mem_bytes"] = 120 * 2 ** 20   # 3 of 20 differ by 20 %
    b.loc[b.index[3], "peak_mem_bytes"] = 104 * 2 ** 20    # inside 5 %
    a.loc[a.index[4], "peak_mem_bytes"] = None              # no figure on one side: not counted
    a.to_parquet(tmp_path / "a.parquet"), b.to_parquet(tmp_path / "b.parquet")
    proc = _run(tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "x.png", "--labels", "H100", "H200")
    assert proc.returncode == 0, proc.stderr
    assert "19 cells with a figure on both: 16 (84.2%) within 5 %" in proc.stdout
    first = a.iloc[0]
    assert f"| {first.kernel} | {first['mask']} | {first.seqlen} | {first.direction} | 100 | 120 | 1.200 |" in proc.stdout
