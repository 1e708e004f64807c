"""lab/longca_lab/peak_memory.py on the CPU: each cell run both ways in one process, real files."""

import json
from pathlib import Path

import yaml
import tiny
from longca_lab import peak_memory

REPO = Path(__file__).resolve().parents[2]

TINY = tiny.grid(directions=["fwd", "bwd"], heads_kv=1, timing=None)


def test_each_cell_runs_as_configured_then_eagerly(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    cells = ["sdpa/causal/float32_bwd_64", "sdpa/full/float32_fwd_64"]
    assert peak_memory.main([str(tmp_path / "out"), "--budget-s", "60", "--configfile", str(config),
                             "--cells", *cells]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "peak_memory.jsonl").read_text().splitlines()]
    assert [(r["cell"], r["way"]) for r in rows] == [(c, w) for c in cells for w in ("as configured", "eager")]
    for r in rows:
        assert r["status"] == "ok" and r["median_ms"] > 0
        # The CPU has no allocator statistics: no figure rather than a made-up one.
        assert r["peak_mem_bytes"] is None and r["allocated_before"] is None and r["allocated_after"] is None
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert sum(line.startswith("| sdpa/") for line in summary.splitlines()) == 4


def test_memory_ways_measures_each_cell_both_ways(tmp_path):
    """lab/longca_lab/memory_ways.py on the CPU: each cell timed and measured; no allocator, no figure."""
    from longca_lab import memory_ways

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    cells = ["sdpa/causal/float32_bwd_64", "sdpa/full/float32_fwd_64"]
    assert memory_ways.main([str(tmp_path / "out"), "--budget-s", "60", "--configfile", str(config),
                             "--cells", *cells]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "memory_ways.jsonl").read_text().splitlines()]
    assert [r["cell"] for r in rows] == cells
    assert all(r["status"] == "ok" and r["timing"] is None and r["own_call"] is None for r in rows)
    assert "0 cells with both figures" in (tmp_path / "out" / "summary.md").read_text()
