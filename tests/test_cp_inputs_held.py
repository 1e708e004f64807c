"""A timed CP step holds the rank's own input shards only: the global tensors are freed."""

import gc
import weakref

import torch

from longca.attention.problem import Problem
from longca.execution.measure import cp_cell


class _Halves:
    """A two-rank contiguous layout's rank 0: its shard is a view of the global tensor."""

    def dispatch(self, x):
        return x[:, : x.shape[1] // 2]


def test_the_timed_shards_do_not_keep_the_global_tensors_alive(monkeypatch):
    problem = Problem("causal", 256, 1, 4, 2, 16, torch.float32, "cpu", "fwd")
    drawn = []
    make = Problem.make_inputs

    def spy(self, **kw):
        tensors = make(self, **kw)
        drawn.extend(weakref.ref(t) for t in tensors)
        return tensors

    monkeypatch.setattr(Problem, "make_inputs", spy)
    (q, k, v), dout = cp_cell._timed_inputs(_Halves(), problem, seed=0)
    gc.collect()
    assert all(ref() is None for ref in drawn)  # q, k, v and grad_out of the whole sequence are gone
    assert q.shape[1] == 128 and q.requires_grad and dout.shape == q.shape
