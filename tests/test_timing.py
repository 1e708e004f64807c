import time

import pytest
import torch

from longca import timing


def test_quantiles_match_numpy_definition():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert timing.quantile(xs, 0.5) == 3.0
    assert timing.quantile(xs, 0.2) == pytest.approx(1.8)
    assert timing.quantile(xs, 0.8) == pytest.approx(4.2)


def test_measure_counts_warmup_and_reps_and_times_only_run():
    calls = {"run": 0, "setup": 0}

    def setup():
        calls["setup"] += 1
        time.sleep(0.02)  # untimed: must not show up in the samples

    def run():
        calls["run"] += 1
        time.sleep(0.005)

    t = timing.measure(run, device=torch.device("cpu"), warmup=2, reps=5, setup=setup)
    assert calls == {"run": 7, "setup": 7}
    assert t.reps == 5
    assert 4.5 <= t.median_ms < 15
    assert t.p20_ms <= t.median_ms <= t.p80_ms
    assert t.min_ms <= t.p20_ms and t.p80_ms <= t.max_ms


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="reps"):
        timing.measure(lambda: None, device=torch.device("cpu"), warmup=0, reps=0)
