"""``ring``: P2P ring attention (K/V rotate with batched isend/irecv, the next block posted before
the current one is computed; backward rotates K/V and dK/dV)."""

from . import register
from .sequence_parallel import SequenceParallel


@register
class Ring(SequenceParallel):
    name = "ring"
    description = "ring attention: K/V blocks rotate over P2P, overlapped with the block compute"

    def degrees(self, heads_q, heads_kv):
        return 1, self.world
