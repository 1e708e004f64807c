"""The host probe of a graphed cell (``timed._host_probe``): several calls for a short kernel, the
probe's own paced call alone for a long one, so the probe never costs ten long kernel calls; that
one call's pace is what the warm-up compares its first window with."""

import time

import pytest
import torch

from longca.execution.measure import graphed, timed


@pytest.fixture
def probe(monkeypatch):
    """``_host_probe`` on the CPU: synchronising is a no-op, and graphed.host_ms's call counts are kept."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    counts = []
    real = graphed.host_ms

    def counting(run, device, calls=10):
        counts.append(calls)
        return real(run, torch.device("cpu"), calls)

    monkeypatch.setattr(graphed, "host_ms", counting)
    return counts


def _sleeper(ms: float):
    made = []

    def run():
        made.append(1)
        time.sleep(ms / 1e3)
    return run, made


def test_a_short_call_is_probed_over_ten_calls(probe, monkeypatch):
    # A budget far above the call, so a loaded machine's slow sleep still leaves room for ten calls.
    monkeypatch.setattr(timed, "HOST_PROBE_MS", 1000.0)
    run, made = _sleeper(0.2)
    host, pace = timed._host_probe(run, torch.device("cpu"))
    assert host > 0 and pace is None
    assert probe == [10] and len(made) == 11


def test_a_call_of_a_few_milliseconds_gets_as_many_calls_as_fit_the_probe_budget(probe, monkeypatch):
    monkeypatch.setattr(timed, "HOST_PROBE_MS", 100.0)
    run, made = _sleeper(30.0)  # 100 // 30 = 3 calls; a slower sleep under load, fewer
    assert timed._host_probe(run, torch.device("cpu"))[1] is None
    assert probe and 1 <= probe[0] <= 3 and len(made) == 1 + probe[0]


def test_a_long_call_is_its_own_probe(probe):
    run, made = _sleeper(timed.HOST_PROBE_MS * 2)
    host, pace = timed._host_probe(run, torch.device("cpu"))
    assert probe == [] and len(made) == 1
    assert host >= timed.HOST_PROBE_MS * 2  # on the CPU issuing is running: the whole call
    assert pace >= host
