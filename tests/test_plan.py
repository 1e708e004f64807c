"""`longca plan` (longca/results/plan.py): 1M tokens on 64 : 8 heads, d 128, at 8 GPUs against the
published H200 tables, and its parts on their own."""

import pandas as pd
import pytest

from longca import cli, config
from longca.results import plan


def test_shard_need_is_what_config_counts_and_the_lse():
    shape = plan.Shape()
    need = plan.shard_need(131072, shape, "bwd")
    dims = {"batch": 1, "heads_q": 64, "heads_kv": 8, "head_dim": 128}
    assert need["inputs"] == 131072 * 128 * 2 * (64 + 2 * 8)
    assert sum(need.values()) - 131072 * 64 * 4 == config.input_bytes(dims, 131072, "bfloat16", True)


def test_buffers_follow_what_each_strategy_sends():
    shape = plan.Shape()
    _, kv = plan.cp_model.shard_bytes(1024, 64, 8, 128, 2)
    assert plan.BUFFERS["ring"]("fwd", 8, 1024, shape) == pytest.approx(2 * kv)       # two K/V blocks in flight
    assert plan.BUFFERS["allgather"]("fwd", 8, 1024, shape) == pytest.approx(8 * kv)  # the whole K/V
    assert plan.BUFFERS["ring"]("fwd", 1, 1024, shape) == 0 and plan.BUFFERS["magi"] is None


def test_plan_a_million_tokens_on_eight_h200s(capsys):
    assert cli.main(["plan", "--tokens", str(2**20), "--gpus", "8", "--gpu", "H200"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("# longca plan: 1048576 tokens, causal, 64:8 heads, d128 bfloat16, on H200 (140.4 GiB")
    assert any(line.startswith("# held out, time, by tokens per GPU: fitted without 65536") for line in lines)
    assert any(line.startswith("# held out, memory model:") for line in lines)
    assert any(line.startswith("# memory against the CP table's per-rank peaks: median") for line in lines)
    held = [line for line in lines if line.startswith("# held out, memory against the per-rank peaks: ")]
    assert len(held) == 1 and "cp_4xh100_graphs_2026-11-27" in held[0] and "fwd median" in held[0]
    rows = {line.split()[0]: line.split() for line in lines if not line.startswith("#")}
    assert set(rows) == {"strategy", *plan.STRATEGIES}
    for name in ("ring", "allgather", "ulysses", "usp"):
        r = rows[name]
        assert r[1:4] == ["8", "131072", "2.5"] and r[9] == "yes"  # 2 GiB of Q and 0.5 of K/V a GPU
        assert float(r[10]) > 0 and float(r[11]) > float(r[10])   # a backward outlasts its forward
    assert rows["magi"][9] == "?" and "MagiAttention" in " ".join(rows["magi"])


def test_plan_help_and_unknown_gpu(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["plan", "--help"])
    assert done.value.code == 0 and "--fewest" in capsys.readouterr().out
    assert cli.main(["plan", "--gpu", "A100"]) == 2
    assert "give --gpu-memory-gib" in capsys.readouterr().err


def test_memory_held_out_fits_on_another_tables_rows():
    h200 = plan.Tables(pd.read_parquet(cli.PUBLISHED_DIR / cli.PUBLISHED_TABLES["H200"][0]),
                       pd.read_parquet(cli.PUBLISHED_DIR / cli.PUBLISHED_TABLES["H200"][1]), "h200")
    h100 = plan.Tables(pd.read_parquet(cli.PUBLISHED_DIR / cli.PUBLISHED_TABLES["H100"][0]),
                       pd.read_parquet(cli.PUBLISHED_DIR / cli.PUBLISHED_TABLES["H100"][1]), "h100")
    fitted, checked = plan.peak_rows(h100), plan.peak_rows(h200)
    keys = lambda rows: set(map(tuple, rows[list(plan.cp_memory.ROW_KEY)].astype(str).to_numpy()))
    assert keys(fitted).isdisjoint(keys(checked)) and len(checked) == 238
    held = plan.memory_held_out(h200, h100)
    assert held["fitted_on"] == "h100" and held["fitted_rows"] == len(fitted) and held["rows"] == len(checked)
    assert held["median"] < plan.memory_check(h200)["median"]  # the fitted terms do better than the count
    with pytest.raises(ValueError, match="in both"):
        plan.memory_held_out(h200, h200)
    assert plan.memory_held_out(h200, None)["why"]
