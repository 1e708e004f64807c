import pytest

from pathlib import Path

from longca.config import ConfigError, cell_settings, kernel_cells, merge_files, named_cells, validate

REPO = Path(__file__).resolve().parent.parent

BASE = {"kernels": ["sdpa_math"], "masks": ["full", "causal"], "seqlens": [64, 128]}


def test_defaults_are_filled_and_grid_expands():
    cfg = validate(BASE)
    assert cfg["directions"] == ["fwd", "bwd"] and cfg["timing"]["reps"] >= 1
    cells = list(kernel_cells(cfg))
    assert len(cells) == 1 * 2 * 2 * 2 * 1
    assert len({c.path for c in cells}) == len(cells)


def test_cells_are_found_by_the_name_tables_give_them_and_unknown_names_are_named():
    cfg = validate(BASE)
    cells = named_cells(cfg, ["sdpa_math/causal/float32_bwd_128", "sdpa_math/full/float32_fwd_64"])
    assert [(c.mask, c.direction, c.seqlen) for c in cells] == [("causal", "bwd", 128), ("full", "fwd", 64)]
    assert all(c.path == f"results/cells/kernels/{c.name}.json" for c in cells)
    with pytest.raises(ConfigError, match="not cells of this grid: sdpa_math/full/float32_fwd_96, x/y/z"):
        named_cells(cfg, ["sdpa_math/full/float32_fwd_64", "sdpa_math/full/float32_fwd_96", "x/y/z"])


def test_cell_settings_hold_only_that_cells_values():
    cfg = validate({**BASE, "masks": [{"name": "c", "pattern": "causal"}]})
    s = cell_settings(cfg, "sdpa_math", "c", 64, "fwd", "float32")
    assert s["pattern"] == "causal" and s["seqlen"] == 64 and s["kernel"] == "sdpa_math"


@pytest.mark.parametrize("bad, named", [
    ({"kernels": ["sdpa_math"], "masks": ["full"]}, "seqlens"),
    ({**BASE, "seqlens": [0]}, "config.seqlens[0]"),
    ({**BASE, "dtypes": ["int8"]}, "config.dtypes[0]"),
    ({**BASE, "kernels": ["flash9"]}, "config.kernels[0]"),
    ({**BASE, "masks": ["full", "nonsense"]}, "config.masks[1]"),
    ({**BASE, "heads_q": 6, "heads_kv": 4}, "config.heads_q"),
    ({**BASE, "timing": {"reps": 0}}, "config.timing.reps"),
    ({**BASE, "colour": "blue"}, "colour"),
])
def test_bad_config_names_the_key(bad, named):
    with pytest.raises(ConfigError) as err:
        validate(bad)
    assert named in str(err.value)


def test_cuda_cells_time_graph_replays_by_default_and_the_setting_is_part_of_the_cache_key():
    gpu = validate(merge_files([REPO / "config" / "gpu.yaml"]))
    c = next(kernel_cells(gpu))
    cell = (c.kernel, c.mask, c.seqlen, c.direction, c.dtype)
    assert cell_settings(gpu, *cell)["cuda_graph"] is True
    eager = validate(merge_files([REPO / "config" / "gpu.yaml"]) | {"timing": {"cuda_graph": False}})
    assert "cuda_graph" not in cell_settings(eager, *cell)
    cpu = validate(merge_files([]))
    c = next(kernel_cells(cpu))
    assert "cuda_graph" not in cell_settings(cpu, c.kernel, c.mask, c.seqlen, c.direction, c.dtype)


def test_a_cuda_graph_setting_that_is_not_a_boolean_is_named():
    bad = merge_files([]) | {"timing": {"cuda_graph": "often"}}
    with pytest.raises(ConfigError, match=r"config\.timing\.cuda_graph"):
        validate(bad)
