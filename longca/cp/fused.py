"""A whole CP block in one kernel call: what a CP strategy's local attention prefers.

A CP block is a query shard against a key shard, its mask the global mask restricted to the two
(``longca.cp.blocks.restrict``): a list of FULL / CAUSAL / INV_CAUSAL / BI_CAUSAL slices in local
coordinates.  A packed-document mask leaves one slice per document piece, so calling a kernel per
slice makes the local attention host-bound (dozens of small launches per block).  A kernel that
takes a list of slices natively (FFA's ranges with a type each) or a mask tensor runs the block as
one call instead; a varlen kernel (FlashAttention-3) as one call per slice kind
(``longca.cp.fused_varlen``); each is a ``BlockOps`` (``longca.cp.block_ops``).  ``FUSED`` names, per local kernel and device type, how it does so; a kernel it
does not name falls back to one call per piece (``longca.cp.local``).  The table lives here, beside
the CP machinery, rather than in each kernel's adapter: an adapter's code keys that kernel's
published cells, which a CP entry point does not change.

Tensors are ``(batch, seqlen, heads, head_dim)`` with the KV heads as they are (GQA native).
``forward`` returns the block's output and its log-sum-exp (float32 ``(b, h, s)``; -inf on rows the
block does not touch, whose output must be finite); ``backward`` takes the *global* output and LSE
and returns this block's share of dq ``(b, h, s, d)`` and of dk, dv ``(b, s, h_kv, d)``, float32.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional, Sequence

import torch

from .. import kernels
from ..attention.masks import AttnMask
from ..kernels._lse_ops import LseOps
from ..kernels.magi_ffa import ffa_ranges
from .block_ops import Accumulators, BlockOps
from .fused_varlen import Fa3Varlen, VarlenBlockOps


def _expand(kv: torch.Tensor, group: int) -> torch.Tensor:
    """``(b, s, h_kv, d)`` → ``(b, h_kv·group, s, d)``."""
    kv = kv.transpose(1, 2)
    return kv.repeat_interleave(group, dim=1) if group > 1 else kv


def _fold(grad: torch.Tensor, group: int) -> torch.Tensor:
    """Gradient w.r.t. expanded KV heads ``(b, h, s, d)`` → w.r.t. the real ones, ``(b, s, h_kv, d)``."""
    if group > 1:
        b, h, s, d = grad.shape
        grad = grad.view(b, h // group, group, s, d).sum(2)
    return grad.transpose(1, 2).float().contiguous()


class DenseMaskBlockOps(BlockOps):
    """The block's mask as one additive float mask, through an LSE entry point that takes a mask
    tensor (``bias`` mode).  The mask is ``s_q × s_k`` floats, so this suits small blocks (CPU runs);
    GPU kernels with native ranges (FFA) do without it."""

    def __init__(self, ops: LseOps):
        if "bias" not in ops.modes:
            raise ValueError(f"{type(ops).__name__} takes no mask tensor")
        self.ops = ops

    def _bias(self, prepared, q, k):
        def make():
            allowed = torch.zeros(q.shape[1], k.shape[1], dtype=torch.bool)
            for s in prepared["slices"]:
                allowed[s.q_start:s.q_end, s.k_start:s.k_end] |= s.dense()
            bias = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, float("-inf"))
            # float32, as the per-piece path passes it: each LSE op casts it to what its kernel takes.
            return bias.to(q.device), (~allowed.any(1)).to(q.device)
        return self.shaped(prepared, (q.shape[1], k.shape[1]), make)

    def forward(self, q, k, v, prepared, scale):
        bias, empty = self._bias(prepared, q, k)
        group = q.shape[2] // k.shape[2]
        out, lse = self.ops.forward(q.transpose(1, 2), _expand(k, group), _expand(v, group), False, bias, scale)
        # Rows of the block that attend nothing (a kernel may give them any statistics): LSE -inf
        # and a zero output, so the merge gives them no weight.
        lse = lse.masked_fill(empty, float("-inf"))
        out = out.masked_fill(empty.unsqueeze(-1), 0)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, prepared, scale):
        bias, _ = self._bias(prepared, q, k)
        group = q.shape[2] // k.shape[2]
        dq, dk, dv = self.ops.backward(dout.transpose(1, 2), q.transpose(1, 2), _expand(k, group),
                                       _expand(v, group), out.transpose(1, 2), lse, False, bias, scale)
        return dq.float(), _fold(dk, group), _fold(dv, group)


def ranges_disjoint(ranges: Sequence[Sequence[int]]) -> bool:
    """Whether no two ``[start, end)`` ranges share an index (FFA's precondition for writing a
    block without atomics: each output row is written by one range)."""
    ordered = sorted((int(a), int(b)) for a, b in ranges if b > a)
    return all(prev[1] <= nxt[0] for prev, nxt in zip(ordered, ordered[1:]))


def _packed(x: torch.Tensor) -> torch.Tensor:
    """``(b, s, h, d)`` → FFA's packed ``(b·s, h, d)``."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


