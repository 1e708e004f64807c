"""`cp_env`: the CP launch environment, one preset per run, set in every rank's environment before it
starts, recorded in each row as the ranks saw it, and in the cell's settings (its cache key) unless
it is `default`, whose cells keep the key they had."""

import json
import subprocess
import sys

import pytest

import tiny
from longca import config, cp_env

OVERLAP = {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_CGA_CLUSTER_SIZE": "1", "TORCH_NCCL_HIGH_PRIORITY": "1"}


def _grid(**overrides):
    return config.validate(tiny.grid(masks=["causal"], cp_strategies=["ring"], cp_sizes=[2], cp_tokens_per_rank=[64],
                                     seqlens=[128], **overrides))


def _settings(cfg):
    return config.cp_cell_settings(cfg, "ring", "causal", 64, 2, "fwd", "float32")


def test_presets_are_data_and_default_sets_nothing():
    assert cp_env.presets()["default"] == {}
    assert cp_env.presets()["overlap"] == OVERLAP
    assert cp_env.watched() == tuple(sorted(OVERLAP))


def test_default_keeps_the_cells_settings_and_another_preset_is_in_them():
    default, overlap = _grid(), _grid(cp_env="overlap")
    assert default["cp_env"] == "default"
    assert _settings(_grid(cp_env="default")) == _settings(default)
    assert "cp_env" not in _settings(default) and "cp_env_set" not in _settings(default)  # the key as before
    assert _settings(overlap) == {**_settings(default), "cp_env": "overlap", "cp_env_set": OVERLAP}
    assert cp_env.split(_settings(overlap)) == (_settings(default), "overlap")


def test_an_unknown_preset_is_a_config_error_naming_key_and_value():
    with pytest.raises(config.ConfigError, match=r"config\.cp_env: unknown CP launch environment 'overlapp'.*"
                                                 r"known: default, overlap.*did you mean 'overlap'"):
        _grid(cp_env="overlapp")
    with pytest.raises(config.ConfigError, match=r"config\.cp_env"):
        _grid(cp_env=3)


def test_a_rank_without_the_presets_values_makes_the_row_an_error():
    seen = {k: v for k, v in OVERLAP.items()}
    ok = cp_env.record({"status": "ok", "reason": None}, "overlap", [seen, seen])
    assert ok["status"] == "ok" and json.loads(ok["cp_env_vars"]) == OVERLAP and ok["cp_env"] == "overlap"
    wrong = cp_env.record({"status": "ok", "reason": None}, "overlap", [seen, {**seen, "NCCL_CGA_CLUSTER_SIZE": None}])
    assert wrong["status"] == "error"
    assert "rank 1 saw NCCL_CGA_CLUSTER_SIZE=None (the preset sets NCCL_CGA_CLUSTER_SIZE=1)" in wrong["reason"]
    apart = cp_env.record({"status": "ok"}, "default", [{"A": "1"}, {"A": "2"}])
    assert apart["status"] == "error" and "rank 1 saw A=2" in apart["reason"]


def test_an_unknown_preset_fails_before_any_rank_starts(tmp_path, monkeypatch):
    from longca.execution.cluster import cp_launch

    def no_launch(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(cp_launch, "_run", no_launch)  # a torchrun of its own
    monkeypatch.setattr(cp_launch, "_run_resident", no_launch)  # a resident group
    settings = {"strategy": "ring", "mask": "causal", "seqlen": 128, "cp_size": 2, "cp_env": "nope"}
    for isolation in ("fork", "worker"):
        row = cp_launch.run(settings, str(tmp_path / f"{isolation}.json"), cell_id="ring/causal", isolation=isolation)
        assert row["status"] == "error" and "unknown CP launch environment 'nope'" in row["reason"], row
        assert row["cp_env"] == "nope"
    # A rank given one by hand stops before its process group exists.
    out = subprocess.run([sys.executable, "-m", "longca.execution.measure.cp_rank", "--settings",
                          json.dumps(settings), "--out", str(tmp_path / "rank.json")], capture_output=True, text=True)
    assert out.returncode != 0 and "unknown CP launch environment 'nope'" in out.stderr
    assert not (tmp_path / "rank.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["fork", "worker"])
def test_ranks_under_real_torchrun_see_the_preset_and_the_row_records_what_they_saw(tmp_path, monkeypatch, isolation):
    """gloo, 2 ranks: the launching shell sets one of the variables itself; under `default` the ranks
    inherit it (and the row says so), under `overlap` the preset's value is what they see.  In the
    resident group (`worker`) the two presets are two groups."""
    from longca.execution.cluster.cp_launch import run

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "3")
    monkeypatch.delenv("NCCL_CGA_CLUSTER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_HIGH_PRIORITY", raising=False)
    monkeypatch.setenv("LONGCA_WORKER_IDLE_S", "2")
    monkeypatch.setenv("LONGCA_TEST_GROUP", str(tmp_path))  # groups of this test's own (worker key)
    rows = {}
    for preset in ("overlap", "default"):
        cfg = tiny.cp_cell(**cp_env.settings_entry(preset))
        rows[preset] = run(cfg, str(tmp_path / f"{preset}.json"), cell_id=f"ring/{preset}", timeout_s=240, threads=2,
                           isolation=isolation)
        assert rows[preset]["status"] == "ok", rows[preset].get("reason")
        assert rows[preset]["isolation"] == ("resident" if isolation == "worker" else "fork")
        assert rows[preset]["cp_env"] == preset
    assert json.loads(rows["overlap"]["cp_env_vars"]) == OVERLAP
    assert json.loads(rows["default"]["cp_env_vars"]) == {"CUDA_DEVICE_MAX_CONNECTIONS": "3",
                                                         "NCCL_CGA_CLUSTER_SIZE": None, "TORCH_NCCL_HIGH_PRIORITY": None}
    if isolation == "worker":
        assert rows["default"]["group_cell"] == 1  # not served by the overlap group
