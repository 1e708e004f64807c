"""``magi``: MagiAttention's own distributed attention, the anchor LongCA's strategies are compared with.

MagiAttention dispatches the sequence in chunks balanced by mask area (its min-heap solver), keeps
each query on the rank that holds it, fetches the remote K/V ranges those queries need in stages
that overlap FFA calls (multi-stage overlap), and reduces the partial dK/dV back to their owners.
LongCA hands it the global mask as FFA ranges (one range pair and type per slice) and calls its
public API: ``magi_attn_flex_key`` once when planned, ``dispatch`` / ``calc_attn`` / ``undispatch``
as every strategy's contract asks.  Its local kernel is FFA, as ``local_kernel: auto`` picks for
LongCA's own strategies on a GPU.

The dispatch and overlap settings are those of MagiAttention's published H100 benchmark
(``exps/dist_attn/benchmark_conf.py``: chunks of 2048 tokens, min-heap dispatch, two static overlap
stages of at least 512 tokens); ``chunk_size`` and ``overlap_degree`` are options.  The environment
variables that benchmark sets for NCCL stream priority are not set here: every strategy of a run
shares one environment.

Bytes: MagiAttention's transfers are its own all-to-all-v calls, not LongCA's ``Comm``; while the
strategy is planned, the ``torch.distributed`` collectives it calls are counted by the same rule
``Comm`` counts by (the part of each payload that leaves the rank).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
import torch.distributed as dist

from ..kernels.magi_ffa import ffa_ranges
from . import register
from .base import Strategy, Unsupported
from .comm import sent_bytes

# FFA's integer mask types (``ffa_ranges``) by MagiAttention's names for them.
_MASK_TYPES = ("full", "causal", "inv_causal", "bi_causal")


def rows_area(mask, rows: np.ndarray) -> int:
    """Attended (query, key) pairs of the global query rows ``rows``: what the rank that holds those
    queries computes when, as in MagiAttention, a query is attended where it lives."""
    rows = np.asarray(rows, dtype=np.int64)
    total = 0
    for s in mask.slices:
        mine = rows[(rows >= s.q_start) & (rows < s.q_end)]
        if mine.size:
            lo, hi = s.key_bounds(mine)
            total += int(np.maximum(hi - lo, 0).sum())
    return total


class _CountedCollectives:
    """``torch.distributed``'s all-to-all, all-gather, reduce-scatter and batched P2P wrapped to add
    what each call sends to ``owner.comm_bytes``; ``restore`` puts the originals back."""

    NAMES = ("all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor", "batch_isend_irecv")

    def __init__(self, owner: Strategy):
        self.owner, self.saved = owner, {n: getattr(dist, n) for n in self.NAMES}
        for name in self.NAMES:
            setattr(dist, name, self._counted(name, self.saved[name]))

    def restore(self) -> None:
        for name, fn in self.saved.items():
            setattr(dist, name, fn)

    def _sent(self, name, args, kwargs) -> int:
        group = kwargs.get("group")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if name == "batch_isend_irecv":
            ops = args[0] if args else kwargs["p2p_op_list"]
            return sum(sent_bytes("send", op.tensor.numel() * op.tensor.element_size(), world)
                       for op in ops if op.op in (dist.isend, dist.send))
        if name == "all_to_all_single":
            x = args[1] if len(args) > 1 else kwargs["input"]
            splits = kwargs.get("input_split_sizes", args[3] if len(args) > 3 else None)
            nbytes = x.numel() * x.element_size()
            own = splits[rank] * (nbytes // max(x.shape[0], 1)) if splits else None
            return sent_bytes("all_to_all", nbytes, world, own=own)
        x = args[1] if len(args) > 1 else kwargs["input"]  # all-gather: input; reduce-scatter: input
        nbytes = x.numel() * x.element_size()
        return sent_bytes("all_gather" if name == "all_gather_into_tensor" else "reduce_scatter", nbytes, world)

    def _counted(self, name, fn):
        def call(*args, **kwargs):
            self.owner.comm_bytes += int(self._sent(name, args, kwargs))
            return fn(*args, **kwargs)
        return call


@register
class Magi(Strategy):
    name = "magi"
    description = ("MagiAttention's distributed attention: area-balanced chunk dispatch, remote K/V "
                   "fetched in stages overlapped with FFA")
    options = {"chunk_size": 2048, "overlap_degree": 2}
    own_collectives = "MagiAttention calls its own collectives"

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        if torch.device(device).type != "cuda":
            raise Unsupported("MagiAttention's distributed attention runs on NCCL and CUDA only")
        try:
            api = importlib.import_module("magi_attention.api")
            config = importlib.import_module("magi_attention.config")
        except Exception as exc:  # noqa: BLE001 — any import failure is the reason
            raise Unsupported(f"magi_attention is not installed here ({type(exc).__name__}: {exc})") from None
        group = self.group or dist.group.WORLD
        q_ranges, k_ranges, types = ffa_ranges(mask)
        if not q_ranges:
            raise Unsupported("the mask attends nothing")
        overlap = config.OverlapConfig(degree=self.opts["overlap_degree"], min_chunk_size=512, max_num_chunks=4096)
        self.api = api
        self.key = api.magi_attn_flex_key(
            q_ranges=api.AttnRanges.from_ranges(q_ranges), k_ranges=api.AttnRanges.from_ranges(k_ranges),
            attn_mask_type=[_MASK_TYPES[t] for t in types], total_seqlen_q=mask.seqlen_q,
            total_seqlen_k=mask.seqlen_k, num_heads_q=heads_q, num_heads_kv=heads_kv, head_dim=head_dim,
            pad_size=0, cp_group_or_mesh=group,
            dist_attn_config=config.DistAttnConfig(
                dispatch_config=config.DispatchConfig(chunk_size=self.opts["chunk_size"] or None,
                                                      alg=config.MinHeapDispatchAlg()),
                overlap_config=overlap))
        positions = api.get_position_ids(self.key).cpu().numpy()
        self.rank_area = rows_area(mask, positions[positions < mask.seqlen_q])
        self.notes = {"local_kernel": "ffa", "layout": "magi min-heap dispatch",
                      "chunk_size": int(getattr(self.key, "chunk_size", 0) or 0),
                      "pad_tokens": int(getattr(self.key, "pad_size", 0) or 0),
                      "overlap_degree": self.opts["overlap_degree"]}
        self._counter = _CountedCollectives(self)

    def close(self) -> None:
        counter = getattr(self, "_counter", None)
        if counter is not None:
            self._counter = None
            counter.restore()
            self.api.clear_cache()

    # LongCA's tensors are (batch 1, seqlen, heads, head_dim); MagiAttention's (seqlen, heads, head_dim).
    def dispatch(self, x_global: torch.Tensor) -> torch.Tensor:
        if x_global.shape[0] != 1:
            raise Unsupported("MagiAttention's API takes one packed sequence (batch 1)")
        return self.api.dispatch(x_global[0], self.key).unsqueeze(0)

    def undispatch(self, x_local: torch.Tensor) -> torch.Tensor:
        return self.api.undispatch(x_local[0], self.key).unsqueeze(0)

    def attention(self, q, k, v):
        out, _ = self.api.calc_attn(q[0], k[0], v[0], self.key)
        return out.unsqueeze(0)
