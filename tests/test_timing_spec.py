"""The timing settings, defined once (longca/timing_spec.py): config, flags, specs, keys and columns
all follow it, and a change to how they are spelled re-keys no measurement."""

import argparse
import dataclasses

import pytest

from longca import config, timing_spec
from longca.execution.cache import parts
from longca.execution.measure.cell import CellSpec
from longca.execution.measure.cp_cell import CPSpec
from longca.results.parquet import CP_SCHEMA, KERNEL_SCHEMA
from longca.timing_spec import CountedTiming, TimingSpec

from conftest import REPO


def _first_cell(files):
    cfg = config.validate(config.merge_files([REPO / f for f in files]))
    c = next(iter(config.kernel_cells(cfg)))
    return c, config.cell_settings(cfg, c.kernel, c.mask, c.seqlen, c.direction, c.dtype)


# Recorded when the timing fields were gathered into TimingSpec (same keys as before it): a key that
# moves means every published measurement of that grid would be taken again.
@pytest.mark.parametrize("files, name, keys", [
    (["config/config.yaml"], "sdpa_math/full/float32_fwd_512",
     {"gate": "0154a2a4472430d5167031f3", "time": "8f52ed0416919b805c2e0cdb", "memory": "8c3c6909c3b63c58a67882bb"}),
    (["config/config.yaml", "config/gpu.yaml"], "sdpa/full/bfloat16_fwd_1024",
     {"gate": "83844d037590e442ff170a8e", "time": "10286c5c2cd792be7d8e0153", "memory": "066c56995beda609841bb0ae"}),
])
def test_the_part_keys_of_a_cell_stay_what_they_were(files, name, keys):
    cell, settings = _first_cell(files)
    assert cell.name == name
    fields = dataclasses.asdict(CellSpec.from_dict(settings))
    assert {p: parts.part_key(p, fields, "0123456789abcdef") for p in parts.PARTS} == keys


def test_a_cpu_cell_carries_counts_only_and_a_gpu_cell_its_budgets_and_graph_replay():
    _, cpu = _first_cell(["config/config.yaml"])
    _, gpu = _first_cell(["config/config.yaml", "config/gpu.yaml"])
    assert set(timing_spec.names()) & set(cpu) == {"warmup", "reps"}
    assert set(timing_spec.names()) <= set(gpu) and gpu["cuda_graph"] is True
    assert CellSpec.from_dict(gpu).timing == TimingSpec(warmup=1, reps=5, warmup_ms=25.0, warmup_max_ms=1000.0,
                                                        rep_ms=100.0, cuda_graph=True)


def test_a_cp_cell_is_timed_by_counts_the_longest_warm_up_a_kernel_cell_may_take_and_graph_replay():
    timing = {"warmup": 1, "reps": 5, "warmup_ms": 25.0, "warmup_max_ms": 1000.0, "rep_ms": 100.0, "cuda_graph": True}
    assert timing_spec.cp_settings(timing) == {"warmup": 1, "reps": 5, "warmup_ms": 1000.0, "cuda_graph": True}
    # A CPU cell (no graph replay) keeps the settings, and so the cache key, it had before.
    assert timing_spec.cp_settings({**timing, "cuda_graph": False}) == {"warmup": 1, "reps": 5, "warmup_ms": 1000.0}
    assert set(timing_spec.names(CountedTiming)) <= {f.name for f in dataclasses.fields(CPSpec)}
    assert not set(timing_spec.names()) - set(timing_spec.names(CountedTiming)) & {f.name for f in dataclasses.fields(CPSpec)}


def test_the_time_part_is_keyed_on_every_timing_field_and_no_other_part_is():
    assert set(parts.PARTS["time"].settings) == set(timing_spec.names())
    assert not set(timing_spec.names()) & (set(parts.PARTS["gate"].settings) | set(parts.PARTS["memory"].settings)
                                           | set(parts.PROBLEM_SETTINGS))


def test_flags_and_columns_come_from_the_fields():
    parser = argparse.ArgumentParser()
    timing_spec.add_flags(parser)
    args = parser.parse_args(["--rep-ms", "50", "--cuda-graph", "--warmup", "3"])
    assert timing_spec.of(vars(args)) == TimingSpec(warmup=3, rep_ms=50.0, cuda_graph=True)
    kernel_columns = {f.name: f.type for f in KERNEL_SCHEMA}
    assert all(name in kernel_columns for name in timing_spec.names())
    assert str(kernel_columns["cuda_graph"]) == "bool" and str(kernel_columns["rep_ms"]) == "double"
    cp_columns = {f.name for f in CP_SCHEMA}
    assert set(timing_spec.names(CountedTiming)) <= cp_columns
    assert not (set(timing_spec.names()) - set(timing_spec.names(CountedTiming))) & cp_columns
