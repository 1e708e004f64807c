"""A CP block as a few variable-length calls of a FlashAttention-style kernel (FlashAttention-3).

A varlen call takes a batch of (query range, key range) pairs, each attended fully, causally
(bottom-right) or within a window, one rule per call.  A CP block's slices (``longca.cp.blocks``) map
onto that: each slice is one pair, its kind one rule (``_RULES``), so a block is one call per rule
and *layer*, a layer being slices whose query rows do not overlap (a call writes each output row
once).  On a document mask that is one call for the diagonal pieces (causal) and one for the earlier
pieces (full), instead of a call per document piece.

Rows go to the kernel as views where a layer's ranges follow one another in memory (a rank's own
block of whole documents, its fetched keys); otherwise they are gathered (``index_select``) and the
results put back by index.  The running output and dq stay in the inputs' dtype: the first call
that covers every query row writes them in place, later ones fold in by log-sum-exp
(``longca.cp.block_ops.merge_into``, in float32, rounded once).  The backward takes the global output
and LSE, as every block's does.

``VarlenFns`` is the kernel's side: ``Fa3Varlen`` calls flash-attention's ``hopper/`` build; a test
passes a plain reference (``tests/varlen_reference.py``) and checks this module's bookkeeping on the
CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..attention.masks import AttnSlice, SliceKind
from .blocks import merge_slices
from .block_ops import Accumulators, BlockOps, merge_into


def _rule(s: AttnSlice) -> tuple[bool, int, int]:
    """``(causal, window_left, window_right)`` of a (trimmed) slice, bottom-right aligned as
    FlashAttention's varlen calls are (-1: unbounded)."""
    shift = s.lk - s.lq
    return _RULES[s.kind](shift)


_RULES = {
    SliceKind.FULL: lambda shift: (False, -1, -1),
    SliceKind.CAUSAL: lambda shift: (True, -1, -1),
    SliceKind.INV_CAUSAL: lambda shift: (False, shift, -1),   # j >= i
    SliceKind.BI_CAUSAL: lambda shift: (False, shift, 0),     # i <= j <= i + shift
}


def trimmed(s: AttnSlice) -> Optional[AttnSlice]:
    """``s`` without the query rows that attend no key (a causal or inverse-causal slice with fewer
    keys than queries), so every row a call gets attends at least one key and every window is
    non-negative; None when no row attends anything (an empty slice, a band with fewer keys than
    queries)."""
    if s.area() == 0:
        return None
    if s.lk >= s.lq or s.kind is SliceKind.FULL:
        return s
    if s.kind is SliceKind.CAUSAL:      # the top rows see nothing
        return AttnSlice(s.q_end - s.lk, s.q_end, s.k_start, s.k_end, s.kind)
    # Inverse causal: the bottom rows see nothing (a band with fewer keys than queries has no area).
    return AttnSlice(s.q_start, s.q_start + s.lk, s.k_start, s.k_end, s.kind)


def layers(slices: Sequence[AttnSlice]) -> list[tuple[tuple[bool, int, int], tuple[AttnSlice, ...]]]:
    """The calls a block takes: slices grouped by rule, each group split into layers of slices whose
    query ranges do not overlap (first fit, in query order)."""
    by_rule: dict[tuple[bool, int, int], list[list[AttnSlice]]] = {}
    for s in sorted((t for t in map(trimmed, slices) if t is not None), key=lambda t: (t.q_start, t.k_start)):
        stack = by_rule.setdefault(_rule(s), [])
        for layer in stack:
            if layer[-1].q_end <= s.q_start:
                layer.append(s)
                break
        else:
            stack.append([s])
    return [(rule, tuple(layer)) for rule, stack in by_rule.items() for layer in stack]


def _rows(ranges: Sequence[tuple[int, int]], device) -> tuple[Optional[slice], Optional[torch.Tensor]]:
    """A view ``slice`` when the ranges follow one another in memory, else the gather index."""
    if all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])):
        return slice(ranges[0][0], ranges[-1][1]), None
    return None, torch.cat([torch.arange(a, b) for a, b in ranges]).to(device)


@dataclass(frozen=True)
class Call:
    """One varlen call of a block, for one batch size and shard lengths."""

    causal: bool
    window: tuple[int, int]
    cu_q: torch.Tensor        # int32, offsets into the gathered (or viewed) rows
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    q_view: Optional[slice]   # rows of the flattened (b·s) shard, or
    q_index: Optional[torch.Tensor]
    k_view: Optional[slice]
    k_index: Optional[torch.Tensor]
    rows: int                 # query rows the call writes

    def q_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.q_view] if self.q_view is not None else x.index_select(0, self.q_index)

    def k_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.k_view] if self.k_view is not None else x.index_select(0, self.k_index)


