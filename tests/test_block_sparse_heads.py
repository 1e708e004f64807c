"""The sparse study's mask, ``block_sparse_heads``: a random block pattern per KV head at an exact
kept fraction; the exact reference masks each query head with its KV head's tiles; config fills
the heads in from the grid and rejects what cannot work; kernels that take one mask for every head
are `unsupported`; FlexAttention's BlockMask of kept tiles is exact attention (CPU, forward)."""

import numpy as np
import pytest
import torch

from longca import config as longca_config
from longca import kernels
from longca.attention import chunked_reference, masks, reference
from longca.attention.masks import gate as gate_masks
from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.cell import CellSpec, run_cell


def _mask(seqlen=512, **params):
    return masks.build("block_sparse_heads", seqlen, seed=5, **{"kept": 0.3, "block": 32, "heads": 3,
                                                                "group": 2, **params})


def test_every_query_tile_of_every_head_keeps_the_same_number_of_tiles():
    mask = _mask()
    tiles = 512 // 32
    per_row = round(0.3 * tiles)
    assert mask.kept_blocks.shape == (3, tiles, tiles)
    assert (mask.kept_blocks.sum(-1) == per_row).all()
    assert mask.params["kept_actual"] == per_row / tiles and mask.params["tiles_per_row"] == per_row
    assert mask.area() == tiles * per_row * 32 * 32
    # Drawn per head and reproducible from the seed.
    assert not (mask.kept_blocks[0] == mask.kept_blocks[1]).all()
    assert (masks.build("block_sparse_heads", 512, seed=5, kept=0.3, block=32, heads=3, group=2).kept_blocks
            == mask.kept_blocks).all()
    assert not (masks.build("block_sparse_heads", 512, seed=6, kept=0.3, block=32, heads=3, group=2).kept_blocks
                == mask.kept_blocks).all()


def test_small_fractions_keep_one_tile_and_the_whole_fraction_keeps_all():
    assert (_mask(kept=0.01).kept_blocks.sum(-1) == 1).all()
    assert _mask(kept=1.0).kept_blocks.all() and _mask(kept=1.0).density() == 1.0


def test_runs_slices_and_dense_rows_describe_the_same_tiles():
    mask = _mask()
    heads, rows, first, end = mask.runs()
    rebuilt = np.zeros_like(mask.kept_blocks)
    for h, i, a, b in zip(heads, rows, first, end):
        assert not rebuilt[h, i, a:b].any()
        rebuilt[h, i, a:b] = True
    assert (rebuilt == mask.kept_blocks).all()
    dense = mask.to_dense()
    assert dense.shape == (6, 512, 512)
    for h in range(3):
        head = masks.from_slices("head", 512, 512, [s.as_tuple() for s in mask.head_slices(h)])
        assert sum(s.area() for s in mask.head_slices(h)) == mask.area()
        for g in range(2):  # the query heads of KV head h's group share its pattern
            assert torch.equal(dense[2 * h + g], head.to_dense())
    assert torch.equal(mask.dense_rows(100, 300), dense[:, 100:300])


def test_the_reference_masks_each_query_head_with_its_kv_heads_tiles():
    mask = _mask(seqlen=256)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 256, 6, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 256, 3, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    out = reference.attention(q, k, v, mask)
    for h in range(3):
        head = masks.from_slices("head", 256, 256, [s.as_tuple() for s in mask.head_slices(h)])
        ref = reference.attention(q[:, :, 2 * h:2 * h + 2], k[:, :, h:h + 1], v[:, :, h:h + 1], head)
        assert torch.allclose(out[:, :, 2 * h:2 * h + 2], ref, atol=1e-12)
    chunked = chunked_reference.attention(q.float(), k.float(), v.float(), mask, rows=96)
    assert torch.allclose(chunked.double(), out, atol=1e-5)


@pytest.mark.parametrize("params, needle", [({"block": 48}, "not a multiple of block 48"),
                                            ({"kept": 0.0}, "kept must be a number in (0, 1]"),
                                            ({"kept": 1.5}, "kept must be a number in (0, 1]"),
                                            ({"heads": 0}, "heads")])
def test_bad_parameters_are_named(params, needle):
    with pytest.raises(masks.MaskError, match=None) as err:
        _mask(**params)
    assert needle in str(err.value)


def test_the_gate_keeps_the_cells_fraction_block_and_heads():
    mask = _mask(seqlen=4096, block=64)
    params = gate_masks.gate_params("block_sparse_heads", mask, 1024)
    assert params == {"kept": 0.3, "block": 64, "heads": 3, "group": 2}
    small = masks.build("block_sparse_heads", 1024, seed=5, **params)
    assert small.heads == 3 and small.group == 2 and small.block == 64


def _config(**over):
    base = longca_config.merge_files(["config/config.yaml"])
    base.update({"kernels": ["sdpa", "flex_block_sparse"], "cp_strategies": [],
                 "masks": [{"name": "sparse", "pattern": "block_sparse_heads",
                            "params": {"kept": 0.25, "block": 64}}],
                 "seqlens": [512], "heads_q": 8, "heads_kv": 2, "gate_seqlen": 256})
    base.update(over)
    return longca_config.validate(base)


