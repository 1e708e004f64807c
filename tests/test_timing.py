import time

import pytest
import torch

from longca.execution.measure import timing


class FakeClock:
    """Stands in for the ``time`` module inside ``longca.execution.measure.timing``: a call "takes" exactly what it
    sleeps, so the warm-up and repetition logic is tested without the scheduler's jitter (a loaded
    CI machine stretches a 2 ms sleep by more than the 2 % steadiness tolerance)."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", fake)
    monkeypatch.setattr(timing, "_last_busy", {})
    return fake


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


def test_warmup_runs_for_at_least_warmup_ms_before_timing(clock):
    calls = []

    def run():
        calls.append(clock.perf_counter())
        clock.sleep(0.01)

    start = clock.perf_counter()
    timing.measure(run, device=torch.device("cpu"), warmup=1, reps=3, warmup_ms=100)
    warmup_calls = len(calls) - 3
    # 10 ms a call: 100 ms of warm-up is ten calls, not the one the count asks for.
    # The counted one, the pace probe, nine more (one more where the float pace rounds up).
    assert 11 <= warmup_calls <= 12, warmup_calls
    assert calls[warmup_calls] - start >= 0.1


def test_warmup_count_is_what_every_participant_agrees_on():
    """CP ranks must make the same number of calls: `agree` decides the extra count."""
    asked = []

    def agree(n):
        asked.append(n)
        return 7  # e.g. the slowest rank needs more calls than this one

    made = timing.warm_up(lambda: time.sleep(0.002), device=torch.device("cpu"), calls=2, min_ms=20, agree=agree)
    assert made == 2 + 1 + 7 and len(asked) == 1 and asked[0] >= 1  # counted, the pace probe, the agreed
    # No duration asked: exactly the count, and nobody is consulted.
    assert timing.warm_up(lambda: None, device=torch.device("cpu"), calls=3, agree=lambda n: 1 / 0) == 3


def test_negative_warmup_ms_is_refused():
    with pytest.raises(ValueError, match="warmup_ms"):
        timing.measure(lambda: None, device=torch.device("cpu"), warmup=0, reps=1, warmup_ms=-1)


def test_a_slow_first_call_does_not_shorten_the_warmup(clock):
    """One-time costs (plan selection, compilation) must not count as warm-up: the duration is
    filled at the pace of a call made after them."""
    calls = []

    def run():
        calls.append(clock.perf_counter())
        clock.sleep(0.3 if len(calls) == 1 else 0.005)

    made = timing.warm_up(run, device=torch.device("cpu"), calls=2, min_ms=100)
    assert made == len(calls)
    after_first = calls[-1] + 0.005 - calls[1]
    assert after_first >= 0.1 - 1e-9, after_first  # 100 ms of 5 ms calls after the 300 ms first one
    assert 2 + 1 + 19 <= made <= 2 + 1 + 20


def test_budget_warmup_goes_on_until_the_pace_is_steady(clock):
    """A pace that is still settling (a ramp): the warm-up ends only once two successive windows
    agree."""
    calls = []

    def run():
        calls.append(None)
        clock.sleep(0.02 + 0.1 * 0.7 ** len(calls))  # 90 ms, 69 ms, ... -> 20 ms

    warm = timing.warm_up_until_steady(run, device=torch.device("cpu"), calls=1, min_ms=0, max_ms=5000,
                                       tolerance=0.05)
    assert warm.steady is True and warm.calls == len(calls)
    assert warm.calls >= 8  # 0.1 * 0.7**n < 0.05 * 0.02 / 0.3 first at n ~ 8
    assert 0.019 <= warm.per_call_ms / 1e3 <= 0.026


def test_with_no_counted_calls_a_slow_first_call_keeps_the_warm_up_going(clock):
    """A graph's replays come after the eager calls that paid one-time costs, so the warm-up makes
    no untimed call; a first replay slower than the rest (graph upload) only makes its window
    disagree with the next one."""
    for first_s, made in ((0.1, 2), (0.5, 3)):  # steady from the start: two windows of one call
        calls = []

        def run():
            calls.append(None)
            clock.sleep(first_s if len(calls) == 1 else 0.1)

        warm = timing.warm_up_until_steady(run, device=torch.device("cpu"), calls=0, min_ms=0, max_ms=5000)
        assert warm.calls == len(calls) == made
        assert warm.steady is True and warm.per_call_ms == pytest.approx(100)


def test_a_previous_window_of_the_same_work_can_end_the_warm_up_at_the_first(clock):
    """A graph's first replay is compared with the probe's one eager call of the same work: agreeing,
    the warm-up is that one replay; disagreeing (a host-bound eager call), it goes on as before."""
    for probe_ms, made in ((100.4, 1), (130.0, 2)):
        calls = []

        def run():
            calls.append(None)
            clock.sleep(0.1)

        warm = timing.warm_up_until_steady(run, device=torch.device("cpu"), calls=0, min_ms=0, max_ms=5000,
                                           previous_ms=probe_ms)
        assert warm.calls == len(calls) == made and warm.steady is True


def test_a_graphed_cell_makes_no_untimed_replay(monkeypatch):
    """time_kernel: the eager calls before capture are the counted warm-up of a graphed cell, so
    the timing harness is told to make none, and gets the probe's pace when it was one call; an
    eager cell's harness makes them."""
    import contextlib

    from longca.execution.measure import timed

    asked = []
    monkeypatch.setattr(timed.timing, "measure", lambda call, **kw: asked.append((kw["warmup"], kw["previous_ms"]))
                        or timing.summarize([1.0]))

    def fake_cell_call(facts):
        @contextlib.contextmanager
        def cell_call(kernel, problem, warmup, cuda_graph, memory):
            yield (lambda: None), {}, dict(facts)
        return cell_call

    kernel = type("K", (), {"min_warmup": 1})()
    problem = type("P", (), {"device": torch.device("cpu")})()
    for facts, expected in (({"timed_via": "graph", "host_ms": 0.1, "probe_pace_ms": 40.0}, (0, 40.0)),
                            ({"timed_via": "graph", "host_ms": 0.1, "probe_pace_ms": None}, (0, None)),
                            ({}, (3, None))):
        monkeypatch.setattr(timed, "cell_call", fake_cell_call(facts))
        result, _ = timed.time_kernel(kernel, problem, warmup=3, reps=5, cuda_graph=bool(facts))
        assert asked[-1] == expected
        assert result.timed_via == facts.get("timed_via")   # the probe's pace is not a row field


