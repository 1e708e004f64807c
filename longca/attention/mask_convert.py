"""Conversions from an ``AttnMask`` to what kernels consume, all derived from its slices.

* ``dense``           — bool ``[seqlen_q, seqlen_k]`` (small sizes only);
* ``cu_seqlens``      — int32 document boundaries for varlen kernels (flash-attn style);
* ``row_intervals``   — per query row, up to K key intervals ``[lo, hi)`` (K = most slices any
  row belongs to: 1 for most patterns, 2 for shared_question / global_sliding_window).  Each
  slice attends one contiguous key interval per row, so this table is exact;
* ``mask_mod``        — a FlexAttention mask function looking rows up in that table: no Python
  control flow on tensor values, so it works under vmap and torch.compile;
* ``block_mask``      — the ``BlockMask`` ``create_block_mask`` would make of that ``mask_mod``,
  built from the row table without compiling, cached per mask;
* ``block_sparsity``  — which ``block_q × block_k`` tiles hold an attended pair, from the slices
  alone (O(slices + blocks), works at 1M tokens).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from .errors import MaskError
from .masks import AttnMask, AttnSlice, SliceKind

MaskKey = tuple[str, int, int, tuple[tuple[int, int, int, int, str], ...]]

# Rows past seqlen_q in the lookup table attend nothing, so a kernel that evaluates the mask on
# a padded last tile indexes inside the table.
Q_PADDING = 1024


def dense(mask: AttnMask, device: torch.device | str | None = None) -> torch.Tensor:
    """``mask.to_dense()`` on ``device``."""
    out = mask.to_dense()
    return out if device is None else out.to(device)


def cu_seqlens(mask: AttnMask, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[0, d0, d0 + d1, ..., seqlen]`` as int32, for document masks."""
    if mask.documents is None:
        raise MaskError(f"cu_seqlens: mask {mask.name!r} has no documents")
    cum = np.concatenate([[0], np.cumsum(np.asarray(mask.documents, dtype=np.int64))])
    return torch.tensor(cum, dtype=torch.int32, device=device)


def mask_key(mask: AttnMask) -> MaskKey:
    """A hashable identity of the attended set (params is a dict, so AttnMask is not hashable)."""
    return (mask.name, mask.seqlen_q, mask.seqlen_k, tuple(s.as_tuple() for s in mask.slices))


