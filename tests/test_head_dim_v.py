"""A value head dim other than the query/key one (``head_dim_v``: DeepSeek-V3's MLA, 192/128): cells
of it run and are gated, count their FLOPs per matmul, carry their own mark, and leave every cell of
one head dim with the settings, name and cache key it had before (issue 73)."""

import dataclasses
import json

import pytest
import torch

from longca import cells, config as longca_config, kernels, shapes
from longca.attention import masks, reference
from longca.attention.flops import attention_flops
from longca.attention.problem import Problem
from longca.execution.cache import parts
from longca.execution.measure.cell import CellSpec, run_cell

MLA = dict(seqlen=96, heads_q=4, heads_kv=2, head_dim=24, head_dim_v=16, warmup=1, reps=3, gate_seqlen=64)
BASE = {"kernels": ["sdpa"], "masks": ["causal", "full"], "seqlens": [256, 512], "directions": ["fwd"],
        "heads_q": 8, "heads_kv": 2, "head_dim": 64, "batch": 1, "cp_strategies": []}

# Computed by the code before head_dim_v existed (main at 53083ee), from BASE with head_dims [64, 128]:
# a cell of the grid's own shape and one of the axis's 128, their settings and part keys (fingerprint
# "fp").  Any change to how a one-head-dim cell's settings or keys come out fails here.
OLD_SETTINGS = {
    "causal": {"batch": 1, "device": "cpu", "direction": "fwd", "dtype": "float32", "gate_seqlen": 512,
               "head_dim": 64, "heads_kv": 2, "heads_q": 8, "kernel": "sdpa", "mask": "causal",
               "mask_params": {}, "pattern": "causal", "reps": 5, "seed": 0, "seqlen": 256, "warmup": 2},
    "causal@h8k2d128b1": {"batch": 1, "device": "cpu", "direction": "fwd", "dtype": "float32", "gate_seqlen": 512,
                          "head_dim": 128, "heads_kv": 2, "heads_q": 8, "kernel": "sdpa",
                          "mask": "causal@h8k2d128b1", "mask_params": {}, "pattern": "causal", "reps": 5,
                          "seed": 0, "seqlen": 256, "warmup": 2},
}
OLD_KEYS = {
    "causal": {"gate": "79bd62ed0d8edd193c219ff9", "time": "6cb8901385761310fe634ad6",
               "memory": "9508df05984196185e771c98"},
    "causal@h8k2d128b1": {"gate": "de2ce0cca07f3ddf183eb1ca", "time": "56fa4f62b90e9aeda1f8969a",
                          "memory": "764674e8e564ba05bbb3fa41"},
}


def resolved(**over):
    return longca_config.validate({**BASE, **over})


def _keys(settings):
    spec = dataclasses.asdict(CellSpec.from_dict(settings))
    return {p: parts.part_key(p, spec, "fp") for p in parts.PARTS}


@pytest.mark.parametrize("mask", list(OLD_SETTINGS))
def test_cells_of_one_head_dim_keep_their_settings_names_and_keys(mask):
    cfg = resolved(head_dims=[64, 128, "192/128"])
    settings = longca_config.cell_settings(cfg, "sdpa", mask, 256, "fwd", "float32")
    assert settings == OLD_SETTINGS[mask] and "head_dim_v" not in settings
    assert json.dumps(settings, sort_keys=True) == json.dumps(OLD_SETTINGS[mask], sort_keys=True)
    assert _keys(settings) == OLD_KEYS[mask]
    # head_dim_v spelt out, unset or equal to head_dim, keys the same cell.
    assert _keys({**settings, "head_dim_v": None}) == _keys({**settings, "head_dim_v": settings["head_dim"]}) \
        == OLD_KEYS[mask]
    assert cells.kernel_cell_id(settings) == f"sdpa/{mask}/float32_fwd_256"
    assert f"sdpa/{mask}/float32_fwd_256" in [c.name for c in longca_config.kernel_cells(cfg)]


def test_a_split_head_dim_on_the_axis_makes_its_own_marked_cells():
    cfg = resolved(head_dims=[64, "192/128"])
    labels = [gm.label for gm in longca_config.grid_masks(cfg)]
    assert labels == ["causal", "full", "causal@h8k2d192v128b1", "full@h8k2d192v128b1"]
    settings = longca_config.cell_settings(cfg, "sdpa", "causal@h8k2d192v128b1", 256, "fwd", "float32")
    assert (settings["head_dim"], settings["head_dim_v"]) == (192, 128)
    assert _keys(settings) != _keys({**settings, "head_dim_v": None})
    path = "results/cells/kernels/sdpa/causal@h8k2d192v128b1/float32_fwd_256.json"
    assert path in [c.path for c in longca_config.kernel_cells(cfg)]
    assert cells.split_shape("causal@h8k2d192v128b1") == ("causal", cells.Shape(8, 2, 192, 1, 128))
    assert cells.from_name(path) == cells.KernelCell("sdpa", "causal@h8k2d192v128b1", 256, "fwd", "float32")
    # "192/192" is one head dim: the plain mark; a --config override reads as the file does.
    assert cells.Shape(8, 2, 192, 1, 192).mark == "@h8k2d192b1"
    assert resolved(head_dims=["192/128"])["head_dims"] == ["192/128"]
    with pytest.raises(longca_config.ConfigError, match=r"config.head_dims\[0\]"):
        resolved(head_dims=["192/100"])


