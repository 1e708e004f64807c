"""lab/longca_lab/warmup_ab.py on the CPU: both warm-ups, alternating, every round kept, real files."""

import json

import yaml
import tiny
from longca_lab import warmup_ab

TINY = tiny.grid(directions=["fwd", "bwd"], heads_kv=1, timing=None)


def test_each_round_times_both_warm_ups_in_alternating_order(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    cells = ["sdpa/causal/float32_bwd_64", "sdpa/full/float32_fwd_64"]
    assert warmup_ab.main([str(tmp_path / "out"), "--budget-s", "60", "--configfile", str(config),
                           "--cells", *cells, "--rounds", "3"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "rounds.jsonl").read_text().splitlines()]
    old, new = warmup_ab.OLD, warmup_ab.NEW
    for cell in cells:
        mine = [r for r in rows if r["cell"] == cell]
        assert [r["warmup"] for r in mine] == [old, new, new, old, new, old]
        assert [r["round"] for r in mine] == [0, 0, 1, 1, 2, 2]
        assert all(r["median_ms"] > 0 and r["reps"] >= 1 for r in mine)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert sum(line.startswith("| sdpa/") for line in summary.splitlines()) == 2
    assert "2 cells: probe-seeded / untimed replay median" in summary


def test_rounds_below_one_are_refused_before_any_work(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="--rounds"):
        warmup_ab.main([str(tmp_path / "out"), "--budget-s", "60", "--cells", "x", "--rounds", "0"])
    assert not (tmp_path / "out").exists()
