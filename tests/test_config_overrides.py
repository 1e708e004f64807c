"""`--config` overrides as a user types them: Snakemake hands the scalars inside a list or a mapping
over as strings; the config must read them as the same text in a config file would be read."""

import json
import re
import shlex

import pytest
from snakemake_run import snakemake, write_config

from longca.config import validate

BASE = {"kernels": ["sdpa"], "masks": ["full"], "seqlens": [64], "directions": ["fwd"], "cp_strategies": []}
SETTINGS = re.compile(r"--settings '(\{.*?\})'")


def planned_settings(workdir, overrides: str) -> tuple[list[dict], str]:
    """The settings of every cell a dry run plans with ``--config <overrides>`` (shell words)."""
    write_config(workdir, BASE)
    # Targets before --config: it takes every word after it.
    proc = snakemake(workdir, "-n", "-p", "all", "--config", *shlex.split(overrides))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return [json.loads(s) for s in SETTINGS.findall(out)], out


def _seqlens(settings, out):
    assert {s["seqlen"] for s in settings} == {4096, 8192}


def _timing(settings, out):
    assert settings and all(s["warmup"] == 2 and s["reps"] == 3 for s in settings)


def _mask_params(settings, out):
    assert settings and all(s["mask"] == "sw" and s["mask_params"] == {"window": 32} for s in settings)


def _cp_axes(settings, out):
    cp = [s for s in settings if "strategy" in s]
    assert [(s["strategy"], s["mask"], s["seqlen"], s["cp_size"]) for s in cp] == [("ring", "full", 512, 2)]


def _limits(settings, out):
    assert "--timeout 2.5 --memory-mb 512" in out


# The README's forms (`--config seqlens='[4096,8192]'`) and the other shapes a key can have.
@pytest.mark.slow
@pytest.mark.parametrize("overrides, check", [
    ("seqlens='[4096,8192]'", _seqlens),
    ("'timing={warmup: 2, reps: 3}'", _timing),
    ("'masks=[{name: sw, pattern: sliding_window_causal, params: {window: 32}}]'", _mask_params),
    ("cp_strategies='[ring]' cp_sizes='[2]' cp_tokens_per_rank='[256]' cp_masks=null", _cp_axes),
    ("'limits={cell_timeout_s: 2.5, cell_memory_mb: 512}'", _limits),
], ids=["numeric-list", "mapping", "mask-params", "cp-axes-and-null", "limits"])
def test_config_overrides_reach_the_cells(tmp_path, overrides, check):
    check(*planned_settings(tmp_path, overrides))


def test_strings_stay_strings_where_the_schema_declares_strings():
    # What Snakemake passes for `--config 'masks=[{name: "128", params: ...}]' cp_masks=null`.
    cfg = validate({**BASE, "kernels": ["sdpa"], "masks": [{"name": "128", "pattern": "sliding_window_causal",
                                                             "params": {"window": "32"}}],
                    "cp_masks": "null", "limits": {"cell_memory_mb": "null", "cell_timeout_s": "2.5"}})
    assert cfg["masks"] == [{"name": "128", "pattern": "sliding_window_causal", "params": {"window": 32}}]
    assert cfg["cp_masks"] is None and cfg["limits"] == {"cell_memory_mb": None, "cell_timeout_s": 2.5}
    # A string that is no number where the schema wants one is still named.
    with pytest.raises(ValueError, match=r"config.seqlens\[0\]: 'many' is not of type 'integer'"):
        validate({**BASE, "seqlens": ["many"]})


def test_a_whole_number_written_as_a_float_is_that_integer_and_a_fraction_names_its_key():
    """`seqlens=[1e3]` (a float in YAML, a string through Snakemake's loader) is 1000 tokens; it used
    to fail as four mask errors at "seqlen 1000.0" instead of naming config.seqlens[0]."""
    base = {"kernels": ["sdpa_math"], "masks": ["causal", "full"]}
    for written in (1e3, "1e3", 1000.0):
        assert validate({**base, "seqlens": [written]})["seqlens"] == [1000]
    with pytest.raises(Exception) as err:
        validate({**base, "seqlens": [1000.5]})
    assert "config.seqlens[0]: 1000.5 is not of type 'integer'" in str(err.value)
    assert "config.masks" not in str(err.value)
