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


@pytest.mark.parametrize("bad, suggested", [
    ({**BASE, "seqlen": [64]}, "('seqlen' was unexpected) (did you mean 'seqlens'"),
    ({**BASE, "timing": {"warmpu": 1}}, "config.timing: Additional properties are not allowed ('warmpu' was "
                                        "unexpected) (did you mean 'warmup'?)"),
    ({**BASE, "kernels": ["sdpaa"]}, "config.kernels[0]: unknown kernel 'sdpaa' (did you mean 'sdpa'"),
    ({**BASE, "masks": ["casual"]}, "config.masks[0]: unknown mask pattern 'casual' (did you mean 'causal'?)"),
    ({**BASE, "cp_strategies": ["rnig"], "cp_sizes": [2]}, "unknown CP strategy 'rnig' (did you mean 'ring'?)"),
])
def test_a_misspelt_key_or_name_gets_the_nearest_ones(bad, suggested):
    with pytest.raises(ConfigError) as err:
        validate(bad)
    assert suggested in str(err.value)
    with pytest.raises(ConfigError) as far:  # nothing near: no suggestion
        validate({**BASE, "colour": "blue"})
    assert "did you mean" not in str(far.value)


def test_cuda_cells_time_graph_replays_by_default_and_the_setting_is_part_of_the_cache_key():
    gpu = validate(merge_files([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"]))
    c = next(kernel_cells(gpu))
    cell = (c.kernel, c.mask, c.seqlen, c.direction, c.dtype)
    assert cell_settings(gpu, *cell)["cuda_graph"] is True
    eager = validate(merge_files([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"]) | {"timing": {"cuda_graph": False}})
    assert "cuda_graph" not in cell_settings(eager, *cell)
    cpu = validate(merge_files([REPO / "config" / "config.yaml"]))
    c = next(kernel_cells(cpu))
    assert "cuda_graph" not in cell_settings(cpu, c.kernel, c.mask, c.seqlen, c.direction, c.dtype)


def test_a_cuda_graph_setting_that_is_not_a_boolean_is_named():
    bad = merge_files([REPO / "config" / "config.yaml"]) | {"timing": {"cuda_graph": "often"}}
    with pytest.raises(ConfigError, match=r"config\.timing\.cuda_graph"):
        validate(bad)


# Upper bounds: a typo past any real grid stops before any work, naming the key (never a pyarrow
# error at aggregation, after the measurements).
@pytest.mark.parametrize("bad, named", [
    ({"timing": {"reps": 1_000_000_000_000}}, "config.timing.reps: 1000000000000 is greater than the maximum of"),
    ({"timing": {"warmup": 10**9}}, "config.timing.warmup: 1000000000 is greater than the maximum"),
    ({"timing": {"rep_ms": 1e9}}, "config.timing.rep_ms: 1000000000.0 is greater than the maximum"),
    ({"timing": {"warmup_max_ms": float("inf")}}, "config.timing.warmup_max_ms: inf is"),
    ({"timing": {"warmup_ms": float("nan")}}, "config.timing.warmup_ms: nan is not a finite number"),
    ({"seqlens": [64, 2**40]}, "config.seqlens[1]: 1099511627776 is greater than the maximum"),
    ({"heads_q": 2**31}, "config.heads_q: 2147483648 is greater than the maximum"),
    ({"head_dim": 10**6}, "config.head_dim"), ({"batch": 10**9}, "config.batch"),
    ({"gate_seqlen": 2**40}, "config.gate_seqlen"), ({"seed": 2**63}, "config.seed"),
    ({"threads": 10**6}, "config.threads"), ({"limits": {"cell_timeout_s": 1e12}}, "config.limits.cell_timeout_s"),
    ({"cp_sizes": [2**40]}, "config.cp_sizes[0]"), ({"cp_tokens_per_rank": [2**40]}, "config.cp_tokens_per_rank[0]"),
])
def test_numbers_past_their_bound_are_named(bad, named):
    with pytest.raises(ConfigError) as err:
        validate({**BASE, **bad})
    assert named in str(err.value)


def test_every_number_in_the_schema_has_an_upper_bound():
    from longca.config import load_schema

    def unbounded(schema, path="config"):
        types = schema.get("type", [])
        types = [types] if isinstance(types, str) else types
        if {"integer", "number"} & set(types) and "maximum" not in schema:
            yield path
        for key, sub in schema.get("properties", {}).items():
            yield from unbounded(sub, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                yield from unbounded(schema[key], f"{path}[]")
        for i, sub in enumerate(schema.get("prefixItems", []) + schema.get("oneOf", [])):
            yield from unbounded(sub, f"{path}<{i}>")

    assert list(unbounded(load_schema())) == []


# YAML 1.1 (PyYAML, Snakemake's loader) reads `1e300` as a string: the config reads it as the number
# it is, so it is checked as one; and where no string belongs a string is never kept silently.
def test_exponent_floats_are_numbers_and_checked_as_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("timing: {rep_ms: 1e300}\n")
    with pytest.raises(ConfigError, match=r"config\.timing\.rep_ms: 1e\+300 is greater than the maximum"):
        validate(merge_files([REPO / "config" / "config.yaml", path]))
    path.write_text("timing: {rep_ms: 5e1, warmup_ms: 2.5E+1}\n"
                    "masks: [{name: bs, pattern: block_sparse, params: {block: 16, density: 5e-1}}]\n")
    cfg = validate({**merge_files([REPO / "config" / "config.yaml", path]), "seqlens": [64], "cp_strategies": []})
    assert cfg["timing"]["rep_ms"] == 50.0 and cfg["timing"]["warmup_ms"] == 25.0
    assert cfg["masks"][0]["params"]["density"] == 0.5
    with pytest.raises(ConfigError, match=r"config\.timing\.rep_ms: 'fast' is not of type 'number'"):
        validate({**BASE, "timing": {"rep_ms": "fast"}})


def test_a_yaml_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("kernels: [sdpa]\nseqlens: [64, 128\nmasks: [full]\n")
    with pytest.raises(ConfigError) as err:
        merge_files([path])
    assert f"{path}, line 3, column 6: not valid YAML" in str(err.value), str(err.value)


def test_a_shipped_histogram_is_named_and_inlined_and_an_unknown_name_is_named():
    """`histogram: magi_cp_docs` (or magi_long_docs) in a mask's params becomes the packaged file's
    bins in the cell's settings; a name that is neither shipped nor a file is an error naming it."""
    from longca import config as config_mod
    from longca.attention import masks, varlen

    base = {**BASE, "masks": [{"name": "docs", "pattern": "varlen_causal", "params": {"histogram": "magi_cp_docs"}},
                      {"name": "long", "pattern": "varlen_causal", "params": {"histogram": "magi_long_docs"}}],
            "cp_strategies": []}
    cfg = validate(base)
    short = cell_settings(cfg, "sdpa", "docs", 8192, "fwd", "float32")["mask_params"]["histogram"]
    assert short == varlen.load_histogram(config_mod.SHIPPED_HISTOGRAMS["magi_cp_docs"]).as_dict()
    assert (short["lo"][0], short["hi"][-1], len(short["lo"])) == (1, 196609, 14)
    long = cell_settings(cfg, "sdpa", "long", 8192, "fwd", "float32")["mask_params"]["histogram"]
    assert long["hi"][-1] == 4 * 2**20
    # Short documents by default: an 8K sequence packs a dozen; the long histogram gives one.
    assert len(masks.build("varlen_causal", 8192, seed=1, histogram=short).slices) > 5
    assert len(masks.build("varlen_causal", 8192, seed=1, histogram=long).slices) == 1
    with pytest.raises(ConfigError, match="nosuch_docs"):
        validate({**BASE, "masks": [{"name": "d", "pattern": "varlen_causal", "params": {"histogram": "nosuch_docs"}}],
                  "cp_strategies": []})