def plan_calls(slices: Sequence[AttnSlice], batch: int, sq: int, sk: int, device) -> tuple[Call, ...]:
    """The block's calls on ``batch`` sequences of ``sq`` queries and ``sk`` keys (flattened
    ``(b·s, h, d)``: sequence ``i``'s rows start at ``i·s``)."""
    calls = []
    for (causal, left, right), layer in layers(slices):
        q_ranges = [(i * sq + s.q_start, i * sq + s.q_end) for i in range(batch) for s in layer]
        k_ranges = [(i * sk + s.k_start, i * sk + s.k_end) for i in range(batch) for s in layer]
        lq = [b - a for a, b in q_ranges]
        lk = [b - a for a, b in k_ranges]
        cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device=device)
        q_view, q_index = _rows(q_ranges, device)
        k_view, k_index = _rows(k_ranges, device)
        calls.append(Call(causal, (left, right), cu_q, cu_k, max(lq), max(lk), q_view, q_index, k_view, k_index,
                          sum(lq)))
    return tuple(calls)


class VarlenFns:
    """A varlen kernel's forward and backward on packed ``(total, heads, d)`` tensors (GQA native).

    ``forward`` returns the output (written into ``out`` when given) and the LSE, float32
    ``(heads, total_q)``; ``backward`` takes the global output and LSE for the same rows and returns
    dq (written into ``dq`` when given), dk, dv, shaped as q, k, v."""

    def forward(self, q, k, v, call: Call, scale: float, sm_margin: int, out=None):
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, call: Call, scale: float, sm_margin: int, dq=None):
        raise NotImplementedError


class Fa3Varlen(VarlenFns):
    """flash-attention ``hopper/``: its ``fwd`` operator and ``_flash_attn_backward``.  The forward
    calls the operator, not the module's ``_flash_attn_forward``: that one is a custom op declared to
    mutate nothing, which refuses an output buffer (its result would alias an input); the operator
    declares ``out`` as written.  ``num_splits=1`` as the module passes it (LongCA's build has no
    split kernels)."""

    def __init__(self, module):
        self.module = module
        self.fwd = torch.ops.flash_attn_3.fwd   # registered when the module imported flash_attn_3._C

    def forward(self, q, k, v, call, scale, sm_margin, out=None):
        out, lse, *_ = self.fwd(
            q, k, v, out=out, cu_seqlens_q=call.cu_q, cu_seqlens_k=call.cu_k, max_seqlen_q=call.max_q,
            max_seqlen_k=call.max_k, softmax_scale=scale, is_causal=call.causal, window_size_left=call.window[0],
            window_size_right=call.window[1], num_splits=1, sm_margin=sm_margin)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, call, scale, sm_margin, dq=None):
        dq = torch.empty_like(q) if dq is None else dq
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        self.module._flash_attn_backward(
            dout, q, k, v, out, lse, cu_seqlens_q=call.cu_q, cu_seqlens_k=call.cu_k, max_seqlen_q=call.max_q,
            max_seqlen_k=call.max_k, dq=dq, dk=dk, dv=dv, softmax_scale=scale, is_causal=call.causal,
            window_size_left=call.window[0], window_size_right=call.window[1], sm_margin=sm_margin)
        return dq, dk, dv


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


@dataclass
class DqAccumulator:
    """A rank's dq in the inputs' dtype, unset until the first block: a block whose one call covers
    every query row writes it in place (no zero fill, no extra pass)."""

    buf: torch.Tensor
    fresh: bool = True


