"""FFA on a per-head block pattern: each KV head's kept tiles as query/key ranges.

FFA takes one list of (query range, key range) pairs for all heads, so a pattern that differs per
KV head is run the way MagiAttention's block-sparse benchmark runs it: each KV head becomes its own
stretch of tokens.  Queries go in as ``(kv heads · tokens, group, head_dim)`` (the query heads of a
KV head's group stay heads, GQA native) and keys and values as ``(kv heads · tokens, 1,
head_dim)``; head ``h``'s ranges are offset by ``h · tokens``, one pair per run of consecutive
kept key tiles of a query tile, and FFA merges each query tile's key ranges into one work item
(``auto_range_merge``, its block-sparse mode; without it each pair is its own work item reduced
atomically into the output, many times slower: docs/kernels.md has the measurement).  The layout change from LongCA's ``(batch, tokens, heads,
head_dim)`` inputs and back is three copies in and one out (in the backward, their gradients),
inside the timed call: what a caller with token-major tensors pays.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from ..attention.masks import HeadBlockMask, SliceKind
from ..attention.problem import Problem
from . import register
from .magi_ffa import FFA_TYPE, MagiFFA


def head_ranges(mask: HeadBlockMask, batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(q_ranges, k_ranges)``, each ``(n, 2)``: every run of kept key tiles of every query tile
    of every KV head, head ``h`` of sequence ``b`` at token offset ``(b · heads + h) · seqlen``."""
    heads, rows, first, end = mask.runs()
    n = mask.seqlen_q
    at = mask.offsets()  # (heads, tiles + 1): tile i of head h spans at[h, i] .. at[h, i + 1]
    base = heads * n
    per_seq_q = np.stack([base + at[heads, rows], base + at[heads, rows + 1]], axis=1)
    per_seq_k = np.stack([base + at[heads, first], base + at[heads, end]], axis=1)
    shift = (np.arange(batch) * mask.heads * n).repeat(len(rows))[:, None]
    return np.tile(per_seq_q, (batch, 1)) + shift, np.tile(per_seq_k, (batch, 1)) + shift


class FFABlockSparse(MagiFFA):
    name = "ffa_block_sparse"
    description = "FFA with each KV head's kept tiles as ranges (block_sparse_heads, variable_block_sparse_heads)"
    head_masks = True
    mask_code = ("attention/masks/head_blocks.py",)

    def supports_mask(self, problem: Problem) -> str | None:
        if not isinstance(problem.mask, HeadBlockMask):
            return f"{self.name} runs per-head block patterns (block_sparse_heads); other masks: ffa"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        q_ranges, k_ranges = head_ranges(problem.mask, problem.batch)
        as_tensor = lambda x: torch.as_tensor(x, dtype=torch.int32, device=problem.device)  # noqa: E731
        types = np.full(len(q_ranges), FFA_TYPE[SliceKind.FULL])
        return {"q_ranges": as_tensor(q_ranges), "k_ranges": as_tensor(k_ranges),
                "attn_type_map": as_tensor(types), "ranges": len(types),
                "block": int(problem.mask.tile_sizes().max())}  # the longest query range

    def forward(self, q, k, v, prepared):
        b, s, hq, d = q.shape
        hk = k.shape[2]
        g = hq // hk
        heads_major = q.view(b, s, hk, g, d).transpose(1, 2).reshape(b * hk * s, g, d)
        keys = k.transpose(1, 2).reshape(b * hk * s, 1, d)
        values = v.transpose(1, 2).reshape(b * hk * s, 1, d)
        with _on_default_stream(q.device):
            out, _meta = self._load()(heads_major, keys, values, q_ranges=prepared["q_ranges"],
                                      k_ranges=prepared["k_ranges"], attn_type_map=prepared["attn_type_map"],
                                      auto_range_merge=True, max_seqlen_q=prepared["block"])
        if out.is_cuda:  # made on the default stream, read on this one: not reused before it is read
            out.record_stream(torch.cuda.current_stream(out.device))
        return out.view(b, hk, s, g, d).transpose(1, 2).reshape(b, s, hq, d)


@contextlib.contextmanager
def _on_default_stream(device: torch.device):
    """Run FFA's range merge on the default stream, ordered after (and before) the current one.

    The merge (MagiAttention's ``magi_attn_ext``: ``sort_and_reorder_ranges.cu``,
    ``unique_consecutive_pairs.cu`` at the pinned commit) launches some kernels on the current
    stream and some on the default one; called on another stream (as the timing's CUDA-graph path
    does) the call never completed.  On the default stream every kernel is ordered.  A CUDA graph
    cannot capture the default stream, so these cells are timed eagerly (the row's ``timed_via``)."""
    if device.type != "cuda" or torch.cuda.current_stream(device) == torch.cuda.default_stream(device):
        yield
        return
    current, default = torch.cuda.current_stream(device), torch.cuda.default_stream(device)
    default.wait_stream(current)
    with torch.cuda.stream(default):
        yield
    current.wait_stream(default)


register(FFABlockSparse())
