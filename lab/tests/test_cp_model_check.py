"""The lab's CP model studies: the published check page is what lab/longca_lab/cp_model_check.py prints, and
lab/longca_lab/collective_bandwidth.py measures each collective under a real torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"


@pytest.mark.slow
def test_the_published_check_page_is_what_the_check_prints():
    out = subprocess.run([sys.executable, "lab/longca_lab/cp_model_check.py"], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in (RESULTS / "cp_model_2026-11-27.md").read_text()


@pytest.mark.slow
def test_the_collective_bandwidth_benchmark_reports_each_collective_and_size(tmp_path):
    """lab/longca_lab/collective_bandwidth.py under a real 2-rank torchrun (gloo here): a row per
    collective × size with the bytes a rank sends counted as Comm counts them."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "lab/longca_lab/collective_bandwidth.py", str(tmp_path), "--sizes-mib", "0.25", "1",
                           "--warmup", "1", "--reps", "3"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "collectives_2.jsonl").read_text().splitlines()]
    assert [(r["collective"], r["payload_mib"]) for r in rows] == [
        (c, s) for s in (0.25, 1) for c in ("all_gather", "all_to_all", "reduce_scatter", "p2p_ring")]
    one_mib = {r["collective"]: r["sent_bytes"] for r in rows if r["payload_mib"] == 1}
    assert one_mib == {"all_gather": 2**20, "all_to_all": 2**19, "reduce_scatter": 2**19, "p2p_ring": 2**20}
    assert all(r["median_ms"] > 0 and r["gb_per_s"] > 0 and r["device_name"] == "CPU (gloo)" for r in rows)
    page = (tmp_path / "collectives_2.md").read_text()
    assert page.startswith("# Collectives on 2 × CPU (gloo) (gloo)") and "| all_to_all | 1 |" in page
