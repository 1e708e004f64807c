"""lab/longca_lab/run_to_run.py on kernel and CP tables: cells matched by their own keys, flips named."""

import pandas as pd
import pytest

from longca_lab import run_to_run


def _cp(values: dict[str, float]) -> pd.DataFrame:
    rows = [{"strategy": s, "mask": "causal", "tokens_per_rank": 8192, "cp_size": 2, "direction": "fwd",
             "dtype": "bfloat16", "status": "ok", "tflops_per_gpu": v, "batch": 1, "heads_q": 64,
             "heads_kv": 8, "head_dim": 128} for s, v in values.items()]
    return pd.DataFrame(rows)


def test_cp_tables_pair_by_strategy_and_cp_size_and_name_a_changed_winner():
    a, b = _cp({"ring": 500.0, "ulysses": 490.0}), _cp({"ring": 480.0, "ulysses": 495.0})
    assert run_to_run.kind_of(a) is run_to_run.CP
    pairs = run_to_run.ratios(a, b, run_to_run.CP)
    assert sorted(pairs["ratio"].round(3)) == [0.96, 1.01]
    text = run_to_run.summary(a, b)
    assert "ok in both: 2" in text
    assert "fastest strategy differs in 1 of 1" in text
    assert "| causal | 8K | 2 | fwd | ring | ulysses | 1.020× |" in text


def test_kernel_tables_keep_their_keys_and_a_different_shape_is_refused():
    a = pd.DataFrame([{"kernel": "fa3", "mask": "causal", "seqlen": 4096, "direction": "fwd", "dtype": "bfloat16",
                       "status": "ok", "tflops": 400.0, "heads_q": 64}])
    assert run_to_run.kind_of(a) is run_to_run.KERNELS
    assert "B / A: median 1.1000" in run_to_run.summary(a, a.assign(tflops=440.0))
    with pytest.raises(ValueError, match="heads_q"):
        run_to_run.summary(a, a.assign(heads_q=32))
