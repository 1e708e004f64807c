"""The machine ceiling: a real, quick matmul-rate measurement."""


import pytest
import torch

from longca.execution.measure import ceilings


def test_matmul_rate_is_flops_over_the_median_time():
    entry = ceilings.matmul_tflops("cpu", "float32", warmup=1, reps=3)
    n = entry["n"]
    assert ceilings.MIN_N <= n <= ceilings.MAX_N["cpu"] and n & (n - 1) == 0  # a power of two
    assert entry["flops"] == 2.0 * n ** 3
    assert entry["tflops"] == pytest.approx(entry["flops"] / (entry["median_ms"] * 1e-3) / 1e12)
    assert 0 < entry["tflops_p20"] <= entry["tflops"] <= entry["tflops_p80"]
    assert entry["dtype"] == "float32" and entry["kind"] == "matmul" and entry["reps"] == 3


def test_size_is_chosen_within_the_time_target_and_the_cap():
    assert ceilings.choose_n(torch.device("cpu"), torch.float32, target_ms=1e-6) == ceilings.MIN_N
    assert ceilings.choose_n(torch.device("cpu"), torch.float32, max_n=512, target_ms=1e9) in (256, 512)
    assert ceilings.matmul_tflops("cpu", torch.float64, n=128, warmup=0, reps=1)["n"] == 128


@pytest.mark.parametrize("probe_ms, expected", [
    # Latency-bound small sizes, then the rate improves until a product passes the target (50 ms).
    ({256: 16.0, 512: 20.0, 1024: 40.0, 2048: 300.0}, 1024),
    # The best rate is the last size probed, but that product took over 2 × the target: not timed.
    ({256: 0.5, 512: 2.0, 1024: 15.0, 2048: 110.0}, 1024),
    # A slow dtype: the first size is already over the target; it is the one timed.
    ({256: 180.0}, 256),
    # A fast device: every size up to the cap.
    ({256: 0.01, 512: 0.05, 1024: 0.3, 2048: 2.0}, 2048),
])
def test_size_with_the_best_probed_rate_is_timed(monkeypatch, probe_ms, expected):
    probed = []

    def fake_probe(n, device, target_ms):  # the "call" is its size (product below)
        probed.append(n)
        return probe_ms[n]

    monkeypatch.setattr(ceilings, "product", lambda n, device, dtype, gen: n)
    monkeypatch.setattr(ceilings, "_probe_ms", fake_probe)
    monkeypatch.setattr(ceilings, "MIN_N", 256)
    assert ceilings.choose_n(torch.device("cpu"), torch.float32, max_n=2048) == expected
    assert probed == sorted(probe_ms)  # doubling, stopping after the first product over the target


def test_the_whole_measurement_runs_on_cpu_and_round_trips(tmp_path):
    # bfloat16 has no fast CPU matmul: the size choice keeps it quick all the same (how quick is
    # not asserted here: a loaded CI machine is no place for timing targets).
    result = ceilings.write("cpu", ["float32", "bfloat16"], tmp_path / "ceilings.json", threads=2)
    assert result["device"] == "cpu" and result["cpu_threads"] == 2 and result["device_name"]
    loaded = ceilings.load(tmp_path / "ceilings.json")
    assert loaded == result
    assert ceilings.matmul_ceiling(loaded, "bfloat16")["dtype"] == "bfloat16"
    assert ceilings.matmul_ceiling(loaded, "float16") is None
    assert ceilings.load(tmp_path / "missing.json") is None and ceilings.matmul_ceiling(None, "float32") is None


def test_a_ceiling_that_cannot_be_measured_is_written_as_none_with_its_error(tmp_path):
    """A job with no usable GPU (a cluster node's device that is not there) writes no ceiling and the
    reason, instead of failing the run; figures then draw no line."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the cuda measurement would succeed")
    result = ceilings.write("cuda", ["bfloat16"], tmp_path / "ceilings.json")
    assert result["matmul"] == [] and result["error"]
    assert ceilings.load(tmp_path / "ceilings.json") == result
    assert ceilings.matmul_ceiling(result, "bfloat16") is None
