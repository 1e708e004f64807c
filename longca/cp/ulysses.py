"""``ulysses``: DeepSpeed-Ulysses; an all-to-all turns sequence shards into head shards, each rank
attends the whole sequence for its heads, and a second all-to-all turns them back."""

from . import register
from .sequence_parallel import SequenceParallel


@register
class Ulysses(SequenceParallel):
    name = "ulysses"
    description = "all-to-all from sequence- to head-sharded and back (KV heads replicated if too few)"
    # Every rank sees every token after the all-to-all, so no load balancing is needed.
    options = {**SequenceParallel.options, "layout": "contiguous"}

    def degrees(self, heads_q, heads_kv):
        return self.world, 1