class VarlenBlockOps(BlockOps):
    """A block as ``plan_calls``' calls of ``fns``, folded into the running accumulators.

    The output and dq are kept in the inputs' dtype, as the kernel writes them: a float32 copy of a
    16K-token shard's output (64 heads of 128) is 0.5 GB, and the passes to it and back are memory
    traffic a short-document shard's attention is not much larger than (measured:
    lab/data/cp_fa3_local_4xh200_2026-11-28).  The first call that covers every query row writes
    them in place; later blocks are folded in by LSE, computed in float32 and rounded once."""

    def __init__(self, fns: VarlenFns):
        self.fns = fns

    def prepare(self, slices, device):
        # Merged first: ``restrict`` leaves a one-row piece below each causal one, which would be a
        # call of its own.
        return super().prepare(merge_slices(slices), device)

    def _calls(self, prepared, q, k) -> tuple[Call, ...]:
        b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        return self.shaped(prepared, (b, sq, sk), lambda: plan_calls(prepared["slices"], b, sq, sk, q.device))

    def new_accumulators(self, q):
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        return Accumulators(torch.empty_like(q), lse)

    def new_dq(self, q):
        return DqAccumulator(torch.empty_like(q))

    def dq_result(self, dq_acc, dtype):
        if dq_acc.fresh:   # no block reached this rank's queries
            dq_acc.buf.zero_()
        return dq_acc.buf.to(dtype)

    def forward_into(self, q, k, v, prepared, scale, acc, sm_margin=0):
        qf, kf, vf = _flat(q), _flat(k), _flat(v)
        acc_out, acc_lse = _flat(acc.out), _flat(acc.lse)     # (b·s, h, d), (b·s, h)
        for call in self._calls(prepared, q, k):
            whole = acc.fresh and call.rows == qf.shape[0]     # every row, once: written, not merged
            into = acc_out if whole and call.q_view is not None else None
            out, lse = self.fns.forward(call.q_rows(qf), call.k_rows(kf), call.k_rows(vf), call, scale, sm_margin,
                                        out=into)
            lse = lse.t()
            if whole:
                if into is None:
                    acc_out.index_copy_(0, call.q_index, out)
                    acc_lse.index_copy_(0, call.q_index, lse)
                else:
                    acc_lse.copy_(lse)
                acc.fresh = False
                continue
            acc.start_zeroed()
            if call.q_view is not None:
                merge_into(acc_out[call.q_view], acc_lse[call.q_view], out, lse)
            else:
                rows_out, rows_lse = acc_out.index_select(0, call.q_index), acc_lse.index_select(0, call.q_index)
                merge_into(rows_out, rows_lse, out, lse)
                acc_out.index_copy_(0, call.q_index, rows_out)
                acc_lse.index_copy_(0, call.q_index, rows_lse)

    def forward(self, q, k, v, prepared, scale):
        acc = self.new_accumulators(q)
        self.forward_into(q, k, v, prepared, scale, acc)
        out, lse = acc.result()
        return out.transpose(1, 2), lse.transpose(1, 2)

    def backward_into(self, dout, q, k, v, out, lse, prepared, scale, dq_acc, sm_margin=0):
        b, s, h, _ = q.shape
        qf, kf, vf, of, dof = _flat(q), _flat(k), _flat(v), _flat(out), _flat(dout)
        lse_hs = lse.transpose(0, 1).reshape(h, b * s)          # (b, h, s) → (h, b·s)
        dq_f = _flat(dq_acc.buf)
        dk = torch.zeros(kf.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros_like(dk)
        for call in self._calls(prepared, q, k):
            rows_lse = (lse_hs[:, call.q_view] if call.q_view is not None
                        else lse_hs.index_select(1, call.q_index)).contiguous()
            whole = dq_acc.fresh and call.rows == qf.shape[0] and call.q_view is not None
            gq, gk, gv = self.fns.backward(call.q_rows(dof), call.q_rows(qf), call.k_rows(kf), call.k_rows(vf),
                                           call.q_rows(of), rows_lse, call, scale, sm_margin,
                                           dq=dq_f if whole else None)
            if not whole:
                if dq_acc.fresh:
                    dq_f.zero_()
                _add_rows(dq_f, call.q_view, call.q_index, gq)
            dq_acc.fresh = False
            _add_rows(dk, call.k_view, call.k_index, gk)
            _add_rows(dv, call.k_view, call.k_index, gv)
        return dk.view(k.shape), dv.view(v.shape)

    def backward(self, dout, q, k, v, out, lse, prepared, scale):
        dq = self.new_dq(q)
        dk, dv = self.backward_into(dout, q, k, v, out, lse, prepared, scale, dq)
        return self.dq_result(dq, torch.float32).transpose(1, 2), dk, dv


def _add_rows(into: torch.Tensor, view: Optional[slice], index: Optional[torch.Tensor], grad: torch.Tensor) -> None:
    """``grad`` added into rows of ``into``, in ``into``'s dtype."""
    if view is not None:
        into[view] += grad.to(into.dtype)
    else:
        into.index_add_(0, index, grad.to(into.dtype))
