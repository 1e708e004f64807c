"""lab/longca_lab/timing_series.py on the CPU: every round's samples of both ways of timing, real files."""

import json
from pathlib import Path

import pytest
import yaml
import tiny
from longca_lab import timing_series

REPO = Path(__file__).resolve().parents[2]

TINY = tiny.grid(directions=["fwd", "bwd"], heads_kv=1, timing=None)


def test_each_round_keeps_every_sample_of_both_ways(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    cells = ["sdpa/causal/float32_bwd_64", "sdpa/full/float32_fwd_64"]
    assert timing_series.main([str(tmp_path / "out"), "--budget-s", "60", "--configfile", str(config),
                               "--cells", *cells, "--rounds", "2", "--long-rep-ms", "10"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "series.jsonl").read_text().splitlines()]
    assert [(r["cell"], r["round"]) for r in rows] == [(c, i) for c in cells for i in range(2)]
    for r in rows:
        assert r["harness_tflops"] > 0 and r["harness_reps"] >= 1
        assert r["do_bench_ms"] and all(ms > 0 for ms in r["do_bench_ms"])
        assert r["do_bench_tflops"] == pytest.approx(r["flops"] / (sorted(r["do_bench_ms"])[len(r["do_bench_ms"]) // 2]
                                                                   * 1e-3) / 1e12)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert sum(line.startswith("| sdpa/") for line in summary.splitlines()) == 4


def test_a_cell_not_in_the_config_stops_the_run_before_any_work(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    with pytest.raises(SystemExit, match="sdpa/nosuch/float32_fwd_64"):
        timing_series.main([str(tmp_path / "out"), "--budget-s", "60", "--configfile", str(config),
                            "--cells", "sdpa/full/float32_fwd_64", "sdpa/nosuch/float32_fwd_64"])
    assert not (tmp_path / "out").exists()
