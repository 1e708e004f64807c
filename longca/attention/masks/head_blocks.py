"""The ``block_sparse_heads`` pattern: a random block pattern per KV head, the sparse study's mask.

Block-sparse attention kernels (FFA with ranges per head, FlexAttention with a ``BlockMask``,
FlashInfer's block-sparse wrapper, VSA) are benchmarked on random block patterns that differ from
head to head: the sequence is cut into ``block``-token tiles, and in each KV head every query tile
keeps the same number of key tiles, ``max(1, round(kept · tiles))``, chosen at random by the seed.
So the kept fraction is exact and equal in every head (FLOPs are counted on the kept tiles:
``4 · area · heads_q · head_dim`` forward, ``area`` one head's kept pairs), no query row is empty,
and the query heads of a KV head's group share its pattern (GQA).

``variable_block_sparse_heads`` is the same with tiles of different sizes (the seeds' second
sparse study): the sequence is cut into ``seqlen / block`` tiles whose sizes are multiples of
``unit`` tokens (at least one unit, ``block`` on average), drawn at random by the seed.  One cut
and one kept-tile table are drawn; each KV head takes them in its own random order of tiles (sizes
and table permuted alike), so heads differ while every head attends exactly the same number of
pairs (the FLOPs stay exact).  Each query tile keeps ``max(1, round(kept · tiles))`` key tiles; the
attended fraction of the square, ``kept_actual``, follows from the sizes drawn.

Unlike every other pattern this mask is not one slice list for all heads: ``HeadBlockMask`` holds
the kept-tile table ``(heads, tiles, tiles)`` (and, for variable tiles, each head's tile sizes) and
gives each KV head's slices; ``slices`` is empty.
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
VARIABLE_BLOCK_SPARSE_HEADS = "variable_block_sparse_heads"
# Patterns whose masks differ per KV head: config sets their ``heads`` and ``group`` parameters
# from the problem's heads, and CP strategies (one mask for every head) do not take them.
HEAD_PATTERNS = (BLOCK_SPARSE_HEADS, VARIABLE_BLOCK_SPARSE_HEADS)
# The variable tiles' size step: a multiple of every block-sparse kernel's tile (64 or 128).
VARIABLE_UNIT = 128
# The parameter (and its default) the correctness gate's length must be a multiple of: the gate
# builds the pattern at its own length with that parameter kept (``gate_params``).
GATE_MULTIPLE = {BLOCK_SPARSE_HEADS: ("block", SPARSE_BLOCK), VARIABLE_BLOCK_SPARSE_HEADS: ("unit", VARIABLE_UNIT)}
# At least this many variable tiles at the gate, so sizes still vary there.
GATE_TILES = 4


@dataclass(frozen=True, eq=False)
class HeadBlockMask(AttnMask):
    """A mask per KV head: ``kept_blocks[h, i, j]`` says whether query tile ``i`` attends key tile
    ``j`` in KV head ``h`` (and its ``group`` query heads); every tile ``block`` tokens."""

    kept_blocks: np.ndarray = field(default_factory=lambda: np.zeros((1, 0, 0), dtype=bool))
    block: int = 1
    group: int = 1

    @property
    def heads(self) -> int:
        return self.kept_blocks.shape[0]

    def tile_sizes(self) -> np.ndarray:
        """``(heads, tiles)``: each head's tile sizes in tokens (query and key tiles alike)."""
        return np.full(self.kept_blocks.shape[:2], self.block, dtype=np.int64)

    def granularity(self) -> int:
        """The largest number of tokens that divides every tile: a kernel with smaller tiles of its
        own takes the pattern as those (``unit_table``)."""
        return self.block

    def offsets(self) -> np.ndarray:
        """``(heads, tiles + 1)``: the token where each head's tiles start, and the sequence's end."""
        sizes = self.tile_sizes()
        return np.concatenate([np.zeros((self.heads, 1), dtype=np.int64), np.cumsum(sizes, axis=1)], axis=1)

    def area(self) -> int:
        """One head's attended pairs (every head attends as many)."""
        s = self.tile_sizes()[0]
        return int(s @ self.kept_blocks[0].astype(np.int64) @ s)

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
        o = self.offsets()[head]
        return tuple(AttnSlice(int(o[i]), int(o[i + 1]), int(o[j0]), int(o[j1]), SliceKind.FULL)
                     for h, i, j0, j1 in zip(heads, rows, first, end) if h == head)

    def unit_table(self, unit: int) -> np.ndarray:
        """The kept table at ``unit``-token granularity, ``(heads, seqlen / unit, seqlen / unit)``:
        each tile becomes its ``size / unit`` unit tiles, the same attended pairs (``unit`` must
        divide ``granularity()``)."""
        if self.granularity() % unit:
            raise MaskError(f"{self.name}: its tiles are multiples of {self.granularity()} tokens, not of {unit}")
        return np.stack([t.repeat(s // unit, axis=0).repeat(s // unit, axis=1)
                         for t, s in zip(self.kept_blocks, self.tile_sizes())])

    def dense_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of every query head's mask: ``(heads · group, stop − start, seqlen)``
        bool, each KV head's pattern repeated for its group (broadcasts over the batch)."""
        unit = self.granularity()
        tiles = torch.from_numpy(self.unit_table(unit))
        rows = torch.arange(start, stop) // unit
        cols = torch.arange(self.seqlen_k) // unit
        per_kv_head = tiles[:, rows][:, :, cols]
        return per_kv_head.repeat_interleave(self.group, dim=0)

    def to_dense(self) -> torch.Tensor:
        """``(heads · group, seqlen, seqlen)`` bool: the exact reference masks each query head."""
        return self.dense_rows(0, self.seqlen_q)


@dataclass(frozen=True, eq=False)
class VariableBlockMask(HeadBlockMask):
    """A per-KV-head block pattern whose tiles differ in size: ``sizes[h, i]`` tokens in tile ``i``
    of KV head ``h`` (query and key tiles alike), each a multiple of ``unit``; ``block`` is their
    mean.  Every head attends as many pairs (``variable_block_sparse_heads`` draws it so)."""

    sizes: np.ndarray = field(default_factory=lambda: np.zeros((1, 0), dtype=np.int64))
    unit: int = 1

    def tile_sizes(self) -> np.ndarray:
        return self.sizes

    def granularity(self) -> int:
        return self.unit


def _fraction(pattern: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise MaskError(f"{pattern}: {name} must be a number in (0, 1], got {value!r}")
    return float(value)


def _kept_tables(generator: np.random.Generator, heads: int, tiles: int, per_row: int) -> np.ndarray:
    """``(heads, tiles, tiles)`` bool: in each head, every query tile keeps ``per_row`` key tiles
    drawn at random."""
    # The smallest per_row of uniform draws (float32: 2048² tiles × 8 heads at 128K / 64 is 134 MB,
    # not 268).
    draws = generator.random((heads, tiles, tiles), dtype=np.float32)
    table = np.ones((heads, tiles, tiles), dtype=bool)
    if per_row < tiles:
        chosen = np.argpartition(draws, per_row - 1, axis=-1)[..., :per_row]
        table[:] = False
        np.put_along_axis(table, chosen, True, axis=-1)
    return table


def block_sparse_heads(seqlen: int, *, seed: int = 0, kept: float = 0.2, block: int = SPARSE_BLOCK, heads: int = 1,
                       group: int = 1) -> HeadBlockMask:
    """Per KV head, each ``block``-token query tile attends ``max(1, round(kept · tiles))`` key
    tiles drawn at random (``seqlen`` a multiple of ``block``); ``heads`` KV heads, ``group`` query
    heads each (config sets both from the grid's heads)."""
    block, heads, group = _positive("block", block), _positive("heads", heads), _positive("group", group)
    kept = _fraction(BLOCK_SPARSE_HEADS, "kept", kept)
    if seqlen % block:
        raise MaskError(f"{BLOCK_SPARSE_HEADS}: seqlen {seqlen} is not a multiple of block {block}")
    tiles = seqlen // block
    per_row = max(1, int(round(kept * tiles)))
    table = _kept_tables(rng(int(seed), STREAM_PARAMS), heads, tiles, per_row)
    params = {"kept": kept, "block": block, "heads": heads, "group": group, "seed": int(seed),
              "tiles_per_row": per_row, "kept_actual": per_row / tiles}
    return HeadBlockMask(BLOCK_SPARSE_HEADS, seqlen, seqlen, (), None, params,
                         kept_blocks=table, block=block, group=group)


def variable_block_sparse_heads(seqlen: int, *, seed: int = 0, kept: float = 0.2, block: int = 512,
                                unit: int = VARIABLE_UNIT, heads: int = 1, group: int = 1) -> VariableBlockMask:
    """``seqlen / block`` tiles of random sizes, multiples of ``unit`` tokens averaging ``block``
    (``seqlen`` a multiple of ``block``, ``block`` of ``unit``); each query tile attends
    ``max(1, round(kept · tiles))`` key tiles drawn at random; every KV head takes the same tiles
    and table in its own random order (``heads`` KV heads, ``group`` query heads each)."""
    name = VARIABLE_BLOCK_SPARSE_HEADS
    block, unit = _positive("block", block), _positive("unit", unit)
    heads, group = _positive("heads", heads), _positive("group", group)
    kept = _fraction(name, "kept", kept)
    if block % unit:
        raise MaskError(f"{name}: block {block} (the mean tile) is not a multiple of unit {unit}")
    if seqlen % block:
        raise MaskError(f"{name}: seqlen {seqlen} is not a multiple of block {block}")
    tiles, units = seqlen // block, seqlen // unit
    generator = rng(int(seed), STREAM_PARAMS)
    # Sizes: a random composition of the sequence's units into `tiles` parts of at least one unit
    # (tiles − 1 distinct cuts among the units' boundaries), so the mean is exactly `block`.
    cuts = np.sort(generator.choice(np.arange(1, units), size=tiles - 1, replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [units]])).astype(np.int64) * unit
    per_row = max(1, int(round(kept * tiles)))
    table = _kept_tables(generator, 1, tiles, per_row)[0]
    # Each head the same tiles in its own order: a permutation keeps every head's attended pairs.
    orders = [generator.permutation(tiles) for _ in range(heads)]
    head_sizes = np.stack([sizes[o] for o in orders])
    head_tables = np.stack([table[np.ix_(o, o)] for o in orders])
    area = int(sizes @ table.astype(np.int64) @ sizes)
    params = {"kept": kept, "block": block, "unit": unit, "heads": heads, "group": group, "seed": int(seed),
              "tiles_per_row": per_row, "kept_actual": area / (seqlen * seqlen),
              "smallest_tile": int(sizes.min()), "largest_tile": int(sizes.max())}
    return VariableBlockMask(name, seqlen, seqlen, (), None, params, kept_blocks=head_tables, block=block,
                             group=group, sizes=head_sizes, unit=unit)


def variable_gate_params(mask: VariableBlockMask, n: int) -> dict:
    """``variable_block_sparse_heads``' parameters at the gate's ``n`` tokens (a multiple of its
    unit): the kept fraction, unit and heads kept; the mean tile the largest multiple of the unit
    up to the cell's that divides ``n`` into at least ``GATE_TILES`` tiles."""
    unit = mask.params["unit"]
    units = n // unit
    step = max([k for k in range(1, mask.params["block"] // unit + 1)
                if units % k == 0 and units // k >= GATE_TILES] or [1])
    return {"kept": mask.params["kept"], "block": step * unit, "unit": unit,
            "heads": mask.params["heads"], "group": mask.params["group"]}


def kernel_takes(kernel, mask: AttnMask) -> str | None:
    """None when ``kernel`` can run ``mask``; the reason when the mask differs per head and the
    kernel takes one mask for every head."""
    if isinstance(mask, HeadBlockMask) and not getattr(kernel, "head_masks", False):
        return (f"{kernel.name} takes one mask for every head; {mask.name} has a block pattern per KV "
                "head (block-sparse kernels: ffa_block_sparse, flashinfer_block_sparse, flex_block_sparse, vsa_triton)")
    return None


EXTRA_PATTERNS[BLOCK_SPARSE_HEADS] = block_sparse_heads
EXTRA_PATTERNS[VARIABLE_BLOCK_SPARSE_HEADS] = variable_block_sparse_heads
