"""Each status path of a cell, exercised with real inputs (no patched statuses)."""

import pytest

from longca import kernels
from longca.attention import masks
from longca.attention.flops import attention_flops
from longca.execution.measure.cell import CellSpec, run_cell

SMALL = dict(seqlen=96, heads_q=4, heads_kv=2, head_dim=16, warmup=1, reps=3, gate_seqlen=64)


@pytest.mark.parametrize("kernel", ["sdpa_math", "sdpa", "sdpa_flash"])
@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_cpu_kernels_pass_gate_and_time(kernel, mask, direction):
    row = run_cell(CellSpec(kernel=kernel, mask=mask, direction=direction, **SMALL))
    assert row["status"] == "ok", row["reason"]
    assert row["gate_error"] < row["gate_tolerance"]
    assert row["tflops"] > 0 and row["median_ms"] > 0
    assert row["tflops_p20"] <= row["tflops"] <= row["tflops_p80"]
    m = masks.build(mask, SMALL["seqlen"])
    assert row["flops"] == attention_flops(m, 4, 16, direction)
    assert row["area"] == m.area()
    assert row["device_name"] and row["torch_version"]


def test_gpu_only_kernel_is_unsupported_on_cpu_with_reason():
    row = run_cell(CellSpec(kernel="sdpa_cudnn", mask="causal", **SMALL))
    assert row["status"] == "unsupported"
    assert "cuda" in row["reason"]
    assert "median_ms" not in row  # never timed
    assert "tflops" not in row


def test_kernel_returning_wrong_values_is_wrong_and_never_timed():
    row = run_cell(CellSpec(kernel="test_wrong", mask="causal", **SMALL))
    assert row["status"] == "wrong"
    assert row["gate_error"] > row["gate_tolerance"]
    assert "relative L2 error" in row["reason"]
    assert "median_ms" not in row


def test_real_allocation_failure_is_oom_and_process_goes_on():
    row = run_cell(CellSpec(kernel="test_oom", mask="full", **SMALL))
    assert row["status"] == "oom", row["reason"]
    # The same process measures its next cell normally.
    after = run_cell(CellSpec(kernel="sdpa_math", mask="full", **SMALL))
    assert after["status"] == "ok"


def test_bad_setting_becomes_error_row():
    row = run_cell(CellSpec(kernel="sdpa_math", mask="no_such_mask", **SMALL))
    assert row["status"] == "error"
    assert "no_such_mask" in row["reason"]


def test_registry_lists_kernels_and_names_unknown():
    assert {"sdpa_math", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"} <= set(kernels.names())
    with pytest.raises(KeyError, match="nope"):
        kernels.get("nope")


def test_cuda_graph_mode_times_eagerly_on_cpu_and_records_nothing_of_graphs():
    """CUDA graphs exist only on CUDA: on the CPU the same setting changes nothing in the row."""
    row = run_cell(CellSpec(kernel="sdpa", mask="causal", cuda_graph=True, **SMALL))
    assert row["status"] == "ok", row["reason"]
    assert row["cuda_graph"] is True
    assert row["timed_via"] is None and row["host_ms"] is None


def test_a_row_records_the_wall_of_each_part_it_measured_and_none_for_parts_it_reused(tmp_path):
    from longca.execution.cache.store import Store

    store = Store(tmp_path / "store")
    spec = CellSpec(kernel="sdpa_math", mask="causal", direction="bwd", **SMALL)
    first = run_cell(spec, store)
    walls = {part: first[f"{part}_wall_s"] for part in ("gate", "time", "memory")}
    assert first["status"] == "ok" and first["parts_reused"] is None
    assert all(w is not None and w > 0 for w in walls.values()), walls
    assert sum(walls.values()) <= first["wall_s"]
    again = run_cell(spec, store)
    assert again["parts_reused"] == "gate,time,memory"
    assert [again[f"{part}_wall_s"] for part in ("gate", "time", "memory")] == [None, None, None]
    unsupported = run_cell(CellSpec(kernel="sdpa_cudnn", mask="causal", **SMALL), store)
    assert [unsupported[f"{part}_wall_s"] for part in ("gate", "time", "memory")] == [None, None, None]


def test_each_part_carries_when_where_and_with_what_it_was_measured_and_a_reused_part_keeps_its_own(
        tmp_path, monkeypatch):
    from longca.execution.measure import env
    from longca.execution.cache.store import Store

    store = Store(tmp_path / "store")
    spec = CellSpec(kernel="sdpa_math", mask="causal", direction="fwd", **SMALL)
    monkeypatch.setattr(env, "now_here", lambda: {"at": "2026-11-01T00:00:00+00:00", "on": "first-host", "load_1m": 0.5})
    monkeypatch.setattr(env, "kernel_library", lambda kernel: "torch 1.0 (then)")
    first = run_cell(spec, store)
    for prefix in ("gate", "timed", "memory"):
        assert (first[f"{prefix}_at"], first[f"{prefix}_on"], first[f"{prefix}_library"]) == \
            ("2026-11-01T00:00:00+00:00", "first-host", "torch 1.0 (then)"), prefix
    assert first["timed_load_1m"] == 0.5
    # Later, elsewhere, with other libraries: the row is new, its parts are not.
    monkeypatch.setattr(env, "now_here", lambda: {"at": "2026-11-28T00:00:00+00:00", "on": "second-host", "load_1m": 9.0})
    monkeypatch.setattr(env, "kernel_library", lambda kernel: "torch 2.0 (now)")
    again = run_cell(spec, store)
    assert again["parts_reused"] == "gate,time,memory" and again["kernel_library"] == "torch 2.0 (now)"
    assert (again["gate_on"], again["timed_on"], again["memory_on"]) == ("first-host",) * 3
    assert (again["timed_library"], again["timed_load_1m"]) == ("torch 1.0 (then)", 0.5)
    # A part measured now carries now: the gate again, at another gate length (its own key).
    regated = run_cell(CellSpec(kernel="sdpa_math", mask="causal", direction="fwd", **{**SMALL, "gate_seqlen": 32}),
                       store)
    assert (regated["gate_on"], regated["gate_library"]) == ("second-host", "torch 2.0 (now)")


def test_a_library_build_refusing_a_problem_at_call_time_is_unsupported_not_error(monkeypatch):
    # FA3 built with only head dim 128 says so when called ("This flash attention build does not
    # support ..."): that is the build's limit, not a failure of the run.
    row = run_cell(CellSpec(kernel="test_built_without", mask="causal", **SMALL))
    assert row["status"] == "unsupported", row["reason"]
    assert "this build of its library refused" in row["reason"] and "head dimension 64" in row["reason"]
    # The same error from a kernel that does not declare the message stays an error.
    monkeypatch.setattr(type(kernels.get("test_built_without")), "refusal_messages", ())
    other = run_cell(CellSpec(kernel="test_built_without", mask="causal", **SMALL))
    assert other["status"] == "error" and "head dimension 64" in other["reason"]
