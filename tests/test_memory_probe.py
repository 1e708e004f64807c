"""The memory probe's window: no garbage collection inside it, and none forced when it opens (a
whole pass over the process's objects a cell; garbage from before stays in the baseline)."""

import gc
import weakref

from longca.execution.measure.memory import collector_quiet


class _Node:
    pass


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a        # unreachable once we return, freed only by the collector
    return weakref.ref(a)


def test_garbage_left_before_the_window_stays_until_the_collector_runs_after_it():
    gc.collect()
    left = _cycle()
    with collector_quiet():
        assert left() is not None
    gc.collect()
    assert left() is None


def test_no_collection_runs_inside_the_window_and_the_collector_comes_back():
    assert gc.isenabled()
    with collector_quiet():
        assert not gc.isenabled()
        made_inside = _cycle()
        for _ in range(10_000):     # allocations that would trigger a generation-0 collection
            _Node()
        assert made_inside() is not None
    assert gc.isenabled()
    gc.collect()
    assert made_inside() is None


def test_a_collector_switched_off_by_the_caller_stays_off():
    gc.disable()
    try:
        with collector_quiet():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