def test_the_mla_preset_validates_and_names_its_cells():
    preset = shapes.presets()["deepseek_v3"]
    assert (preset["heads_q"], preset["heads_kv"], preset["head_dim"], preset["head_dim_v"]) == (128, 128, 192, 128)
    cfg = resolved(masks=[], models=["deepseek_v3"], seqlens=[4096])
    assert longca_config.label_models(cfg) == {"causal@h128k128d192v128b1": ["deepseek_v3"],
                                               "varlen_causal@h128k128d192v128b1": ["deepseek_v3"]}
    settings = longca_config.cell_settings(cfg, "sdpa", "causal@h128k128d192v128b1", 4096, "fwd", "float32")
    assert (settings["heads_q"], settings["heads_kv"], settings["head_dim"], settings["head_dim_v"]) == (128, 128, 192, 128)
    own = {"name": "mine", "heads_q": 16, "heads_kv": 16, "head_dim": 192, "head_dim_v": 128, "masks": ["causal"]}
    assert "causal@h16k16d192v128b1" in longca_config.label_models(resolved(models=[own]))


def test_flops_count_each_matmul_over_its_own_head_dim():
    m = masks.build("causal", 96)
    a = m.area()
    assert attention_flops(m, 4, 24, "fwd", 2, head_dim_v=16) == 2 * a * 4 * (24 + 16) * 2
    assert attention_flops(m, 4, 24, "bwd", 2, head_dim_v=16) == 2 * a * 4 * (3 * 24 + 2 * 16) * 2
    for direction, factor in (("fwd", 1.0), ("bwd", 2.5)):  # one head dim: the count it always was
        assert attention_flops(m, 4, 24, direction, 2, head_dim_v=24) == attention_flops(m, 4, 24, direction, 2) \
            == factor * 4.0 * a * 4 * 24 * 2


@pytest.mark.parametrize("kernel", ["sdpa_math", "sdpa"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_a_split_head_dim_cell_runs_and_is_gated(kernel, direction):
    row = run_cell(CellSpec(kernel=kernel, mask="causal", direction=direction, **MLA))
    assert row["status"] == "ok", row["reason"]
    assert row["gate_error"] < row["gate_tolerance"]
    assert row["head_dim_v"] == 16
    area = masks.build("causal", 96).area()
    matmuls = (24 + 16) if direction == "fwd" else (3 * 24 + 2 * 16)
    assert row["flops"] == 2 * area * 4 * matmuls


def test_inputs_and_reference_take_v_head_dim():
    problem = Problem("causal", 32, 1, 4, 2, 24, torch.float64, torch.device("cpu"), "fwd", head_dim_v=16)
    q, k, v, grad_out = problem.make_inputs(requires_grad=False)
    assert (q.shape[-1], k.shape[-1], v.shape[-1], grad_out.shape[-1]) == (24, 24, 16, 16)
    out = reference.attention(q, k, v, problem.mask)
    assert out.shape == (1, 32, 4, 16)
    # One head dim, however spelt, draws the numbers it always drew.
    same = Problem("causal", 32, 1, 4, 2, 24, torch.float64, torch.device("cpu"), "fwd", head_dim_v=24)
    plain = Problem("causal", 32, 1, 4, 2, 24, torch.float64, torch.device("cpu"), "fwd")
    assert same.head_dim_v is None
    assert all(torch.equal(a, b) for a, b in zip(same.make_inputs(requires_grad=False),
                                                 plain.make_inputs(requires_grad=False)))


def test_a_kernel_without_the_flag_is_unsupported_with_the_reason():
    row = run_cell(CellSpec(kernel="sdpa_flash", mask="causal", **MLA))
    assert row["status"] == "unsupported"
    assert "takes one head dim for q, k and v" in row["reason"]
    assert not kernels.get("flash_attn3").takes_head_dim_v and not kernels.get("sdpa_flash").takes_head_dim_v
    assert kernels.get("sdpa_math").takes_head_dim_v and kernels.get("flex").takes_head_dim_v
