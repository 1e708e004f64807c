"""How the global sequence is split across CP ranks (load balancing).

* ``contiguous``: rank r holds tokens ``[r·S/W, (r+1)·S/W)``: balanced when every row attends
  about as many keys (``full``, sliding windows).
* ``zigzag`` (head-tail): the sequence is cut into ``2W`` chunks and rank r holds chunks ``r`` and
  ``2W-1-r``, so under a causal mask every rank gets one cheap and one expensive chunk.
* ``per_document_zigzag``: the same inside every document, so packed documents of any lengths are
  balanced too.  Shards can differ by a few tokens; every shard is padded at its end to the longest
  (padding rows attend nothing and are attended by nothing, so they change no number).

A layout is data: a tuple of spans per rank plus the padded shard length.  ``dispatch`` and
``undispatch`` move tensors ``(batch, seqlen, heads, head_dim)`` between the two views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..attention.masks import AttnMask
from .blocks import Span, shard_length, spans_from_ranges


@dataclass(frozen=True)
class Layout:
    name: str
    seqlen: int
    shards: tuple[tuple[Span, ...], ...]  # per rank
    shard_len: int                        # every local tensor's length (padded)

    @property
    def world(self) -> int:
        return len(self.shards)

    @property
    def padding(self) -> int:
        return self.shard_len * self.world - self.seqlen

    def index(self, rank: int) -> torch.Tensor:
        """Global token index of each local row of ``rank`` (padding rows: -1)."""
        idx = torch.full((self.shard_len,), -1, dtype=torch.long)
        for s in self.shards[rank]:
            idx[s.offset:s.offset + s.length] = torch.arange(s.start, s.end)
        return idx

    def gathered_index(self) -> torch.Tensor:
        """For each global token, its row in the shards of every rank laid end to end (what an
        all-gather leaves): ``gathered[:, gathered_index()]`` is the sequence in its global order."""
        idx = torch.empty(self.seqlen, dtype=torch.long)
        for rank, spans in enumerate(self.shards):
            for s in spans:
                base = rank * self.shard_len + s.offset
                idx[s.start:s.end] = torch.arange(base, base + s.length)
        return idx

    def concatenated(self, ranks) -> tuple[Span, ...]:
        """The spans of ``ranks``' shards laid end to end (each shard padded to ``shard_len``): the
        token order of what an all-gather or all-to-all over those ranks leaves on one rank."""
        return tuple(Span(s.start, s.end, s.offset + i * self.shard_len)
                     for i, r in enumerate(ranks) for s in self.shards[r])

    def dispatch(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s local shard of a global ``(b, s, ...)`` tensor (zero padded)."""
        spans = self.shards[rank]
        parts = [x[:, s.start:s.end] for s in spans]
        pad = self.shard_len - shard_length(spans)
        if pad:
            parts.append(x.new_zeros((x.shape[0], pad) + tuple(x.shape[2:])))
        return torch.cat(parts, dim=1).contiguous()

    def assemble(self, locals_: Sequence[torch.Tensor]) -> torch.Tensor:
        """The global tensor from every rank's local shard (padding dropped)."""
        first = locals_[0]
        out = first.new_empty((first.shape[0], self.seqlen) + tuple(first.shape[2:]))
        for rank, local in enumerate(locals_):
            for s in self.shards[rank]:
                out[:, s.start:s.end] = local[:, s.offset:s.offset + s.length]
        return out


def _even_cuts(start: int, length: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` consecutive ranges covering ``[start, start+length)``, sizes differing by <= 1."""
    base, extra = divmod(length, parts)
    out, pos = [], start
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((pos, pos + n))
        pos += n
    return out


def _from_rank_ranges(name: str, seqlen: int, per_rank: list[list[tuple[int, int]]]) -> Layout:
    shards = tuple(spans_from_ranges(r) for r in per_rank)
    return Layout(name, seqlen, shards, max(shard_length(s) for s in shards))


def contiguous(mask: AttnMask, world: int) -> Layout:
    return _from_rank_ranges("contiguous", mask.seqlen_q,
                             [[r] for r in _even_cuts(0, mask.seqlen_q, world)])


def _zigzag_ranges(start: int, length: int, world: int) -> list[list[tuple[int, int]]]:
    chunks = _even_cuts(start, length, 2 * world)
    return [[chunks[r], chunks[2 * world - 1 - r]] for r in range(world)]


def zigzag(mask: AttnMask, world: int) -> Layout:
    return _from_rank_ranges("zigzag", mask.seqlen_q, _zigzag_ranges(0, mask.seqlen_q, world))


def per_document_zigzag(mask: AttnMask, world: int) -> Layout:
    if mask.documents is None:
        raise ValueError(f"per_document_zigzag needs a document mask; {mask.name!r} has no documents")
    per_rank: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    start = 0
    for length in mask.documents:
        for rank, ranges in enumerate(_zigzag_ranges(start, length, world)):
            per_rank[rank].extend(ranges)
        start += length
    return _from_rank_ranges("per_document_zigzag", mask.seqlen_q, per_rank)


LAYOUTS: dict[str, Callable[[AttnMask, int], Layout]] = {
    "contiguous": contiguous,
    "zigzag": zigzag,
    "per_document_zigzag": per_document_zigzag,
}

# Patterns whose rows grow with the query index without documents: head-tail balances them.
_ZIGZAG_PATTERNS = frozenset({"causal", "prefix_lm_causal"})


def auto_layout(mask: AttnMask) -> str:
    """The balanced layout for a mask: per-document zigzag for packed documents, zigzag for causal-like
    masks, contiguous otherwise (every row costs about the same)."""
    if mask.documents is not None and len(mask.documents) > 1:
        return "per_document_zigzag"
    if mask.name in _ZIGZAG_PATTERNS or mask.documents is not None:
        return "zigzag"
    return "contiguous"


def build(name: str, mask: AttnMask, world: int) -> Layout:
    if name == "auto":
        name = auto_layout(mask)
    try:
        return LAYOUTS[name](mask, world)
    except KeyError:
        raise ValueError(f"unknown CP layout {name!r}; known: auto, {', '.join(LAYOUTS)}") from None
