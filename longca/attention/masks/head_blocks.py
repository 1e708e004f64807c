"""The ``block_sparse_heads`` pattern: a random block pattern per KV head, the sparse study's mask.

Block-sparse attention kernels (FFA with ranges per head, FlexAttention with a ``BlockMask``,
FlashInfer's block-sparse wrapper, VSA) are benchmarked on random block patterns that differ from
head to head: the sequence is cut into ``block``-token tiles, and in each KV head every query tile
keeps the same number of key tiles, ``max(1, round(kept · tiles))``, chosen at random by the seed.
So the kept fraction is exact and equal in every head (FLOPs are counted on the kept tiles:
``4 · area · heads_q · head_dim`` forward, ``area`` one head's kept pairs), no query row is empty,
and the query heads of a KV head's group share its pattern (GQA).

Unlike every other pattern this mask is not one slice list for all heads: ``HeadBlockMask`` holds
the kept-tile table ``(heads, tiles, tiles)`` and gives each KV head's slices; ``slices`` is empty.
A kernel runs it only if it declares ``head_masks = True`` (``kernel_takes``); any other kernel's
cell is ``unsupported``.  ``heads`` and ``group`` are the problem's KV heads and query heads per KV
head: config fills them in from ``heads_kv`` and ``heads_q`` (``HEAD_PATTERNS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import MaskError
from ..varlen import STREAM_PARAMS, rng
from ._checks import _positive
from .block_sparse import SPARSE_BLOCK
from .patterns import EXTRA_PATTERNS
from .slices import AttnMask, AttnSlice, SliceKind

BLOCK_SPARSE_HEADS = "block_sparse_heads"
# Patterns whose masks differ per KV head: config sets their ``heads`` and ``group`` parameters
# from the problem's heads, and CP strategies (one mask for every head) do not take them.
HEAD_PATTERNS = (BLOCK_SPARSE_HEADS,)


@dataclass(frozen=True, eq=False)
class HeadBlockMask(AttnMask):
    """A mask per KV head: ``kept_blocks[h, i, j]`` says whether query tile ``i`` attends key tile
    ``j`` in KV head ``h`` (and its ``group`` query heads)."""

    kept_blocks: np.ndarray = field(default_factory=lambda: np.zeros((1, 0, 0), dtype=bool))
    block: int = 1
    group: int = 1

    @property
    def heads(self) -> int:
        return self.kept_blocks.shape[0]

    def area(self) -> int:
        """One head's attended pairs (every head keeps as many tiles)."""
        return int(self.kept_blocks[0].sum()) * self.block * self.block

    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Consecutive kept key tiles of each (head, query tile) as runs: arrays ``head``,
        ``query_tile``, ``first_key_tile``, ``end_key_tile`` (exclusive), ordered by head, query
        tile and key."""
        h, nq, nk = self.kept_blocks.shape
        padded = np.zeros((h, nq, nk + 2), dtype=np.int8)
        padded[..., 1:-1] = self.kept_blocks
        step = np.diff(padded, axis=-1)
        head, row, first = np.nonzero(step == 1)
        _, _, end = np.nonzero(step == -1)
        return head, row, first, end

    def head_slices(self, head: int) -> tuple[AttnSlice, ...]:
        """KV head ``head``'s mask as FULL slices, one per run of kept key tiles."""
        heads, rows, first, end = self.runs()
        b = self.block
        return tuple(AttnSlice(int(i) * b, (int(i) + 1) * b, int(j0) * b, int(j1) * b, SliceKind.FULL)
                     for h, i, j0, j1 in zip(heads, rows, first, end) if h == head)

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of every query head's mask: ``(heads · group, stop − start, seqlen)``
        bool, each KV head's pattern repeated for its group (broadcasts over the batch)."""
        tiles = torch.from_numpy(self.kept_blocks)
        rows = torch.arange(start, stop) // self.block
        cols = torch.arange(self.seqlen_k) // self.block
        per_kv_head = tiles[:, rows][:, :, cols]
        return per_kv_head.repeat_interleave(self.group, dim=0)

    def to_dense(self) -> torch.Tensor:
        """``(heads · group, seqlen, seqlen)`` bool: the exact reference masks each query head."""
        return self.dense_rows(0, self.seqlen_q)


def _fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise MaskError(f"{BLOCK_SPARSE_HEADS}: {name} must be a number in (0, 1], got {value!r}")
    return float(value)


def block_sparse_heads(seqlen: int, *, seed: int = 0, kept: float = 0.2, block: int = SPARSE_BLOCK, heads: int = 1,
                       group: int = 1) -> HeadBlockMask:
    """Per KV head, each ``block``-token query tile attends ``max(1, round(kept · tiles))`` key
    tiles drawn at random (``seqlen`` a multiple of ``block``); ``heads`` KV heads, ``group`` query
    heads each (config sets both from the grid's heads)."""
    block, heads, group = _positive("block", block), _positive("heads", heads), _positive("group", group)
    kept = _fraction("kept", kept)
    if seqlen % block:
        raise MaskError(f"{BLOCK_SPARSE_HEADS}: seqlen {seqlen} is not a multiple of block {block}")
    tiles = seqlen // block
    per_row = max(1, int(round(kept * tiles)))
    # A random subset of per_row key tiles per (head, query tile): the smallest per_row of uniform
    # draws (float32: 2048² tiles × 8 heads at 128K / 64 is 134 MB, not 268).
    draws = rng(int(seed), STREAM_PARAMS).random((heads, tiles, tiles), dtype=np.float32)
    chosen = np.argpartition(draws, per_row - 1, axis=-1)[..., :per_row] if per_row < tiles else None
    table = np.ones((heads, tiles, tiles), dtype=bool)
    if chosen is not None:
        table[:] = False
        np.put_along_axis(table, chosen, True, axis=-1)
    params = {"kept": kept, "block": block, "heads": heads, "group": group, "seed": int(seed),
              "tiles_per_row": per_row, "kept_actual": per_row / tiles}
    return HeadBlockMask(BLOCK_SPARSE_HEADS, seqlen, seqlen, (), None, params,
                         kept_blocks=table, block=block, group=group)


def kernel_takes(kernel, mask: AttnMask) -> str | None:
    """None when ``kernel`` can run ``mask``; the reason when the mask differs per head and the
    kernel takes one mask for every head."""
    if isinstance(mask, HeadBlockMask) and not getattr(kernel, "head_masks", False):
        return (f"{kernel.name} takes one mask for every head; {mask.name} has a block pattern per KV "
                "head (block-sparse kernels: flex_block_sparse, ffa_block_sparse, vsa_triton)")
    return None


EXTRA_PATTERNS[BLOCK_SPARSE_HEADS] = block_sparse_heads
