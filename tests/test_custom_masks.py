"""Custom masks: a slice list from config that runs along the seqlen axis like a built-in pattern."""

import json
import re

import pytest
import torch
from snakemake_run import CELL_OUTPUT, REPO, snakemake

from longca.attention import masks
from longca.attention.problem import Problem
from longca.config import ConfigError, cell_settings, validate
from longca.execution.measure.cell import CellSpec, run_cell
from longca.execution.measure.gate import gate_problem

# A "shared question" shape written by hand: question (first quarter) causal, three answers each
# causal and attending the whole question.
SHAPE = [[0, 4, 0, 4, "causal"], [4, 8, 0, 4, "full"], [4, 8, 4, 8, "causal"],
         [8, 16, 0, 4, "full"], [8, 16, 8, 16, "causal"]]


def _oracle(seqlen: int, base: int) -> torch.Tensor:
    f = seqlen // base
    out = torch.zeros(seqlen, seqlen, dtype=torch.bool)
    for qs, qe, ks, ke, kind in SHAPE:
        lq, lk = (qe - qs) * f, (ke - ks) * f
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        rule = torch.ones(lq, lk, dtype=torch.bool) if kind == "full" else j <= i + (lk - lq)
        out[qs * f:qe * f, ks * f:ke * f] |= rule
    return out


@pytest.mark.parametrize("seqlen", [16, 32, 48, 160])
def test_custom_mask_scales_to_each_seqlen(seqlen):
    m = masks.build("custom", seqlen, slices=SHAPE)
    assert m.params["base_seqlen"] == 16 and m.params["scale"] == seqlen // 16
    dense = m.to_dense()
    assert torch.equal(dense, _oracle(seqlen, 16))
    assert m.area() == int(dense.sum())


def test_custom_mask_needs_a_multiple_of_its_base():
    with pytest.raises(masks.MaskError, match="not a multiple of base_seqlen 16"):
        masks.build("custom", 40, slices=SHAPE)


def test_custom_mask_rejects_overlaps_and_unknown_params():
    with pytest.raises(masks.MaskError, match=r"slices\[0\] and slices\[1\] overlap"):
        masks.build("custom", 8, slices=[[0, 8, 0, 8, "full"], [2, 4, 2, 4, "causal"]])
    with pytest.raises(masks.MaskError, match="unknown parameter"):
        masks.build("custom", 8, slices=SHAPE, window=3)


def test_gate_problem_keeps_a_multiple_of_the_base():
    p = Problem("custom", 160, 1, 2, 1, 8, torch.float32, "cpu", "fwd", 0, {"slices": SHAPE})
    r = gate_problem(p, 40)
    assert r.seqlen == 32 and r.mask.params["scale"] == 2
    assert gate_problem(p, 8).seqlen == 16  # never below one base length


def test_custom_mask_in_config_flows_to_a_measured_row():
    cfg = validate({"kernels": ["sdpa_math"], "seqlens": [32, 64],
                    "masks": ["causal", {"name": "my_shape", "slices": SHAPE}]})
    settings = cell_settings(cfg, "sdpa_math", "my_shape", 64, "bwd", "float32")
    assert settings["pattern"] == "custom" and settings["mask_params"]["slices"] == SHAPE
    row = run_cell(CellSpec.from_dict({**settings, "warmup": 0, "reps": 1, "gate_seqlen": 32}))
    assert row["status"] == "ok", row["reason"]
    assert row["area"] == int(_oracle(64, 16).sum())


@pytest.mark.parametrize("mask, named", [
    # Schema errors name the key and value of the form the entry has (slices: a custom mask), never
    # only "is not valid under any of the given schemas".
    ({"name": "bad", "slices": [[0, 4, 0, 4, "diagonal"]]},
     "config.masks[1].slices[0][4]: 'diagonal' is not one of ['full', 'causal', 'inv_causal', 'bi_causal']"),
    ({"name": "bad", "slices": [[0, 4, -1, 4, "full"]]}, "config.masks[1].slices[0][2]: -1 is less than the minimum of 0"),
    ({"name": "bad", "slices": [[0, 4, 0, 4]]}, "config.masks[1].slices[0]: [0, 4, 0, 4] is too short"),
    ({"name": "bad", "slices": "0 4 0 4 full"}, "config.masks[1].slices: '0 4 0 4 full' is not of type 'array'"),
    ({"name": "bad", "slices": SHAPE, "base": 16}, "config.masks[1]: Additional properties are not allowed ('base' was"),
    ({"name": "two docs", "slices": SHAPE}, "config.masks[1].name: 'two docs' does not match"),
    ({"name": "w", "pattern": "sliding_window", "param": {}}, "config.masks[1]: Additional properties are not allowed ('param'"),
    ({"pattern": "causal"}, "config.masks[1]: 'name' is a required property"),
    (3, "config.masks[1]: 3 is not of type 'string' or 'object'"),
    # What only building the mask finds.
    ({"name": "bad", "slices": [[0, 8, 0, 8, "full"], [0, 4, 0, 4, "full"]]}, "overlap"),
    ({"name": "bad", "slices": SHAPE, "base_seqlen": 20}, "not a multiple of base_seqlen 20"),
])
def test_bad_custom_mask_is_named(mask, named):
    with pytest.raises(ConfigError) as err:
        validate({"kernels": ["sdpa_math"], "seqlens": [48], "masks": ["full", mask]})
    assert named in str(err.value) and "config.masks[1]" in str(err.value), str(err.value)
    assert "is not valid under any of the given schemas" not in str(err.value)