def row_intervals(mask: AttnMask, pad_to: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``lo, hi`` of shape ``[K, rows]`` (int64): row q attends ``∪_c [lo[c, q], hi[c, q])``.

    ``rows`` is seqlen_q rounded up to a multiple of ``pad_to``; unused entries are ``[0, 0)``.
    """
    sq = mask.seqlen_q
    rows = -(-sq // pad_to) * pad_to
    coverage = np.zeros(sq + 1, dtype=np.int64)
    for s in mask.slices:
        coverage[s.q_start] += 1
        coverage[s.q_end] -= 1
    k = max(1, int(np.cumsum(coverage).max()))
    lo = np.zeros((k, rows), dtype=np.int64)
    hi = np.zeros((k, rows), dtype=np.int64)
    fill = np.zeros(rows, dtype=np.int64)  # next free slot per row
    for s in sorted(mask.slices, key=lambda s: (s.k_start, s.q_start)):
        r = np.arange(s.q_start, s.q_end)
        slot = fill[s.q_start : s.q_end]
        lo[slot, r], hi[slot, r] = s.key_bounds(r)
        fill[s.q_start : s.q_end] += 1
    return lo, hi


def mask_mod(mask: AttnMask, device: torch.device | str = "cpu") -> Callable[..., torch.Tensor]:
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` for ``mask``.

    Two gathers and two comparisons per interval slot; the loop over slots is over a Python
    int fixed at build time, never over tensor values."""
    lo, hi = row_intervals(mask, pad_to=Q_PADDING)
    dtype = torch.int32 if max(mask.seqlen_q, mask.seqlen_k) < 2**31 - Q_PADDING else torch.int64
    los = [torch.as_tensor(x, dtype=dtype, device=device) for x in lo]
    his = [torch.as_tensor(x, dtype=dtype, device=device) for x in hi]

    def mod(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        allowed = (los[0][q_idx] <= kv_idx) & (kv_idx < his[0][q_idx])
        for lo_c, hi_c in zip(los[1:], his[1:]):
            allowed = allowed | ((lo_c[q_idx] <= kv_idx) & (kv_idx < hi_c[q_idx]))
        return allowed

    mod.__name__ = f"mask_mod_{mask.name}"
    return mod


def block_mask(mask: AttnMask, block_size: int = 128, device: torch.device | str = "cpu") -> Any:
    """The ``BlockMask`` ``create_block_mask`` makes of ``mask_mod(mask)`` (B = H = None: broadcast),
    built without compiling anything and cached on the mask's slices: ``tile_sums`` classifies each
    tile, and its kv lists are ordered as torch orders them (``_dense_to_ordered``: a stable argsort
    of the tile row).  Compiled, ``create_block_mask`` cost a compilation per length in every measuring
    process; eager, it holds the whole (q, k) grid at once (16 GiB of booleans at 128K)."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise MaskError(f"block_size must be a positive integer, got {block_size!r}")
    return _block_mask_cached(mask_key(mask), block_size, str(torch.device(device)))


@functools.lru_cache(maxsize=16)
def _block_mask_cached(key: MaskKey, block_size: int, device: str) -> Any:
    from torch.nn.attention.flex_attention import BlockMask

    name, sq, sk, tuples = key
    mask = AttnMask(name, sq, sk, tuple(AttnSlice(*t) for t in tuples))
    sums = tile_sums(mask, block_size, device)
    partial = (sums > 0) & (sums < block_size * block_size)
    full = sums == block_size * block_size
    (kv_num, kv_indices), (full_num, full_indices) = (_ordered(tiles[None, None]) for tiles in (partial, full))
    return BlockMask.from_kv_blocks(kv_num, kv_indices, full_num, full_indices, BLOCK_SIZE=(block_size, block_size),
                                    mask_mod=mask_mod(mask, device), seq_lengths=(sq, sk))


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile row, how many tiles are set and their column indices first, ascending, then the
    others: the order ``create_block_mask`` gives a ``BlockMask``'s kv lists."""
    tiles = tiles.to(torch.int32)
    return (tiles.sum(dim=-1).to(torch.int32),
            torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32))


# Tiles of the (query block x key block) grid summed at once in tile_sums: 1 Mi int64 a temporary.
# A cell's memory figure covers its set-up, so a band must stay below what the timed call adds.
TILE_BAND_ELEMENTS = 1 << 20


def tile_sums(mask: AttnMask, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Int32 ``[ceil(sq / block), ceil(sk / block)]``: attended pairs per ``block × block`` tile,
    pairs past the mask's edge counting as not attended (as ``create_block_mask`` pads).  Exact from
    ``mask_mod``'s own row-interval table, never from the (q, k) pairs: a row's interval ``[lo, hi)``
    adds its two partial end tiles directly and ``block`` to every tile between them through a
    difference along the key blocks, so the work is the rows plus the tiles (at 1M tokens and block
    128: 64 Mi tiles, where evaluating every pair is 2^40 comparisons).  A
    band of query blocks at a time (``TILE_BAND_ELEMENTS``), on ``device``."""
    lo, hi = row_intervals(mask, pad_to=block_size)
    nqb, nkb = lo.shape[1] // block_size, -(-mask.seqlen_k // block_size)
    lo_t, hi_t = (torch.as_tensor(x, device=device) for x in (lo, hi))
    band = max(1, TILE_BAND_ELEMENTS // (nkb + 1))  # query blocks per band
    out = torch.empty(nqb, nkb, dtype=torch.int32, device=device)
    for qb in range(0, nqb, band):
        stop = min(qb + band, nqb)
        rows = slice(qb * block_size, stop * block_size)
        direct = torch.zeros((stop - qb) * (nkb + 1), dtype=torch.int64, device=device)
        between = torch.zeros_like(direct)
        row_block = torch.arange(rows.stop - rows.start, device=device) // block_size * (nkb + 1)
        for c in range(lo_t.shape[0]):
            a, b = lo_t[c, rows], hi_t[c, rows]
            some = a < b
            first, last = a // block_size, (b - 1).clamp_min(0) // block_size
            one = some & (first == last)
            two = some & (first < last)
            # One tile: the whole interval.  Two or more: the first tile's tail, the last tile's head,
            # and a whole block's width in every tile between (difference: +block at first + 1,
            # -block at last).
            direct.index_add_(0, (row_block + first)[one], (b - a)[one])
            direct.index_add_(0, (row_block + first)[two], ((first + 1) * block_size - a)[two])
            direct.index_add_(0, (row_block + last)[two], (b - last * block_size)[two])
            width = torch.full_like(a, block_size)
            between.index_add_(0, (row_block + first + 1)[two], width[two])
            between.index_add_(0, (row_block + last)[two], -width[two])
        summed = direct.view(stop - qb, nkb + 1) + between.view(stop - qb, nkb + 1).cumsum(dim=1)
        out[qb:stop] = summed[:, :nkb].to(torch.int32)
    return out


def clear_block_mask_cache() -> None:
    _block_mask_cached.cache_clear()


def block_sparsity(mask: AttnMask, block_q: int, block_k: int) -> tuple[torch.Tensor, float]:
    """Bool ``[ceil(sq / block_q), ceil(sk / block_k)]``: tiles holding ≥ 1 attended pair, and
    the fraction of tiles that do.

    Per slice and q-block, the rows of the slice that attend anything are contiguous and both
    ends of their key intervals are non-decreasing, so the keys the block touches are exactly
    ``[lo(first row), hi(last row))`` — one range per (slice, q-block), marked with a
    difference array.  Partial last blocks are fine (no multiple of the block size needed)."""
    for pname, v in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise MaskError(f"{pname} must be a positive integer, got {v!r}")
    nqb = -(-mask.seqlen_q // block_q)
    nkb = -(-mask.seqlen_k // block_k)
    diff = np.zeros((nqb, nkb + 1), dtype=np.int32)
    for s in mask.slices:
        qb = np.arange(s.q_start // block_q, (s.q_end - 1) // block_q + 1)
        a = np.maximum(qb * block_q, s.q_start)
        b = np.minimum((qb + 1) * block_q, s.q_end)
        # Clip to the rows that attend something (see AttnSlice.key_bounds).
        if s.kind in (SliceKind.CAUSAL, SliceKind.BI_CAUSAL):
            a = np.maximum(a, s.q_end - s.lk)
        if s.kind in (SliceKind.INV_CAUSAL, SliceKind.BI_CAUSAL):
            b = np.minimum(b, s.q_start + s.lk)
        lo_first, hi_first = s.key_bounds(a)
        _, hi_last = s.key_bounds(b - 1)
        ok = (a < b) & (lo_first < hi_first)
        qb, lo_first, hi_last = qb[ok], lo_first[ok], hi_last[ok]
        np.add.at(diff, (qb, lo_first // block_k), 1)
        np.add.at(diff, (qb, (hi_last - 1) // block_k + 1), -1)
    blocks = torch.from_numpy(np.cumsum(diff, axis=1)[:, :nkb] > 0)
    return blocks, float(blocks.sum()) / (nqb * nkb)
