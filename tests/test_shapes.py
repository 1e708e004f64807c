"""Shape axes and model presets: the cells a config makes, their names and settings, what validation
names, the kernels that refuse a head dim, the per-model answer and a row's reproduce command."""

import json
import shlex
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from longca import cells, config as longca_config, kernels, shapes
from longca.results import reproduce, tables
from longca.results.parquet import with_models

BASE = {"kernels": ["sdpa"], "masks": ["causal", "full"], "seqlens": [256, 512], "directions": ["fwd"],
        "heads_q": 8, "heads_kv": 2, "head_dim": 64, "batch": 1, "cp_strategies": []}


def resolved(**over):
    return longca_config.validate({**BASE, **over})


def paths(cfg):
    return [c.path for c in longca_config.kernel_cells(cfg)]


def test_the_single_value_keys_make_the_cells_they_always_made():
    cfg = resolved()
    assert paths(cfg) == [f"results/cells/kernels/sdpa/{m}/float32_fwd_{n}.json" for m in ("causal", "full")
                          for n in (256, 512)]
    assert longca_config.cell_settings(cfg, "sdpa", "causal", 256, "fwd", "float32")["mask"] == "causal"


def test_axes_expand_into_marked_cells_with_their_own_settings():
    cfg = resolved(head_dims=[64, 128], gqa_ratios=[4, 8, "mqa"], batches=[1, 2])
    labels = [gm.label for gm in longca_config.grid_masks(cfg)]
    assert labels[:2] == ["causal", "full"]  # the grid's own shape first, unmarked
    assert len(labels) == 2 * 2 * 2 * 2  # masks x head dims x kv heads (8:1 and mqa are both 1) x batches
    assert "causal@h8k1d128b2" in labels
    cell = next(c for c in longca_config.kernel_cells(cfg) if c.mask == "causal@h8k1d128b2" and c.seqlen == 256)
    assert cell.path == "results/cells/kernels/sdpa/causal@h8k1d128b2/float32_fwd_256.json"  # 512 tokens, batch 2
    settings = longca_config.cell_settings(cfg, *[getattr(cell, k) for k in ("kernel", "mask", "seqlen", "direction",
                                                                             "dtype")])
    assert {k: settings[k] for k in ("mask", "pattern", "heads_q", "heads_kv", "head_dim", "batch", "seqlen")} == {
        "mask": "causal@h8k1d128b2", "pattern": "causal", "heads_q": 8, "heads_kv": 1, "head_dim": 128, "batch": 2,
        "seqlen": 256}
    assert cells.kernel_cell_id(settings) == cell.name


def test_a_mark_is_read_back_from_a_name_and_a_path():
    shape = cells.Shape(64, 8, 256, 2)
    assert cells.shaped_mask("causal", shape, cells.Shape(64, 8, 128, 1)) == "causal@h64k8d256b2"
    assert cells.shaped_mask("causal", shape, shape) == "causal"
    assert cells.split_shape("causal@h64k8d256b2") == ("causal", shape)
    assert cells.split_shape("causal~layout1") == ("causal~layout1", None)
    cell = cells.from_name("results/cells/kernels/flex/causal@h64k8d256b2/bfloat16_bwd_4096.json")
    assert cell == cells.KernelCell("flex", "causal@h64k8d256b2", 4096, "bwd", "bfloat16")


def test_presets_add_their_masks_at_their_shape_and_name_their_model():
    cfg = resolved(models=["gpt_oss", "llama3_70b"], batches=[1, 2])
    models = longca_config.label_models(cfg)
    assert models["sliding_window_causal_128@h64k8d64b2"] == ["gpt_oss"]
    assert models["causal@h64k8d128b1"] == ["llama3_70b"]
    # The config's own masks stay at the grid's shape; a preset's only at its own.
    assert "full@h64k8d64b1" not in models and "full" in [gm.label for gm in longca_config.grid_masks(cfg)]
    settings = longca_config.cell_settings(cfg, "sdpa", "sliding_window_causal_128@h64k8d64b1", 512, "fwd", "float32")
    assert settings["pattern"] == "sliding_window_causal" and settings["mask_params"] == {"window": 128}


def test_presets_of_one_shape_and_mask_share_the_cell():
    twin = {"name": "twin", "heads_q": 64, "heads_kv": 8, "head_dim": 64, "masks": ["causal"]}
    cfg = resolved(models=["gpt_oss", twin])
    assert longca_config.label_models(cfg)["causal@h64k8d64b1"] == ["gpt_oss", "twin"]


def test_shipped_presets_are_valid_configs_of_their_own():
    for name, preset in shapes.presets().items():
        cfg = longca_config.validate({**BASE, "masks": [], "models": [name], "seqlens": [4096]})
        assert {gm.shape.head_dim for gm in longca_config.grid_masks(cfg)} == {preset["head_dim"]}
    assert shapes.presets()["gpt_oss"]["masks"][1]["params"] == {"window": 128}


