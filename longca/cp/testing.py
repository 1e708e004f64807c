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

    @register
    class FailingRing(Ring):
        name = "test_fail_first"
        description = ("test-only: rank 1 raises in its first forward; rank 0 goes on into the ring and fails "
                       "after it, its partner gone (option `die`: rank 1 is killed by SIGKILL instead)")

        options = {**Ring.options, "die": False}

        def _forward(self, q, k, v):
            if self.rank == 1:
                if self.opts["die"]:
                    import signal

                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("test_fail_first: rank 1 fails first, on purpose")
            return super()._forward(q, k, v)
