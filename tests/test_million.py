"""A million tokens on one GPU (issue 74), what a CPU can check of it: nothing between the config and
a measured row is quadratic in the length for the linear kernels (the mask, its gate, FlexAttention's
tile table), a cell that cannot fit is an ``oom`` row before anything is allocated, a dense mask is
never built past 128K, and a call of seconds is timed by the long-call rule within the cell's limit."""

import contextlib
import resource
import time

import pytest
import torch

from longca import config as longca_config
from longca import kernels
from longca.attention import mask_convert
from longca.attention.masks import build
from longca.attention.problem import Problem
from longca.execution.measure import fits, gate, graphed, timed, timing

MILLION = 1 << 20
LONG_MASKS = ("full", "causal", "varlen_causal", "sliding_window_causal")


def _problem(mask: str, n: int, direction: str = "bwd", device: str = "cuda") -> Problem:
    return Problem(mask, n, 1, 64, 8, 128, torch.bfloat16, torch.device(device), direction, seed=1)


@pytest.mark.parametrize("mask", LONG_MASKS)
def test_a_million_token_mask_its_gate_and_its_tile_table_take_seconds(mask):
    """Built, gated (at 1024 tokens) and summed per 128 x 128 tile at 1M: each pattern within a few
    seconds on this shared 2-core machine and a bounded memory rise (the tile table itself, 64 Mi
    int32, and bands of 1 Mi), where evaluating every (q, k) pair is 2^40 comparisons."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    problem = _problem(mask, MILLION, device="cpu")
    checked = gate.gate_problem(problem, 1024)
    sums = mask_convert.tile_sums(problem.mask, 128)
    elapsed = time.perf_counter() - started
    rise_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert checked.seqlen == 1024 and checked.mask.area() > 0
    assert int(sums.sum(dtype=torch.int64)) == problem.mask.area()  # every attended pair, in its tile
    assert elapsed < 20, elapsed
    assert rise_mib < 1024, rise_mib


@pytest.mark.parametrize("mask", LONG_MASKS)
def test_the_tile_table_marks_the_tiles_the_slices_touch(mask):
    m = build(mask, 1 << 16, seed=1)
    blocks, _ = mask_convert.block_sparsity(m, 128, 128)
    assert torch.equal(mask_convert.tile_sums(m, 128) > 0, blocks)


def test_a_cell_that_cannot_fit_is_refused_with_its_estimate(monkeypatch):
    """1M backward on 64 : 8 heads, d 128, bf16: q, k, v, output, their gradients (the upstream one
    among them) and the LSE are 72.2 GiB before any workspace; on a GPU with 70 GiB free it is an
    oom row saying so."""
    monkeypatch.setattr(fits, "available_bytes", lambda device: 70 * 2**30)
    problem = _problem("causal", MILLION)
    kernel = kernels.get("flash_attn3")
    need = fits.need_bytes(kernel, problem)
    assert sum(need.values()) == (1 << 20) * 128 * 2 * (2 * (64 + 8) * 2) + 64 * (1 << 20) * 4
    reason = fits.refusal(kernel, problem)
    assert reason and "does not fit" in reason and "72.2 GiB" in reason and "70.0 GiB" in reason
    monkeypatch.setattr(fits, "available_bytes", lambda device: 139 * 2**30)
    assert fits.refusal(kernel, problem) is None
    assert fits.refusal(kernel, _problem("causal", MILLION, device="cpu")) is None  # the host: its own limits


def test_a_dense_mask_is_counted_and_never_built_past_128k():
    cudnn = kernels.get("sdpa_cudnn")
    assert cudnn.prepared_bytes(_problem("causal", MILLION)) == 0  # is_causal: no mask tensor
    assert cudnn.prepared_bytes(_problem("varlen_causal", 1 << 17)) == (1 << 17) ** 2
    assert cudnn.supports_mask(_problem("varlen_causal", 1 << 17)) is None
    reason = cudnn.supports_mask(_problem("sliding_window_causal", 1 << 18))
    assert reason and "64 GiB" in reason and "131072" in reason


def _fake_cell_call(facts):
    @contextlib.contextmanager
    def cell_call(kernel, problem, warmup, cuda_graph, memory):
        yield (lambda: None), {}, dict(facts)
    return cell_call


def test_a_call_of_seconds_is_timed_three_times_after_its_warm_up(monkeypatch):
    asked = []
    monkeypatch.setattr(timed.timing, "measure", lambda call, **kw: asked.append(kw) or timing.summarize([1.0, 2.0, 3.0]))
    via = timing.long_call(36_000.0)
    monkeypatch.setattr(timed, "cell_call", _fake_cell_call({"timed_via": via, "host_ms": 1.0,
                                                             "probe_pace_ms": 36_000.0}))
    kernel = type("K", (), {"min_warmup": 0})()
    problem = type("P", (), {"device": torch.device("cpu")})()
    result, _ = timed.time_kernel(kernel, problem, warmup=1, reps=5, warmup_ms=25, warmup_max_ms=1000, rep_ms=100,
                                  cuda_graph=True)
    assert asked == [{"device": torch.device("cpu"), "warmup": 0, "reps": timing.LONG_CALL_REPS}]
    assert result.warmup_calls == 2 and result.timed_via == via and "36.0 s" in via
    assert (result.p20_ms, result.median_ms, result.p80_ms) == (1.4, 2.0, 2.6)  # the spread, kept
    assert timing.long_call(timing.LONG_CALL_MS - 1) is None and timing.long_call(None) is None


def test_a_long_call_is_not_captured(monkeypatch):
    """No graph for a call of seconds: nothing to gain, and its private pool would hold a second copy
    of what a 1M call allocates."""
    monkeypatch.setattr(graphed, "stream_for", lambda device, enabled: object())
    monkeypatch.setattr(graphed, "on", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(timed, "timed_call", lambda kernel, problem, memory: ((lambda: None), {}))
    monkeypatch.setattr(timed, "_host_probe", lambda run, device, memory: (1.0, 36_000.0))
    monkeypatch.setattr(graphed, "capture", lambda run, stream: pytest.fail("captured a long call"))
    with timed.cell_call(None, type("P", (), {"device": torch.device("cpu")})(), 1, True) as (_, _, facts):
        assert facts["timed_via"].startswith("eager: long call")


def test_gpu_long_config_is_the_long_grid_within_its_limit():
    cfg = longca_config.validate(longca_config.merge_files(["config/config.yaml", "config/gpu.yaml",
                                                            "config/gpu_long.yaml"]))
    cells = list(longca_config.kernel_cells(cfg))
    assert {c.seqlen for c in cells} == {262144, 524288, 1048576} and set(cfg["masks"]) == set(LONG_MASKS)
    assert len(cells) == 7 * 4 * 3 * 2 and not list(longca_config.cp_cells(cfg))
    # A 1M backward of ~80 s a call, five calls by the long-call rule, fits its limit with room.
    assert cfg["limits"]["cell_timeout_s"] >= 5 * 80 * 4
