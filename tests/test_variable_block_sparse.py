"""``variable_block_sparse_heads``: the sparse study's tiles of random sizes.  Sizes are multiples of
the unit averaging the block; each KV head takes the same tiles and table in its own order, so heads
differ and attend exactly as many pairs; slices, the dense mask, the unit table and FFA's ranges
describe the same pairs; the gate keeps tiles that vary; config names a gate length the unit does
not divide; FlexAttention's BlockMask of unit tiles passes the gate on the CPU."""

import numpy as np
import pytest
import torch

from longca import config as longca_config
from longca.attention import masks
from longca.attention.masks import gate as gate_masks
from longca.execution.measure.cell import CellSpec, run_cell
from longca.kernels.ffa_block_sparse import head_ranges

PATTERN = "variable_block_sparse_heads"


def _mask(seqlen=1024, **params):
    return masks.build(PATTERN, seqlen, seed=7, **{"kept": 0.3, "block": 128, "unit": 32, "heads": 3,
                                                   "group": 2, **params})


def test_tiles_are_units_averaging_the_block_in_each_heads_own_order():
    mask = _mask()
    sizes = mask.tile_sizes()
    assert sizes.shape == (3, 1024 // 128) and (sizes % 32 == 0).all() and (sizes >= 32).all()
    assert (sizes.sum(1) == 1024).all() and len(set(sizes[0].tolist())) > 1
    assert all(sorted(sizes[h]) == sorted(sizes[0]) for h in range(3))   # the same tiles ...
    assert not (sizes[0] == sizes[1]).all() or not (sizes[0] == sizes[2]).all()   # ... in other orders
    per_row = round(0.3 * 8)
    assert (mask.kept_blocks.sum(-1) == per_row).all() and mask.params["tiles_per_row"] == per_row
    assert mask.params["smallest_tile"] == sizes.min() and mask.params["largest_tile"] == sizes.max()
    assert (masks.build(PATTERN, 1024, seed=7, kept=0.3, block=128, unit=32, heads=3, group=2).tile_sizes()
            == sizes).all()


def test_every_head_attends_the_area_the_flops_count():
    mask = _mask()
    dense = mask.to_dense()
    assert dense.shape == (6, 1024, 1024)
    per_head = [int(dense[h].sum()) for h in range(6)]
    assert per_head == [mask.area()] * 6
    assert mask.params["kept_actual"] == mask.area() / 1024 ** 2
    assert not torch.equal(dense[0], dense[2])                 # heads differ
    assert torch.equal(dense[0], dense[1])                     # a KV head's group shares its pattern


def test_slices_unit_tables_and_ffa_ranges_describe_the_dense_mask():
    mask = _mask()
    dense = mask.to_dense()
    for h in range(3):
        head = masks.from_slices("head", 1024, 1024, [s.as_tuple() for s in mask.head_slices(h)])
        assert torch.equal(head.to_dense(), dense[2 * h])
    for unit in (32, 16):
        table = torch.from_numpy(mask.unit_table(unit))
        assert torch.equal(table.repeat_interleave(unit, 1).repeat_interleave(unit, 2),
                           dense[::2])
    with pytest.raises(masks.MaskError, match="multiples of 32 tokens, not of 64"):
        mask.unit_table(64)
    q_ranges, k_ranges = head_ranges(mask, batch=2)
    covered = torch.zeros(2 * 3 * 1024, 2 * 3 * 1024, dtype=torch.int32)
    for (q0, q1), (k0, k1) in zip(q_ranges, k_ranges):
        covered[q0:q1, k0:k1] += 1
    expected = torch.block_diag(*[dense[2 * h] for h in range(3)] * 2).to(torch.int32)
    assert torch.equal(covered, expected)                      # each pair once, nothing else


@pytest.mark.parametrize("params, needle", [({"block": 80}, "block 80 (the mean tile) is not a multiple of unit 32"),
                                            ({"block": 256, "unit": 128}, "seqlen 1000 is not a multiple of block 256"),
                                            ({"kept": 0.0}, f"{PATTERN}: kept must be a number in (0, 1]")])
def test_bad_parameters_are_named(params, needle):
    with pytest.raises(masks.MaskError) as err:
        _mask(seqlen=1000 if "unit" in params else 1024, **params)
    assert needle in str(err.value)


def test_the_gate_keeps_the_unit_and_fraction_with_tiles_that_still_vary():
    mask = _mask(seqlen=8192, block=512, unit=128)
    params = gate_masks.gate_params(PATTERN, mask, 1024)
    assert params == {"kept": 0.3, "block": 256, "unit": 128, "heads": 3, "group": 2}
    small = masks.build(PATTERN, 1024, seed=0, **params)
    assert small.tile_sizes().shape[1] == 4 and len(set(small.tile_sizes()[0].tolist())) > 1
    assert small.density() < 1.0


def _config(**over):
    base = longca_config.merge_files(["config/config.yaml"])
    base.update({"kernels": ["flex_block_sparse"], "cp_strategies": [],
                 "masks": [{"name": "var", "pattern": PATTERN, "params": {"kept": 0.25, "block": 128, "unit": 64}}],
                 "seqlens": [512], "heads_q": 8, "heads_kv": 2, "gate_seqlen": 256})
    base.update(over)
    return longca_config.validate(base)


def test_config_fills_the_heads_and_names_a_gate_length_the_unit_does_not_divide():
    settings = longca_config.cell_settings(_config(), "flex_block_sparse", "var", 512, "fwd", "float32")
    assert settings["mask_params"] == {"heads": 2, "group": 4, "kept": 0.25, "block": 128, "unit": 64}
    with pytest.raises(longca_config.ConfigError) as err:
        _config(gate_seqlen=224)
    assert "config.gate_seqlen: 224 is not a multiple of mask 'var''s unit 64" in str(err.value)


def test_flex_block_sparse_passes_the_gate_on_cpu():
    """The real FlexAttention (compiled on the CPU) on a BlockMask of unit tiles, checked by the gate
    against the per-head reference before it is timed."""
    cell = CellSpec(kernel="flex_block_sparse", mask="var", pattern=PATTERN, seqlen=512, dtype="float32",
                    heads_q=4, heads_kv=2, head_dim=16, gate_seqlen=256, warmup=1, reps=2,
                    mask_params={"kept": 0.25, "block": 64, "unit": 32, "heads": 2, "group": 2})
    row = run_cell(cell)
    assert row["status"] == "ok", row["reason"]
    mask = masks.build(PATTERN, 512, seed=0, kept=0.25, block=64, unit=32, heads=2, group=2)
    assert row["area"] == mask.area() and row["flops"] == 4 * mask.area() * 4 * 16
    assert row["gate_seqlen"] == 256 and row["gate_area"] < 256 * 256