@pytest.mark.parametrize("over, says", [
    ({"head_dims": [100]}, "config.head_dims[0]: 100 is not one of"),
    ({"gqa_ratios": [3]}, "config.gqa_ratios[0]: 3 does not divide config.heads_q = 8"),
    ({"batches": [3]}, "config.batches[0]: 3 does not divide the tokens of seqlen 256"),
    ({"models": ["llama5"]}, "config.models[0]: unknown model preset 'llama5'"),
    ({"models": [{"name": "m", "heads_q": 6, "heads_kv": 4, "head_dim": 64, "masks": ["causal"]}]},
     "config.models[0] (m): heads_q 6 is not a multiple of heads_kv 4"),
    ({"models": [{"name": "m", "heads_q": 8, "heads_kv": 4, "head_dim": 60, "masks": ["causal"]}]},
     "config.models[0].head_dim: 60 is not one of"),
    ({"masks": []}, "config.masks: no mask"),
    ({"batches": [2], "masks": [{"name": "w", "pattern": "sliding_window_causal", "params": {"window": 200}}],
      "seqlens": [256]}, None),
])
def test_validation_names_the_bad_key_before_any_work(over, says):
    if says is None:  # a window shorter than each batch's sequences is fine
        resolved(**over)
        return
    with pytest.raises(longca_config.ConfigError) as err:
        resolved(**over)
    assert says in str(err.value)


def test_a_config_override_of_the_axes_reads_as_the_file_does():
    cfg = resolved(**{"head_dims": ["128"], "gqa_ratios": ["8", "mqa"], "batches": ["2"]})
    assert (cfg["head_dims"], cfg["gqa_ratios"], cfg["batches"]) == ([128], [8, "mqa"], [2])


def test_shipped_gpu_grids_of_presets_and_shapes_resolve():
    for overlay, n in (("config/models.yaml", 900), ("config/shapes.yaml", 1350)):
        cfg = longca_config.validate(longca_config.merge_files(["config/config.yaml", "config/gpu.yaml", overlay]))
        assert len(list(longca_config.kernel_cells(cfg))) == n
        assert not list(longca_config.cp_cells(cfg))


@pytest.mark.parametrize("name, head_dim, refused", [("flash_attn4", 256, "takes head dims 64, 96, 128, not 256"),
                                                     ("flash_attn4", 128, None),
                                                     ("flash_attn2", 100, "takes head dims 8, 16 … 256, not 100"),
                                                     ("flash_attn2", 256, None), ("flash_attn3", 256, None)])
def test_flash_attention_refuses_head_dims_its_release_is_not_built_for(name, head_dim, refused, monkeypatch):
    kernel = kernels.get(name)
    monkeypatch.setattr(kernel, "available", lambda: None)  # as on a GPU box with the library
    monkeypatch.setattr("longca.kernels.flash_attn.unsupported_reason", lambda *a: None)
    problem = SimpleNamespace(head_dim=head_dim, device=torch.device("cuda"), dtype=torch.bfloat16, direction="fwd")
    reason = kernel.supports(problem)
    assert (reason is None) if refused is None else (refused in reason)


def _row(kernel, mask, tflops, **shape):
    return {"kernel": kernel, "mask": mask, "seqlen": 1024, "direction": "fwd", "dtype": "bfloat16",
            "status": "ok", "tflops": tflops, "tflops_p20": tflops, "tflops_p80": tflops, "warmup_steady": True,
            "cell_id": f"{kernel}/{mask}/bfloat16_fwd_1024", "heads_q": 64, "heads_kv": 8, "head_dim": 128, "batch": 1,
            **shape}


def test_the_answer_per_model_names_each_presets_best_kernel():
    rows = [_row("flex", "causal", 300.0), _row("flash_attn3", "causal", 500.0),
            _row("flex", "causal@h64k8d64b1", 200.0, head_dim=64), _row("cudnn_fe", "causal@h64k8d64b1", 250.0, head_dim=64),
            _row("flex", "full", 100.0)]
    df = pd.DataFrame(with_models(rows, {"causal": ["llama3_70b"], "causal@h64k8d64b1": ["gpt_oss", "twin"]}))
    answers = {(e["model"], e["model_mask"]): e for e in tables.model_answers(df)}
    assert set(answers) == {("llama3_70b", "causal"), ("gpt_oss", "causal"), ("twin", "causal")}
    assert answers["llama3_70b", "causal"]["kernel"] == "flash_attn3"
    assert answers["gpt_oss", "causal"]["kernel"] == "cudnn_fe" and answers["gpt_oss", "causal"]["runner_up"] == "flex"
    assert answers["gpt_oss", "causal"]["shape"] == "64:8 · d64 · batch 1"
    assert tables.model_answers(pd.DataFrame([_row("flex", "full", 1.0)])) == []


def test_a_rows_reproduce_command_carries_the_cells_settings_and_file():
    cfg = resolved(head_dims=[64, 128])
    command = reproduce.command(cfg, {"kernel": "sdpa", "mask": "causal@h8k2d128b1", "seqlen": 512,
                                      "direction": "fwd", "dtype": "float32"})
    argv = shlex.split(command)
    assert argv[:2] == ["longca", "run-cell"] and argv[2] == "--settings" and argv[4] == "--out"
    assert json.loads(argv[3]) == longca_config.cell_settings(cfg, "sdpa", "causal@h8k2d128b1", 512, "fwd", "float32")
    assert argv[5] == "results/cells/kernels/sdpa/causal@h8k2d128b1/float32_fwd_512.json"
    assert reproduce.command(cfg, {"kernel": "sdpa", "mask": "nosuch", "seqlen": 512, "direction": "fwd",
                                   "dtype": "float32"}) is None
