"""The sparse study's answer (longca/results/sparse.py) and its card in the report: per block, kept
fraction and length, the fastest block-sparse kernel and its speed against the fastest dense kernel
on the full mask at that length, on synthetic rows through the real schema (made-up numbers)."""

import json

import pandas as pd

from longca.results import report, sparse
from longca.results.parquet import KERNEL_SCHEMA, to_table

SHAPE = {"batch": 1, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "device": "cuda", "dtype": "bfloat16",
         "seed": 0, "gate_seqlen": 64, "mask_params": "{}", "device_name": "Synthetic GPU"}


def _row(kernel, mask, pattern, ms, *, kept=None, status="ok", reason=None, direction="fwd"):
    params = {} if kept is None else {"kept": kept, "block": 64, "kept_actual": kept, "heads": 2, "group": 2}
    area = int((kept or 1.0) * 256 * 256)
    flops = 4.0 * area * 4 * 16
    row = {"kind": "kernel", "cell_id": f"{kernel}/{mask}/bfloat16_{direction}_256", "kernel": kernel, "mask": mask,
           "pattern": pattern, "seqlen": 256, "direction": direction, "area": area, "flops": flops,
           "mask_params_resolved": json.dumps(params), "status": status, "reason": reason, **SHAPE}
    if status == "ok":
        row.update(median_ms=ms, p20_ms=ms * 0.98, p80_ms=ms * 1.02, tflops=flops / (ms * 1e-3) / 1e12,
                   tflops_p20=flops / (ms * 1.02e-3) / 1e12, tflops_p80=flops / (ms * 0.98e-3) / 1e12)
    return row


def _table():
    per_head = "dense_kernel takes one mask for every head; sparse_k0.1 has a block pattern per KV head"
    rows = [_row("dense_kernel", "full", "full", 2.0), _row("other_dense", "full", "full", 3.0),
            _row("sparse_a", "full", "full", None, status="unsupported", reason="runs per-head patterns"),
            _row("sparse_a", "sparse_k0.1", "block_sparse_heads", 0.5, kept=0.1),
            _row("sparse_b", "sparse_k0.1", "block_sparse_heads", 0.8, kept=0.1),
            _row("dense_kernel", "sparse_k0.1", "block_sparse_heads", None, kept=0.1, status="unsupported",
                 reason=per_head),
            _row("sparse_a", "sparse_k0.8", "block_sparse_heads", 4.0, kept=0.8),
            _row("sparse_b", "sparse_k0.8", "block_sparse_heads", None, kept=0.8, status="error", reason="boom")]
    return to_table(rows, KERNEL_SCHEMA).to_pandas()


def test_the_fastest_sparse_kernel_and_its_speed_against_dense_on_full():
    answers = {e["kept"]: e for e in sparse.answers(_table())}
    low, high = answers[0.1], answers[0.8]
    assert low["kernel"] == "sparse_a" and low["runner_up"] == "sparse_b"
    assert low["dense_kernel"] == "dense_kernel" and low["speedup"] == 2.0 / 0.5
    assert low["failed"] == ""  # dense kernels' per-head refusals are no news
    assert high["kernel"] == "sparse_a" and high["speedup"] == 2.0 / 4.0
    assert high["failed"] == "sparse_b !"


def test_the_report_shows_the_sparse_card_only_when_there_are_sparse_rows(tmp_path):
    html = report.render(_table(), tmp_path / "r.html").read_text()
    assert 'id="sparse-table"' in html
    assert "4.00× the speed of dense" in html and "0.50× the speed of dense" in html
    assert 'class="sparse-costs"' in html and 'class="sparse-pays"' in html
    dense_only = _table()
    dense_only = dense_only[dense_only["pattern"] == "full"]
    assert 'id="sparse-table"' not in report.render(dense_only, tmp_path / "d.html").read_text()


def test_no_rows_no_answers():
    assert sparse.answers(pd.DataFrame(columns=["pattern"])) == []
