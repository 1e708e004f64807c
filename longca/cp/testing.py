"""A CP strategy that exists to prove a hung collective becomes a ``timeout`` row; registered only
when ``LONGCA_TEST_KERNELS=1`` (like the test-only kernels)."""

import os

import torch.distributed as dist

from . import register
from .ring import Ring

if os.environ.get("LONGCA_TEST_KERNELS") == "1":

    @register
    class HangingRing(Ring):
        name = "test_hang"
        description = "test-only: rank 0 waits in an all-reduce the other ranks never join"

        def _forward(self, q, k, v):
            if self.rank == 0:
                dist.all_reduce(q.new_zeros(1))  # really waits: nobody else calls it
            return super()._forward(q, k, v)
