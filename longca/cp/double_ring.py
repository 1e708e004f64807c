"""``double_ring``: LoongTrain's double ring; an inner ring within windows of consecutive ranks,
nested in an outer ring across windows whose transfer overlaps a whole inner ring."""

from . import register
from .sequence_parallel import SequenceParallel, divisor_at_most


@register
class DoubleRing(SequenceParallel):
    name = "double_ring"
    description = "inner ring within windows of ranks, nested in an outer ring across windows"
    # window 0: the largest divisor of the ring size not above its square root.
    options = {**SequenceParallel.options, "window": 0, "ulysses_degree": 1}

    def degrees(self, heads_q, heads_kv):
        u = self.opts["ulysses_degree"]
        ring = self.world // u if self.world % u == 0 else self.world
        return u, self.opts["window"] or divisor_at_most(ring, ring ** 0.5)