def test_the_first_cell_after_idle_warms_up_long_and_the_next_one_short(clock):
    """After idling, a GPU runs at boost clocks for a while, steadily: two agreeing windows cannot
    tell that plateau from the sustained state, so the first cell warms up for warmup_max_ms; a
    cell right after it finds the device loaded."""
    cpu = torch.device("cpu")

    def cell():
        return timing.measure(lambda: clock.sleep(0.002), device=cpu, warmup=1, reps=2, warmup_ms=5,
                              warmup_max_ms=200)

    first, second = cell(), cell()
    assert first.warmup_spent_ms >= 200 and first.warmup_steady is True
    assert second.warmup_spent_ms < 100 and second.warmup_steady is True
    clock.sleep(timing.IDLE_GAP_S - 0.1)  # a short pause: still loaded
    assert cell().warmup_spent_ms < 100
    clock.sleep(timing.IDLE_GAP_S + 0.1)
    assert cell().warmup_spent_ms >= 200


def test_budget_warmup_stops_at_its_ceiling_and_says_so(clock):
    state = {"n": 0}

    def run():
        state["n"] += 1
        clock.sleep(0.001 * 1.3 ** state["n"])  # a pace that never settles

    t = timing.measure(run, device=torch.device("cpu"), warmup=1, reps=2, warmup_max_ms=150)
    assert t.warmup_steady is False
    assert 150 <= t.warmup_spent_ms < 400


def test_rep_ms_fills_a_time_budget_with_at_least_reps_calls(clock):
    t = timing.measure(lambda: clock.sleep(0.005), device=torch.device("cpu"), warmup=1, reps=3, rep_ms=60)
    assert 12 <= t.reps <= 13  # 60 ms of 5 ms calls (13: the float pace rounds up)
    assert t.median_ms == pytest.approx(5.0)
    t = timing.measure(lambda: clock.sleep(0.005), device=torch.device("cpu"), warmup=1, reps=20, rep_ms=10)
    assert t.reps == 20
    assert t.warmup_steady is None  # counted warm-up (no warmup_max_ms): no steadiness check


def test_counts_only_without_budgets():
    t = timing.measure(lambda: None, device=torch.device("cpu"), warmup=3, reps=4)
    assert (t.reps, t.warmup_calls, t.warmup_steady) == (4, 3, None)