def test_config_sets_heads_and_group_from_the_grid():
    settings = longca_config.cell_settings(_config(), "flex_block_sparse", "sparse", 512, "fwd", "float32")
    assert settings["mask_params"] == {"heads": 2, "group": 4, "kept": 0.25, "block": 64}


@pytest.mark.parametrize("over, needle", [
    ({"gate_seqlen": 200}, "config.gate_seqlen: 200 is not a multiple of mask 'sparse''s block 64"),
    ({"masks": [{"name": "sparse", "pattern": "block_sparse_heads", "params": {"heads": 4}}]},
     "config.masks[0] (sparse).params.heads: 4, but the grid has 2"),
    ({"cp_strategies": ["ring"], "cp_sizes": [1], "cp_masks": ["sparse"]}, "config.cp_masks: 'sparse' has a pattern per KV head"),
])
def test_config_rejects_what_cannot_run_naming_the_key(over, needle):
    with pytest.raises(longca_config.ConfigError) as err:
        _config(**over)
    assert needle in str(err.value)


def test_the_sparse_study_config_is_valid_over_the_gpu_grid():
    merged = longca_config.merge_files(["config/config.yaml", "config/gpu.yaml", "config/sparse.yaml"])
    cfg = longca_config.validate(merged)
    sparse = [e for e in longca_config.mask_entries(cfg) if e.pattern == "block_sparse_heads"]
    assert {(e.params["kept"], e.params["block"]) for e in sparse} == {
        (k, b) for k in (0.1, 0.2, 0.5, 0.8, 1.0) for b in (64, 128)}


def _cell(kernel, direction="fwd"):
    return CellSpec(kernel=kernel, mask="sparse", pattern="block_sparse_heads", seqlen=512, direction=direction,
                    dtype="float32", heads_q=4, heads_kv=2, head_dim=16, gate_seqlen=256, warmup=1, reps=2,
                    mask_params={"kept": 0.25, "block": 64, "heads": 2, "group": 2})


@pytest.mark.parametrize("kernel", ["sdpa", "flex", "triton_block_sparse"])
def test_kernels_with_one_mask_for_every_head_are_unsupported(kernel):
    row = run_cell(_cell(kernel))
    assert row["status"] == "unsupported"
    assert "takes one mask for every head" in row["reason"] and "block_sparse_heads" in row["reason"]


def test_flex_block_sparse_passes_the_gate_on_cpu():
    """The real FlexAttention (compiled on the CPU) with the BlockMask of kept tiles, checked by the
    correctness gate against the per-head reference before it is timed."""
    row = run_cell(_cell("flex_block_sparse"))
    assert row["status"] == "ok", row["reason"]
    assert row["flops"] == 4 * (512 // 64) * 2 * 64 * 64 * 4 * 16
    assert row["gate_seqlen"] == 256


def test_a_flex_backward_with_no_tile_configuration_is_unsupported(monkeypatch):
    kernel = kernels.get("flex_block_sparse")
    problem = Problem.from_spec(ProblemSpec(mask="sparse", pattern="block_sparse_heads", seqlen=256, dtype="float32",
                                            heads_q=2, heads_kv=1, head_dim=16, direction="bwd",
                                            mask_params={"kept": 0.5, "block": 64, "heads": 1, "group": 2}))

    def refuse(*_):
        raise RuntimeError("LoweringException: NoValidChoicesError: No choices to select.")

    monkeypatch.setattr(type(kernel), "forward", refuse)
    with pytest.raises(kernels.base.Unsupported, match="no tile configuration for 64-token blocks"):
        kernel._compile_backward(problem, {})

    def fail(*_):
        raise RuntimeError("something else")

    monkeypatch.setattr(type(kernel), "forward", fail)
    with pytest.raises(RuntimeError, match="something else"):
        kernel._compile_backward(problem, {})


def test_a_sparse_kernels_key_covers_its_mask_and_parent_modules_and_no_other_key_moves():
    files = {p.name for p in kernels.source_files("ffa_block_sparse")}
    assert files == {"ffa_block_sparse.py", "magi_ffa.py", "head_blocks.py"}
    assert {p.name for p in kernels.source_files("flex_block_sparse")} == {"flex_block_sparse.py", "flex.py",
                                                                           "head_blocks.py"}
    assert {p.name for p in kernels.source_files("vsa_triton")} == {"vsa_triton.py", "head_blocks.py"}
    assert {p.name for p in kernels.source_files("vsa_cuda")} == {"vsa_cuda.py", "vsa_triton.py", "head_blocks.py"}
    assert {p.name for p in kernels.source_files("flashinfer_block_sparse")} == {"flashinfer_block_sparse.py",
                                                                                 "head_blocks.py"}
    # FlashMask's key covers its mask conversion (attention/flashmask.py) and its Paddle path, which no
    # other key does.
    package = kernels.source_file("flashmask").parents[1]
    assert {p.relative_to(package).as_posix() for p in kernels.source_files("flashmask")} == {
        "kernels/flashmask.py", "attention/flashmask.py", "kernels/_flashmask_paddle.py"}
    for name in kernels.names():
        if name not in ("ffa_block_sparse", "flex_block_sparse", "vsa_triton", "vsa_cuda", "flashinfer_block_sparse",
                        "flashmask"):
            assert kernels.source_files(name) == [kernels.source_file(name)], name
