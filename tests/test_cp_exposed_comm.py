"""Exposed communication, measured (config ``cp_exposed_comm``): the CP step timed again with every
collective a local copy of the same bytes (``longca.cp.comm.local_copies``).  Under real torchrun
with gloo on the CPU: the local copies fill every output buffer at its size with the rank's own data
and nothing crosses ranks; a cell with the key on has the columns (null with the reason for a
library's own collectives); with the key off a cell's settings, its cache key, are what they were."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import tiny
from longca import config, cp
from longca.results import cp_model
from longca.results import parquet as results

HERE = Path(__file__).resolve().parent
OURS = {"allgather", "double_ring", "groupcast", "ring", "ulysses", "usp"}
COLUMNS = ("step_ms_local_comm", "step_ms_local_comm_p20", "step_ms_local_comm_p80", "exposed_comm_ms",
           "exposed_comm_via", "local_comm_wall_s")


@pytest.mark.slow
def test_local_copies_fill_every_output_with_the_ranks_own_bytes_and_send_nothing(tmp_path):
    out = tmp_path / "seen.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(HERE / "cp_local_copy_script.py"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    every = json.loads(out.read_text())
    for rank, seen in enumerate(every):
        mine = [float(rank + 1)]  # what a real collective would mix with the other rank's value
        assert seen["all_gather"] == {"shape": [2, 3, 5], "values": mine}
        assert seen["all_to_all"] == {"shape": [2, 2, 4], "values": mine}
        assert seen["reduce_scatter"] == {"shape": [6], "values": mine}  # not summed over ranks (3.0)
        assert seen["exchange"] == {"shape": [[2, 3], [4]], "values": mine}  # not the neighbour's
        assert seen["all_to_all_uneven"] == {"shape": [5, 2], "values": mine}  # every row written
        assert "torch.distributed.all_reduce called outside longca.cp.comm" in seen["direct_all_reduce"]
        assert seen["steps"] == dict.fromkeys(sorted(OURS), "ok"), seen["steps"]
        assert seen["after"] == [1.0, 2.0]  # the mode ends: collectives move data again


def test_every_strategy_either_routes_its_collectives_through_comm_or_says_why_not():
    """The switchable ones are the ones the torchrun test steps through in local-copy mode."""
    ours = {n for n in cp.names() if not n.startswith("test_") and cp.get(n).own_collectives is None}
    assert ours == OURS
    assert {"torch_cp", "magi", "ring_flash_attn", "yunchang", "te_cp"} <= {
        n for n in cp.names() if cp.get(n).own_collectives}


def _cell(**over):
    # Longer and timed more than tiny's: two timings of one step are compared.
    return tiny.cp_cell(seqlen=512, reps=5, warmup=1, **over)


@pytest.mark.slow
def test_a_cell_with_the_key_on_records_the_local_copy_timing_and_the_difference(tmp_path):
    from longca.execution.cluster.cp_launch import run

    rows = {}
    for strategy in ("ring", "allgather"):
        rows[strategy] = run(_cell(strategy=strategy, cp_exposed_comm=True), str(tmp_path / f"{strategy}.json"),
                             cell_id=f"{strategy}/causal", timeout_s=120, threads=2)
    for strategy, row in rows.items():
        assert row["status"] == "ok", row.get("reason")
        assert row["exposed_comm_via"] == "local_copy"
        assert row["step_ms_local_comm"] > 0 and row["local_comm_wall_s"] > 0
        assert row["step_ms_local_comm_p20"] <= row["step_ms_local_comm"] <= row["step_ms_local_comm_p80"]
        # As measured, not clamped (it may be negative within the spread).
        assert row["exposed_comm_ms"] == pytest.approx(row["median_ms"] - row["step_ms_local_comm"])
    results.aggregate([tmp_path / "ring.json", tmp_path / "allgather.json"], tmp_path / "cp.parquet",
                      schema=results.CP_SCHEMA)
    table = pd.read_parquet(tmp_path / "cp.parquet")
    assert table[list(COLUMNS)].notna().all().all()


@pytest.mark.parametrize("strategy", ["torch_cp", "magi", "ring_flash_attn", "yunchang", "te_cp"])
def test_a_library_strategy_gets_null_columns_with_the_reason(strategy):
    """Decided before any timing (on CPU these strategies are `unsupported` before they get here)."""
    from longca.execution.measure.cp_cell import CPSpec, exposed_comm

    spec = CPSpec.from_dict(_cell(strategy=strategy, cp_exposed_comm=True, strategy_options={}))
    got = exposed_comm(spec, None, {"median_ms": 1.0})
    assert set(got) == set(COLUMNS)
    assert all(got[c] is None for c in COLUMNS if c != "exposed_comm_via")
    assert got["exposed_comm_via"].startswith(f"not measured: {strategy}: ")
    assert "own" in got["exposed_comm_via"] and "collectives" in got["exposed_comm_via"]


@pytest.mark.slow
def test_with_the_key_off_the_row_has_no_such_values(tmp_path):
    from longca.execution.cluster.cp_launch import run

    row = run(_cell(), str(tmp_path / "row.json"), cell_id="ring/causal", timeout_s=120, threads=2)
    assert row["status"] == "ok", row.get("reason")
    assert all(row.get(c) is None for c in COLUMNS)


# A CP cell's settings (its cache key) on main before the key existed, for the grid below.
MAIN_SETTINGS = {"batch": 1, "cp_size": 2, "device": "cpu", "direction": "fwd", "dtype": "float32", "gate_seqlen": 64,
                 "head_dim": 16, "heads_kv": 2, "heads_q": 2, "mask": "causal", "mask_params": {}, "pattern": "causal",
                 "reps": 2, "seed": 0, "seqlen": 128, "strategy": "ring", "warmup": 1}


def _settings(**overrides):
    cfg = config.validate(tiny.grid(masks=["causal"], cp_strategies=["ring"], cp_sizes=[2], cp_tokens_per_rank=[64],
                                    seqlens=[128], **overrides))
    return cfg, config.cp_cell_settings(cfg, "ring", "causal", 64, 2, "fwd", "float32")


def test_the_key_off_keeps_the_cells_cache_key_and_on_joins_it():
    cfg, off = _settings()
    assert cfg["cp_exposed_comm"] is False
    assert off == MAIN_SETTINGS == _settings(cp_exposed_comm=False)[1]
    assert _settings(cp_exposed_comm=True)[1] == {**MAIN_SETTINGS, "cp_exposed_comm": True}
    with pytest.raises(config.ConfigError, match="cp_exposed_comm: 'maybe' is not of type 'boolean'"):
        _settings(cp_exposed_comm="maybe")


def test_the_measured_exposed_comm_sits_beside_the_models():
    # Tiles nearly free: the ring's hops are not hidden, so the model predicts some exposed time.
    model = cp_model.Model(tile_s={"fwd": 1e-12}, efficiency={("ring", "causal", "fwd"): {256: 1.0}},
                           links=cp_model.Links(nvlink_gbs=100.0, gpus_per_node=8, network_gbs=50.0))
    base = {"status": "ok", "mask": "causal", "direction": "fwd", "tokens_per_rank": 256, "cp_size": 2,
            "mask_params": "{}", "seed": 0, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "dtype": "float32",
            "p20_ms": 1.0, "p80_ms": 1.2, "step_ms_local_comm_p20": 0.5, "step_ms_local_comm_p80": 0.9}
    table = pd.DataFrame([{**base, "strategy": "ring", "exposed_comm_ms": 0.3},
                          {**base, "strategy": "magi", "exposed_comm_ms": None},
                          {**base, "strategy": "groupcast", "exposed_comm_ms": 0.1}])
    got = cp_model.exposed_comm(model, table)
    assert list(got["strategy"]) == ["ring", "groupcast"]  # rows with a measured value only
    ring = got.iloc[0]
    assert ring["measured_exposed_comm_ms"] == 0.3 and ring["spread_ms"] == pytest.approx(0.4)
    predicted = model.step(cp_model.Cell.from_row(next(table.head(1).itertuples())))["exposed_comm_ms"]
    assert predicted > 0 and ring["predicted_exposed_comm_ms"] == pytest.approx(predicted) and pd.isna(ring["why"])
    groupcast = got.iloc[1]  # not modelled: no figure, and why
    assert pd.isna(groupcast["predicted_exposed_comm_ms"]) and "groupcast" in groupcast["why"]
    assert cp_model.exposed_comm(model, table.drop(columns=["exposed_comm_ms"])).empty
