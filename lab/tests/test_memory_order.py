"""lab/longca_lab/memory_order.py on the CPU: each cell's memory part in two orders, two processes, real files."""

import json
import subprocess
import sys
from pathlib import Path

import yaml
import tiny

REPO = Path(__file__).resolve().parents[2]
TINY = tiny.grid(directions=["fwd", "bwd"], heads_kv=1, timing=None)


def test_each_cell_is_measured_first_in_one_process_and_last_in_the_other(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    cells = ["sdpa/causal/float32_bwd_64", "sdpa/full/float32_fwd_64", "sdpa/full/float32_bwd_64"]
    proc = subprocess.run([sys.executable, str(REPO / "lab" / "longca_lab" / "memory_order.py"), str(tmp_path / "out"),
                           "--budget-s", "120", "--configfile", str(config), "--cells", *cells],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "memory_order.jsonl").read_text().splitlines()]
    positions = {(r["order"], r["cell"]): r["position"] for r in rows}
    assert positions[("given", cells[0])] == 0 and positions[("reversed", cells[0])] == 2
    # The CPU has no allocator peak: no figure rather than a made-up one.
    assert all(r["status"] == "ok" and r["peak_mem_bytes"] is None for r in rows)
    assert sum(line.startswith("| sdpa/") for line in (tmp_path / "out" / "summary.md").read_text().splitlines()) == 3


def test_a_name_that_is_no_cell_stops_before_any_work(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    proc = subprocess.run([sys.executable, str(REPO / "lab" / "longca_lab" / "memory_order.py"), str(tmp_path / "out"),
                           "--budget-s", "10", "--configfile", str(config), "--cells", "sdpa/nomask/float32_fwd_64"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--cells" in proc.stderr and not (tmp_path / "out").exists()
