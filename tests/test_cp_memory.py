"""longca/results/cp_memory.py: the terms of a CP rank's measured peak, their fit, and the held-out
check `longca plan` prints (fitted on one GPU model's CP table, checked on another's)."""

import numpy as np
import pandas as pd
import pytest

from longca.results import cp_memory


def _rows(n=12, seed=0, device="GPU A"):
    rng = np.random.default_rng(seed)
    p = rng.choice([1, 2, 4], n)
    tokens = rng.choice([8192, 16384, 65536], n)
    frame = pd.DataFrame({"cell_id": [f"c{i}" for i in range(n)], "device_name": device,
                          "direction": rng.choice(["fwd", "bwd"], n), "cp_size": p, "tokens_per_rank": tokens,
                          "heads_q": 64, "heads_kv": 8, "head_dim": 128, "itemsize": 2, "batch": 1,
                          "kernel": tokens * 84.25 * 1024, "buffers": np.where(p > 1, tokens * 8192.0, 0.0)})
    return frame


def test_harness_is_the_global_inputs_above_cp_size_1():
    # cp_size 4, 1024 tokens a rank, 64:8 heads of 128 in bf16: Q and dO of 64 heads, K and V of 8, four shards.
    assert cp_memory.harness_bytes(4, 1024, 64, 8, 128, 2) == 4 * 1024 * 128 * 2 * (64 + 64 + 8 + 8)
    assert cp_memory.harness_bytes(1, 1024, 64, 8, 128, 2) == 0
    assert cp_memory.harness_bytes(2, 1024, 64, 8, 128, 2, batch=3) == 3 * 2 * 1024 * 128 * 2 * 144
    # Rows that record holding only their shards (measured from 2026-11-29 on) held none; older rows
    # (no record) did.
    held = cp_memory.harness_bytes([4, 4, 4], 1024, 64, 8, 128, 2, inputs_held=["shards", None, float("nan")])
    assert list(held) == [0, 4 * 1024 * 128 * 2 * 144, 4 * 1024 * 128 * 2 * 144]


def test_fit_recovers_the_coefficients_it_was_made_with():
    rows = _rows(40)
    truth = {"constant": 2e8, "kernel": 1.0, "harness": 0.3, "buffers": 0.5}
    rows["peak"] = cp_memory.predict(truth, rows)
    fitted = cp_memory.fit(rows)
    assert fitted == pytest.approx(truth, rel=1e-6)
    assert np.abs(cp_memory.errors(fitted, rows)).max() < 1e-9


def test_held_out_refuses_rows_it_was_fitted_on():
    rows = _rows(40)
    rows["peak"] = cp_memory.predict({"constant": 2e8, "kernel": 1.0, "harness": 0.3, "buffers": 0.5}, rows)
    with pytest.raises(ValueError, match="in both"):
        cp_memory.held_out(rows, rows.iloc[:5])
    other = rows.assign(device_name="GPU B")  # the same cells measured on another GPU model: held out
    checked = cp_memory.held_out(rows, other)
    assert checked["rows"] == 40 and checked["median"] < 1e-9
    assert sum(e["rows"] for e in checked["by_direction"].values()) == 40


def test_held_out_error_is_the_checked_rows_own():
    train = _rows(40)
    train["peak"] = cp_memory.predict({"constant": 2e8, "kernel": 1.0, "harness": 0.3, "buffers": 0.5}, train)
    test = _rows(20, seed=1, device="GPU B")
    test["peak"] = cp_memory.predict({"constant": 2e8, "kernel": 1.0, "harness": 0.3, "buffers": 0.5}, test) * 1.2
    checked = cp_memory.held_out(train, test)
    assert checked["median"] == pytest.approx(1 - 1 / 1.2, rel=1e-6)  # each row 16.7 % below
    assert checked["under"] == 20