def test_histogram_file_is_inlined_into_the_cells_settings(tmp_path):
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps({"edges": [1, 8, 32], "weights": [1.0, 3.0]}))
    cfg = validate({"kernels": ["sdpa_math"], "seqlens": [128],
                    "masks": [{"name": "docs", "pattern": "varlen_causal", "params": {"histogram": str(path)}}]})
    hist = cell_settings(cfg, "sdpa_math", "docs", 128, "fwd", "float32")["mask_params"]["histogram"]
    assert hist["lo"] == [1, 8] and hist["hi"] == [8, 32] and hist["weights"] == [1.0, 3.0]
    m = masks.build("varlen_causal", 128, histogram=hist)
    assert max(m.documents[:-1]) < 32


def test_histogram_without_weight_is_named(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"edges": [1, 8], "weights": [0.0]}))
    with pytest.raises(ConfigError, match=r"config.masks\[0\].params.histogram"):
        validate({"kernels": ["sdpa_math"], "seqlens": [128],
                  "masks": [{"name": "docs", "pattern": "varlen_causal", "params": {"histogram": str(path)}}]})


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("density, seed", [(0.1, 0), (0.25, 1), (0.5, 2), (1.0, 3)])
def test_block_sparse_equals_its_tiles(causal, density, seed):
    block, n = 8, 12
    m = masks.build("block_sparse", block * n, seed=seed, block=block, density=density, causal=causal)
    dense = m.to_dense()
    tiles = dense.reshape(n, block, n, block).any(dim=(1, 3))
    for qb in range(n):
        visible = qb + 1 if causal else n
        assert tiles[qb, qb], "the diagonal tile keeps every row non-empty"
        assert int(tiles[qb].sum()) == max(1, round(density * visible))
        assert not tiles[qb, visible:].any()
    # Attended tiles are whole tiles (the causal diagonal: its lower triangle).
    expect = tiles.repeat_interleave(block, 0).repeat_interleave(block, 1)
    if causal:
        expect &= torch.ones(block * n, block * n, dtype=torch.bool).tril()
    assert torch.equal(dense, expect)
    assert m.area() == int(dense.sum())
    assert m.params["block_density"] == pytest.approx(int(tiles.sum()) / n**2)
    masks.check_disjoint(m.slices)


def test_block_sparse_is_seeded_and_checked():
    a = masks.build("block_sparse", 1024, seed=5, density=0.3)
    assert a == masks.build("block_sparse", 1024, seed=5, density=0.3)
    assert a != masks.build("block_sparse", 1024, seed=6, density=0.3)
    with pytest.raises(masks.MaskError, match="not a multiple of block 128"):
        masks.build("block_sparse", 1000)
    with pytest.raises(masks.MaskError, match="density"):
        masks.build("block_sparse", 1024, density=0)


def _readme_mask_example() -> str:
    """The YAML block under the README's "Add a mask", as a user copies it."""
    readme = (REPO / "README.md").read_text()
    return re.search(r"\*\*Add a mask\.\*\*.*?```yaml\n(.*?)```", readme, re.S).group(1)


# The README's two ways of narrowing `masks` run as written: the default grid's `cp_masks: [causal]`
# is dropped with a note (cp_masks selects among masks), not an error.
@pytest.mark.slow
@pytest.mark.parametrize("config, args, masks", [
    ("readme", (), {"two_docs_shared_prefix"}),
    ("{}", ("--config", "masks=[full]"), {"full"}),
], ids=["readme-custom-mask", "config-masks-full"])
def test_narrowing_masks_as_the_readme_does_runs(tmp_path, config, args, masks):
    (tmp_path / "config.yaml").write_text(_readme_mask_example() if config == "readme" else config)
    proc = snakemake(tmp_path, "-n", "all", *args)  # targets before --config (it takes every word after it)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    cells = CELL_OUTPUT.findall(out)
    assert {c.split("/")[4] for c in cells} == masks
    assert len(cells) == 2 * 3 * 2 and not any(c.startswith("results/cells/cp/") for c in cells)
    assert out.count("longca: cp_masks causal not in masks, so no CP cells for it (no CP cells)") == 1
