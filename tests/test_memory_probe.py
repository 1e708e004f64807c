"""The memory probe's window: no garbage collection inside it, and none forced when it opens (a
whole pass over the process's objects a cell; garbage from before stays in the baseline)."""

import gc
import weakref

from longca.execution.measure.call_memory import collector_quiet


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


class _Allocator:
    """What torch.cuda's allocator statistics say, for bytes this test allocates and frees."""

    def __init__(self):
        self.allocated = self.peak = 0

    def alloc(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n):
        self.allocated -= n

    def install(self, monkeypatch):
        import torch
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                            lambda device=None: setattr(self, "peak", self.allocated))


def _read(monkeypatch, call_peak):
    """A backward cell as the timing makes it: inputs 100 and prepare (a 50 transient, 10 kept), its
    forward (30 kept), a cold call, then the probe's first call (``call_peak`` above its start)."""
    from longca.execution.measure.call_memory import CallReading

    allocator = _Allocator()
    allocator.install(monkeypatch)
    allocator.alloc(1000)                  # another cell's leftovers: in the baseline, not the figure
    reading = CallReading("cuda")
    with reading.setup():
        allocator.alloc(100)
        allocator.alloc(50), allocator.free(50)
        allocator.alloc(10)
    allocator.alloc(30)                    # the forward a backward timing differentiates
    allocator.alloc(500), allocator.free(500)  # the cold call: compilation, plans (not read)
    with reading.call():
        allocator.alloc(call_peak), allocator.free(call_peak)
    with reading.call():                   # the probe's other calls are not read
        allocator.alloc(10_000), allocator.free(10_000)
    return reading.part()


def test_the_figure_is_the_set_up_or_what_was_held_plus_the_warm_call(monkeypatch):
    assert _read(monkeypatch, call_peak=40) == {"peak_mem_bytes": 180, "memory_via": "timing"}
    assert _read(monkeypatch, call_peak=5) == {"peak_mem_bytes": 150, "memory_via": "timing"}


def test_no_figure_without_both_windows_and_the_collector_is_back_when_the_timing_ends_early(monkeypatch):
    import pytest
    from longca.execution.measure.call_memory import CallReading

    _Allocator().install(monkeypatch)
    reading = CallReading("cuda")
    with pytest.raises(RuntimeError):
        with reading.setup():
            raise RuntimeError("prepare failed")
    assert not gc.isenabled()    # until the timing's block ends (cell_call closes the reading)
    reading.close()
    reading.close()
    assert gc.isenabled() and reading.part() is None
