"""Conversions from an ``AttnMask`` to what kernels consume, all derived from its slices.

* ``dense``           — bool ``[seqlen_q, seqlen_k]`` (small sizes only);
* ``cu_seqlens``      — int32 document boundaries for varlen kernels (flash-attn style);
* ``row_intervals``   — per query row, up to K key intervals ``[lo, hi)`` (K = most slices any
  row belongs to: 1 for most patterns, 2 for shared_question / global_sliding_window).  Each
  slice attends one contiguous key interval per row, so this table is exact;
* ``mask_mod``        — a FlexAttention mask function looking rows up in that table: no Python
  control flow on tensor values, so it works under vmap and torch.compile;
* ``block_mask``      — ``create_block_mask`` of that ``mask_mod``, cached per mask;
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


def block_mask(mask: AttnMask, block_size: int = 128, device: torch.device | str = "cpu",
               compile: bool = False) -> Any:
    """``create_block_mask`` for ``mask`` (B = H = None: broadcast), cached on the mask's slices.

    ``create_block_mask`` evaluates ``mask_mod`` on every (q, k) pair; pass ``compile=True``
    (its ``_compile``) on GPU at long lengths."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise MaskError(f"block_size must be a positive integer, got {block_size!r}")
    return _block_mask_cached(mask_key(mask), block_size, str(torch.device(device)), compile)


@functools.lru_cache(maxsize=16)
def _block_mask_cached(key: MaskKey, block_size: int, device: str, compile: bool) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    name, sq, sk, tuples = key
    mask = AttnMask(name, sq, sk, tuple(AttnSlice(*t) for t in tuples))
    return create_block_mask(mask_mod(mask, device), None, None, sq, sk, device=device,
                             BLOCK_SIZE=block_size, _compile=compile)


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
