"""The full-size check on the CPU: the chunked float32 reference, and scripts/full_check.py over
a tiny grid with a right and a wrong kernel, kept and skipped on a second run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from longca.attention import chunked_reference, masks, reference
import tiny

REPO = Path(__file__).resolve().parent.parent
TINY = tiny.grid(masks=["causal", "varlen_causal"], directions=["fwd", "bwd"], heads_kv=1, seed=1, timing=None)


@pytest.mark.parametrize("name", sorted(masks.PATTERNS))
def test_the_chunked_reference_is_the_exact_reference_block_by_block(name):
    mask = masks.build(name, 300, seed=1, **({"window": 20} if "window" in name else {}))
    assert torch.equal(chunked_reference.mask_rows(mask, 0, 300, torch.device("cpu")), mask.to_dense())
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 300, h, 8, generator=gen, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    exact, chunked = reference.attention(q, k, v, mask), chunked_reference.attention(q, k, v, mask, rows=64)
    grad = torch.randn_like(exact)
    for a, b in zip((exact, *torch.autograd.grad(exact, (q, k, v), grad)),
                    (chunked, *torch.autograd.grad(chunked, (q, k, v), grad))):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def _run(tmp_path, *extra):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return subprocess.run([sys.executable, str(REPO / "scripts" / "full_check.py"), str(tmp_path / "out"),
                           "--budget-s", "300", "--configfile", str(config), "--seqlen", "256", *extra],
                          capture_output=True, text=True, timeout=600)


def test_each_kernel_mask_and_direction_is_checked_once_and_kept(tmp_path):
    proc = _run(tmp_path, "--kernels", "sdpa", "test_wrong")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {p.relative_to(tmp_path / "out" / "checks").as_posix(): json.loads(p.read_text())["row"]
            for p in (tmp_path / "out" / "checks").rglob("*.json")}
    assert len(rows) == 2 * 2 * 2
    for cell, row in rows.items():
        assert row["seqlen"] == 256
        assert row["status"] == ("ok" if cell.startswith("sdpa/") else "wrong"), (cell, row)
        assert row["error"] is not None and "float32 reference at 256 tokens" in row["detail"]
    assert "8 checks: 4 ok, 4 wrong" in proc.stdout
    again = _run(tmp_path, "--kernels", "sdpa", "test_wrong")
    assert again.returncode == 0 and "/causal/" not in again.stdout.split("8 checks")[0]  # nothing measured again
    assert (tmp_path / "out" / "summary.md").read_text().count("| sdpa |") == 4


def test_an_unsupported_check_is_checked_again(tmp_path):
    """A check kept as `unsupported` (say its library was not installed yet) runs again next time."""
    assert _run(tmp_path, "--kernels", "sdpa", "--masks", "causal").returncode == 0
    kept = tmp_path / "out" / "checks" / "sdpa" / "causal" / "float32_fwd_256.json"
    record = json.loads(kept.read_text())
    record["row"].update(status="unsupported", reason="sdpa is not importable", error=None)
    kept.write_text(json.dumps(record))
    again = _run(tmp_path, "--kernels", "sdpa", "--masks", "causal")
    assert again.returncode == 0 and "sdpa/causal/fwd: ok" in again.stdout
    assert "sdpa/causal/bwd" not in again.stdout           # an ok check is still kept
    assert json.loads(kept.read_text())["row"]["status"] == "ok"


def test_an_unknown_kernel_or_mask_stops_before_any_work(tmp_path):
    proc = _run(tmp_path, "--kernels", "nope", "--masks", "causal", "spiral")
    assert proc.returncode != 0 and "--kernels nope" in proc.stderr and "--masks spiral" in proc.stderr
    assert not (tmp_path / "out" / "checks").exists()


def test_per_head_block_patterns_are_checked_per_head_and_other_kernels_refuse_them(tmp_path):
    """The sparse study's masks through the full-size check: FlexAttention's BlockMask of kept tiles
    (forward, CPU) against the chunked per-head reference, and a kernel with one mask for every head
    `unsupported` rather than checked on the wrong mask."""
    grid = dict(TINY, kernels=["flex_block_sparse", "sdpa"], directions=["fwd"], heads_q=4, heads_kv=2,
                gate_seqlen=128, masks=[{"name": "sparse", "pattern": "block_sparse_heads",
                                         "params": {"kept": 0.3, "block": 32}}])
    config = tmp_path / "sparse.yaml"
    config.write_text(yaml.safe_dump(grid))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "full_check.py"), str(tmp_path / "out"),
                           "--budget-s", "300", "--configfile", str(config), "--seqlen", "256"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {p.parent.parent.name: json.loads(p.read_text())["row"] for p in (tmp_path / "out" / "checks").rglob("*.json")}
    assert rows["flex_block_sparse"]["status"] == "ok", rows["flex_block_sparse"]
    assert rows["sdpa"]["status"] == "unsupported" and "one mask for every head" in rows["sdpa"]["reason"]
