"""``usp``: Unified Sequence Parallelism; Ulysses inside groups of consecutive ranks, a ring across
the groups (a 2-D layout)."""

from . import register
from .sequence_parallel import SequenceParallel, divisor_at_most


@register
class USP(SequenceParallel):
    name = "usp"
    description = "Ulysses (inner, consecutive ranks) × ring (outer) on a 2-D rank grid"
    # ulysses_degree 0: the largest divisor of the CP size not above its square root (a real 2-D grid).
    options = {**SequenceParallel.options, "ulysses_degree": 0}

    def degrees(self, heads_q, heads_kv):
        u = self.opts["ulysses_degree"] or divisor_at_most(self.world, self.world ** 0.5)
        return u, self.world // u
