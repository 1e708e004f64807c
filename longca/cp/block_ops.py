"""What every way of computing a CP block shares: the log-sum-exp merge into a rank's running
accumulators (``merge_into``, ``Accumulators``) and the interface of a block run as one kernel call
(``BlockOps``).  Below the modules that compute blocks: ``longca.cp.local`` (pieces through a
kernel's LSE entry point), ``longca.cp.fused`` (whole blocks, and the table of kernels that take
them) and ``longca.cp.fused_varlen`` (whole blocks as varlen calls) all import it, and it imports
none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..attention.masks import AttnSlice


def merge_into(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Fold a partial ``(out, lse)`` into the running accumulators, in place.

    ``acc_out``/``out``: ``(b, h, s, d)``; ``acc_lse``/``lse``: ``(b, h, s)``.  ``acc_out`` is float32,
    or the inputs' dtype where a block op keeps it so (``longca.cp.fused_varlen``).  Rows that have seen no
    key yet carry ``lse = -inf``; the shift below is guarded so -inf - -inf never makes a NaN."""
    hi = torch.maximum(acc_lse, lse)
    shift = torch.where(torch.isinf(hi), torch.zeros_like(hi), hi)
    w_acc = torch.exp(acc_lse - shift)
    w_new = torch.exp(lse - shift)
    total = w_acc + w_new
    safe_total = total.clamp_min(torch.finfo(total.dtype).tiny)
    if acc_out.dtype in (torch.float32, torch.float64):
        acc_out.mul_((w_acc / safe_total).unsqueeze(-1))
        acc_out.add_(out.to(acc_out.dtype) * (w_new / safe_total).unsqueeze(-1))
    else:  # an output kept in the inputs' dtype: computed in float32, rounded once
        acc_out.copy_(acc_out.float() * (w_acc / safe_total).unsqueeze(-1)
                      + out.float() * (w_new / safe_total).unsqueeze(-1))
    acc_lse.copy_(shift + torch.log(total))


@dataclass
class Accumulators:
    """A rank's running float32 output and LSE.  ``out`` is left unset until the first block lands
    (``fresh``): a one-call kernel that can write that block whole (FFA, disjoint query ranges) fills
    it without a zero fill or atomics; any other first block zeroes it first (``start_zeroed``)."""

    out: torch.Tensor
    lse: torch.Tensor
    fresh: bool = True

    @classmethod
    def unset(cls, shape, device) -> "Accumulators":
        """``shape``: the output's, ``(b, s, h, d)`` or ``(b, h, s, d)``; the LSE's drops ``d``."""
        return cls(torch.empty(*shape, dtype=torch.float32, device=device),
                   torch.full(tuple(shape[:-1]), float("-inf"), dtype=torch.float32, device=device))

    def start_zeroed(self) -> None:
        if self.fresh:
            self.out.zero_()
            self.fresh = False

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)``; rows no block reached are zero with LSE -inf."""
        self.start_zeroed()
        return self.out, self.lse



class BlockOps:
    """``prepare`` once per block when the strategy is planned; what depends on the tensors' shapes
    (a batch's offsets, a mask's size) is made on the block's first call, which is never timed
    (the gate and the warm-up come first) and kept for the next."""

    def prepare(self, slices: Sequence[AttnSlice], device: torch.device) -> Any:
        return {"slices": tuple(slices), "by_shape": {}}

    @staticmethod
    def shaped(prepared, key, make):
        cache = prepared["by_shape"]
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def forward(self, q, k, v, prepared, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, prepared, scale: float):
        raise NotImplementedError

    # The running accumulators a strategy gets from ``BlockAttention`` and only passes on: float32
    # output and LSE laid out as the tokens are, and a float32 dq.
    def new_accumulators(self, q):
        return Accumulators.unset(q.shape, q.device)

    def new_dq(self, q):
        return torch.zeros(q.shape, dtype=torch.float32, device=q.device)

    def dq_result(self, dq_acc, dtype: torch.dtype) -> torch.Tensor:
        return dq_acc.to(dtype)

    # What a strategy calls: the block added into the running accumulators (``Accumulators``),
    # laid out as the tokens are, ``(b, s, h, d)`` output and ``(b, s, h)`` LSE (float32), and dq
    # ``(b, s, h, d)``.  A kernel that reduces into given buffers itself (FFA) overrides these and
    # saves the merge.  ``sm_margin``: SMs to leave free for a transfer the call overlaps (kernels
    # that take it: FFA).
    def forward_into(self, q, k, v, prepared, scale: float, acc, sm_margin: int = 0) -> None:
        out, lse = self.forward(q, k, v, prepared, scale)
        acc.start_zeroed()
        merge_into(acc.out.transpose(1, 2), acc.lse.transpose(1, 2), out, lse)

    def backward_into(self, dout, q, k, v, out, lse, prepared, scale: float, dq_acc, sm_margin: int = 0):
        dq, dk, dv = self.backward(dout, q, k, v, out, lse, prepared, scale)
        dq_acc += dq.transpose(1, 2)
        return dk, dv
