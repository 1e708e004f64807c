"""One CP block on one rank: its slices computed by a registry kernel, merged by log-sum-exp.

A block goes to the kernel as one call where the kernel can take the whole block
(``longca.cp.fused``: FFA's ranges, a mask tensor on the CPU); otherwise as pieces.  ``Piece``s
are what a kernel takes in one call otherwise: a FULL rectangle, a square causal triangle, or
(where the kernel accepts a mask tensor) a small dense pattern for the diagonal pieces sliding
windows leave.  ``BlockAttention`` runs the pieces of a block through the kernel's
LSE entry point (``Kernel.lse_ops``) and folds each into float32 accumulators with a guarded
log-sum-exp merge (``longca.cp.block_ops``, shared with the whole-block ops); its backward takes the *global* output and LSE, so each block's dq/dk/dv are
exact shares of the full gradient (rows that attend no key at all get zero gradient, never NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .. import kernels
from ..attention.masks import AttnSlice, SliceKind
from .base import Unsupported
from .block_ops import Accumulators, merge_into
from .fused import block_ops

# ``local_kernel: auto``: the first of these the machine has.  FFA first: a CP block of a document
# mask is one FFA call but dozens of per-piece calls for the others.
AUTO_LOCAL_KERNELS = {"cuda": ("ffa", "sdpa_cudnn", "sdpa_flash"), "cpu": ("sdpa_flash", "sdpa_math")}
# ``local_calls``: ``auto`` runs a block as one call where the kernel can (``longca.cp.fused``);
# ``pieces`` makes one call per piece even then (to measure what fusing buys).
LOCAL_CALLS = ("auto", "pieces")


def resolve_local_kernel(name: str, device: torch.device) -> str:
    """``name``, or for ``auto`` the first kernel of ``AUTO_LOCAL_KERNELS`` available on ``device``."""
    if name != "auto":
        return name
    kind = torch.device(device).type
    for candidate in AUTO_LOCAL_KERNELS.get(kind, ()):
        adapter = kernels.get(candidate)
        if not adapter.available() and (adapter.lse_ops(torch.device(device)) is not None
                                        or block_ops(candidate, device) is not None):
            return candidate
    raise Unsupported(f"local_kernel auto: none of {', '.join(AUTO_LOCAL_KERNELS.get(kind, ())) or 'no kernel'} "
                      f"runs on {kind} here")


@dataclass(frozen=True)
class FusedBlock:
    """A block the kernel runs in one call: its slices and what the kernel prepared for them."""

    slices: tuple[AttnSlice, ...]
    prepared: object

    def __bool__(self) -> bool:
        return bool(self.slices)


@dataclass(frozen=True)
class Piece:
    q0: int
    q1: int
    k0: int
    k1: int
    mode: str                            # "full", "causal" (square) or "bias"
    pattern: Optional[AttnSlice] = None  # for "bias": the slice whose dense pattern is the mask

    @property
    def area(self) -> int:
        if self.mode == "full":
            return (self.q1 - self.q0) * (self.k1 - self.k0)
        if self.mode == "causal":
            n = self.q1 - self.q0
            return n * (n + 1) // 2
        return self.pattern.area()


def to_pieces(slices: Sequence[AttnSlice], modes: frozenset[str], kernel: str) -> tuple[Piece, ...]:
    """Split slices into pieces ``modes`` expresses; Unsupported (naming the kind) otherwise."""
    out: list[Piece] = []
    for s in slices:
        if s.kind is SliceKind.FULL:
            out.append(Piece(s.q_start, s.q_end, s.k_start, s.k_end, "full"))
        elif s.kind is SliceKind.CAUSAL and "causal" in modes:
            # Bottom-right causal = a full rectangle of the extra keys + a square triangle; with
            # fewer keys than queries the top rows see nothing.
            if s.lk >= s.lq:
                split = s.k_start + s.lk - s.lq
                if split > s.k_start:
                    out.append(Piece(s.q_start, s.q_end, s.k_start, split, "full"))
                out.append(Piece(s.q_start, s.q_end, split, s.k_end, "causal"))
            else:
                out.append(Piece(s.q_end - s.lk, s.q_end, s.k_start, s.k_end, "causal"))
        elif "bias" in modes:
            out.append(Piece(s.q_start, s.q_end, s.k_start, s.k_end, "bias", s))
        else:
            raise Unsupported(f"local kernel {kernel} takes no mask tensor, and this mask leaves "
                              f"{s.kind.value} pieces in a CP block")
    return tuple(out)


class BlockAttention:
    """A registry kernel's LSE entry point on ``(b, s, h, d)`` tensors with GQA."""

    def __init__(self, kernel: str, device: torch.device, heads_q: int, heads_kv: int, head_dim: int,
                 scale: float | None = None, calls: str = "auto", comm_sm_margin: int = 0):
        if calls not in LOCAL_CALLS:
            raise ValueError(f"local_calls {calls!r} is not one of {', '.join(LOCAL_CALLS)}")
        kernel = resolve_local_kernel(kernel, device)
        adapter = kernels.get(kernel)
        missing = adapter.available()
        if missing:
            raise Unsupported(f"local kernel {kernel}: {missing}")
        self.device = torch.device(device)
        self.fused = block_ops(kernel, self.device) if calls == "auto" else None
        ops = adapter.lse_ops(self.device)
        if ops is None and self.fused is None:
            raise Unsupported(f"local kernel {kernel} exposes no attention-with-LSE entry point on "
                              f"{self.device.type} (CP strategies merge partial blocks by LSE)"
                              + (" and local_calls is pieces" if block_ops(kernel, self.device) else ""))
        self.kernel, self.ops, self.modes = kernel, ops, ops.modes if ops is not None else frozenset()
        self.group = heads_q // heads_kv
        self.scale = head_dim ** -0.5 if scale is None else scale
        if comm_sm_margin < 0:
            raise ValueError(f"comm_sm_margin must be >= 0, got {comm_sm_margin}")
        self.comm_sm_margin = int(comm_sm_margin)

    @property
    def calls(self) -> str:
        """How a block reaches the kernel: ``fused`` (one call) or ``pieces`` (one call per piece)."""
        return "fused" if self.fused is not None else "pieces"

    def pieces(self, slices: Sequence[AttnSlice]):
        """What ``forward``/``backward`` take for a block restricted to ``slices``: a ``FusedBlock``
        or the pieces; falsy when the block attends nothing."""
        if self.fused is not None:
            slices = tuple(s for s in slices if s.area() > 0)
            return FusedBlock(slices, self.fused.prepare(slices, self.device) if slices else None)
        return to_pieces(slices, self.modes, self.kernel)

    # Layout helpers: kernels take (b, h, s, d) with as many KV heads as query heads.
    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)

    def _expand(self, kv: torch.Tensor) -> torch.Tensor:
        kv = kv.transpose(1, 2)
        return kv.repeat_interleave(self.group, dim=1) if self.group > 1 else kv

    def _fold(self, grad: torch.Tensor) -> torch.Tensor:
        """Gradient w.r.t. expanded KV heads → w.r.t. the real ones, back in ``(b, s, h, d)``."""
        if self.group > 1:
            b, h, s, d = grad.shape
            grad = grad.view(b, h // self.group, self.group, s, d).sum(2)
        return grad.transpose(1, 2).contiguous()  # sent over P2P / collectives as is

    def _bias(self, piece: Piece, device, dtype=torch.float32):
        allowed = piece.pattern.dense().to(device)
        return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))

    # Accumulators.  Pieces: ``(b, h, s, d)`` / ``(b, h, s)``, the kernels' layout.  One call per
    # block: laid out as the tokens are, ``(b, s, h, d)`` / ``(b, s, h)``, which FFA reduces into
    # directly.  Strategies only pass them on (new_*, then finish / dq_result).
    def new_accumulators(self, q: torch.Tensor) -> Accumulators:
        if self.fused is not None:
            return self.fused.new_accumulators(q)
        b, s, h, d = q.shape
        return Accumulators.unset((b, h, s, d), q.device)

    def new_dq(self, q: torch.Tensor):
        if self.fused is not None:
            return self.fused.new_dq(q)
        b, s, h, d = q.shape
        return torch.zeros((b, h, s, d), dtype=torch.float32, device=q.device)

    def dq_result(self, dq_acc, dtype: torch.dtype) -> torch.Tensor:
        """The dq accumulator → ``(b, s, h, d)`` in ``dtype``."""
        if self.fused is not None:
            return self.fused.dq_result(dq_acc, dtype)
        return dq_acc.transpose(1, 2).to(dtype)

    def _margin(self, overlapped: bool) -> int:
        return self.comm_sm_margin if overlapped else 0

    def forward(self, q, k, v, pieces: Sequence[Piece], acc, overlapped: bool = False) -> None:
        """Add the block ``q × (k, v)`` restricted to ``pieces`` into ``acc`` (from new_accumulators).
        ``overlapped``: a transfer is in flight meanwhile (the call leaves it ``comm_sm_margin`` SMs)."""
        if not pieces:
            return
        if isinstance(pieces, FusedBlock):
            self.fused.forward_into(q, k, v, pieces.prepared, self.scale, acc, sm_margin=self._margin(overlapped))
            return
        acc.start_zeroed()
        acc_out, acc_lse = acc.out, acc.lse
        qh, kh, vh = self._heads(q), self._expand(k), self._expand(v)
        for p in pieces:
            bias = self._bias(p, q.device) if p.mode == "bias" else None
            out, lse = self.ops.forward(qh[:, :, p.q0:p.q1], kh[:, :, p.k0:p.k1], vh[:, :, p.k0:p.k1],
                                        p.mode == "causal", bias, self.scale)
            merge_into(acc_out[:, :, p.q0:p.q1], acc_lse[:, :, p.q0:p.q1], out, lse)

    def finish(self, acc, dtype: torch.dtype):
        """Accumulators → ``(out (b, s, h, d) in dtype, lse (b, h, s) float32)``."""
        out, lse = acc.result()
        if self.fused is not None:
            return out.to(dtype), lse.transpose(1, 2)
        return out.transpose(1, 2).to(dtype).contiguous(), lse

    @staticmethod
    def backward_lse(lse: torch.Tensor) -> torch.Tensor:
        """The LSE a backward kernel is given: rows with no key get +inf, so exp(s - lse) = 0."""
        return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)

    def backward(self, dout, q, k, v, out, lse_bwd, pieces: Sequence[Piece], dq_acc: torch.Tensor,
                 overlapped: bool = False):
        """This block's dq added into ``dq_acc`` (from ``new_dq``); returns its (dk, dv) in
        float32 ``(b, s, h_kv, d)``, or None when the block attends nothing."""
        if not pieces:
            return None
        if isinstance(pieces, FusedBlock):
            return self.fused.backward_into(dout, q, k, v, out, lse_bwd, pieces.prepared, self.scale, dq_acc,
                                            sm_margin=self._margin(overlapped))
        qh, kh, vh = self._heads(q), self._expand(k), self._expand(v)
        doh, oh = self._heads(dout), self._heads(out)
        b, h, sk, d = kh.shape
        dk = torch.zeros(b, h, sk, d, dtype=torch.float32, device=q.device)
        dv = torch.zeros_like(dk)
        for p in pieces:
            bias = self._bias(p, q.device) if p.mode == "bias" else None
            gq, gk, gv = self.ops.backward(doh[:, :, p.q0:p.q1], qh[:, :, p.q0:p.q1], kh[:, :, p.k0:p.k1],
                                           vh[:, :, p.k0:p.k1], oh[:, :, p.q0:p.q1],
                                           lse_bwd[:, :, p.q0:p.q1].contiguous(), p.mode == "causal", bias,
                                           self.scale)
            dq_acc[:, :, p.q0:p.q1] += gq.float()
            dk[:, :, p.k0:p.k1] += gk.float()
            dv[:, :, p.k0:p.k1] += gv.float()
        return self._fold(dk), self._fold(dv)