class FfaBlockOps(BlockOps):
    """One FFA call per CP block, forward and backward, through the two functions FFA's own autograd
    function calls (they take the global output and LSE).  Float32 output and gradients, reduced
    atomically over overlapping query (key) ranges: the variants that autograd function uses, which
    ``scripts/build_kernels.sh ffa`` compiles ahead of time.  A rank's first forward block whose
    query ranges do not overlap is written without atomics into the unset output buffer (FFA
    zero-fills the rows no range covers), as MagiAttention's first stage is: no zero fill of the
    buffer, no atomic adds (the non-atomic variant is prebuilt too)."""

    def __init__(self, module):
        self.fwd, self.bwd = module._flex_flash_attn_forward, module._flex_flash_attn_backward

    def _ranges(self, prepared, q, k):
        b, sq, sk = q.shape[0], q.shape[1], k.shape[1]

        def make():
            ranges = ffa_ranges(AttnMask("cp_block", sq, sk, prepared["slices"]), b)
            q_ranges, k_ranges, types = (torch.tensor(x, dtype=torch.int32, device=q.device) for x in ranges)
            return {"q_ranges": q_ranges, "k_ranges": k_ranges, "attn_type_map": types}
        return self.shaped(prepared, (b, sq, sk), make)

    def prepare(self, slices, device):
        prepared = super().prepare(slices, device)
        # The common case (batch 1) made now: its ranges do not depend on the shard lengths.
        one = ffa_ranges(AttnMask("cp_block", 0, 0, prepared["slices"]), 1)
        prepared["batch_one"] = {name: torch.tensor(x, dtype=torch.int32, device=device)
                                 for name, x in zip(("q_ranges", "k_ranges", "attn_type_map"), one)}
        # A batch repeats the ranges at each sequence's offset, so disjoint for one is disjoint for all.
        prepared["q_disjoint"] = ranges_disjoint(one[0])
        return prepared

    def _call_ranges(self, prepared, q, k):
        return prepared["batch_one"] if q.shape[0] == 1 else self._ranges(prepared, q, k)

    def forward_into(self, q, k, v, prepared, scale, acc, sm_margin=0):
        # FFA corrects what the buffers hold by their LSE and adds the block (atomically, in float32),
        # as MagiAttention's own stages do: no merge pass, no partial output.  Rows no range covers
        # keep what they had.  The first block, if its query ranges are disjoint, is written plainly.
        plain = acc.fresh and prepared["q_disjoint"]
        if not plain:
            acc.start_zeroed()
        acc.fresh = False
        b, s, h, d = q.shape
        self.fwd(q=_packed(q), k=_packed(k), v=_packed(v), sink=None, sink_layout="sh",
                 out=acc.out.view(b * s, h, d), lse=acc.lse.view(b * s, h), softmax_scale=scale, softcap=0.0,
                 out_type=torch.float32, disable_fwd_atomic_reduction=plain, deterministic=False,
                 sm_margin=sm_margin, **self._call_ranges(prepared, q, k))

    def forward(self, q, k, v, prepared, scale):
        acc = Accumulators.unset(q.shape, q.device)
        self.forward_into(q, k, v, prepared, scale, acc)
        out, lse = acc.result()
        return out.transpose(1, 2), lse.transpose(1, 2)

    def backward_into(self, dout, q, k, v, out, lse, prepared, scale, dq_acc, sm_margin=0):
        # dq is reduced into the running buffer (atomically, as FFA reduces overlapping ranges);
        # dk, dv of this block come back on their own: the ring sends them on.
        b, s, h, d = q.shape
        lse_packed = lse.transpose(1, 2).reshape(b * s, h).contiguous()
        _, dk, dv, _ = self.bwd(dout=_packed(dout), q=_packed(q), k=_packed(k), v=_packed(v), sink=None,
                                sink_layout="sh", out=_packed(out), lse=lse_packed, dq=dq_acc.view(b * s, h, d),
                                dk=None, dv=None, dsink=None, softmax_scale=scale, softcap=0.0,
                                dq_type=torch.float32, dk_type=torch.float32, dv_type=torch.float32,
                                disable_bwd_dkv_atomic_reduction=False, deterministic=False, sm_margin=sm_margin,
                                **self._call_ranges(prepared, q, k))
        return dk.view(k.shape), dv.view(v.shape)

    def backward(self, dout, q, k, v, out, lse, prepared, scale):
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = self.backward_into(dout, q, k, v, out, lse, prepared, scale, dq)
        return dq.transpose(1, 2), dk, dv


def _ffa(device: torch.device) -> BlockOps:
    return FfaBlockOps(importlib.import_module("magi_attention.functional.flex_flash_attn"))


def _fa3(device: torch.device) -> BlockOps:
    return VarlenBlockOps(Fa3Varlen(importlib.import_module("flash_attn_interface")))


def _dense(kernel: str) -> Callable[[torch.device], Optional[BlockOps]]:
    def make(device: torch.device) -> Optional[BlockOps]:
        ops = kernels.get(kernel).lse_ops(device)
        return DenseMaskBlockOps(ops) if ops is not None and "bias" in ops.modes else None
    return make


# (local kernel, device type) → its one-call-per-block entry point.  The dense mask is for the CPU
# only: on a GPU an s × s mask per block costs more than the per-piece calls it saves.
FUSED: dict[tuple[str, str], Callable[[torch.device], Optional[BlockOps]]] = {
    ("ffa", "cuda"): _ffa,
    ("flash_attn3", "cuda"): _fa3,
    ("sdpa_math", "cpu"): _dense("sdpa_math"),
    ("sdpa_flash", "cpu"): _dense("sdpa_flash"),
}


def block_ops(kernel: str, device: torch.device) -> Optional[BlockOps]:
    """``kernel``'s one-call-per-block entry point on ``device``, or None (then: one call per piece)."""
    make = FUSED.get((kernel, torch.device(device).type))
    if make is None or kernels.get(kernel).available():
        return None
    return make(torch.device(device))
