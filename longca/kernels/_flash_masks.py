"""What FlashAttention-style APIs can express: documents × (causal | sliding window).

``varlen_attn``, flash-attn 2/3/4 and TransformerEngine take a mask as ``cu_seqlens`` (packed
documents, attention never crosses a document) plus a per-document rule: full, causal, or a window
``(left, right)`` with ``j ∈ [i − left, i + right]``.  This table says which of the benchmark's
patterns that is; everything else is ``unsupported`` for these kernels.  The correctness gate
still checks every mapping against the reference, so a wrong entry shows as ``wrong``, not fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..attention import mask_convert
from ..attention.problem import Problem

NO_WINDOW = (-1, -1)


@dataclass(frozen=True)
class FlashMask:
    """A mask as FlashAttention APIs take it."""

    causal: bool
    window: tuple[int, int]       # (left, right); -1 = unbounded
    documents: tuple[int, ...]    # document lengths; one document for non-packed masks

    @property
    def packed(self) -> bool:
        return len(self.documents) > 1

    @property
    def max_document(self) -> int:
        return max(self.documents)


def _whole(problem: Problem) -> tuple[int, ...]:
    return problem.mask.documents or (problem.seqlen,)


def _window(problem: Problem) -> int:
    return int(problem.mask.params["window"])


_RULES: dict[str, Callable[[Problem], FlashMask]] = {
    "full": lambda p: FlashMask(False, NO_WINDOW, (p.seqlen,)),
    "causal": lambda p: FlashMask(True, NO_WINDOW, (p.seqlen,)),
    "sliding_window": lambda p: FlashMask(False, (_window(p), _window(p)), (p.seqlen,)),
    "sliding_window_causal": lambda p: FlashMask(True, (_window(p), 0), (p.seqlen,)),
    "varlen_full": lambda p: FlashMask(False, NO_WINDOW, _whole(p)),
    "varlen_causal": lambda p: FlashMask(True, NO_WINDOW, _whole(p)),
    "varlen_full_long": lambda p: FlashMask(False, NO_WINDOW, _whole(p)),
    "varlen_causal_long": lambda p: FlashMask(True, NO_WINDOW, _whole(p)),
}

SUPPORTED = tuple(_RULES)


def flash_mask(problem: Problem) -> FlashMask | None:
    """The FlashAttention form of ``problem``'s mask, or None when it has none."""
    rule = _RULES.get(problem.mask_name)
    return rule(problem) if rule else None


def unsupported_reason(kernel: str, problem: Problem, *, windows: bool = True) -> str | None:
    fm = flash_mask(problem)
    if fm is None:
        return (f"{kernel} expresses only documents × (full | causal | sliding window): "
                f"{', '.join(SUPPORTED)}; not {problem.mask_name!r}")
    if not windows and fm.window != NO_WINDOW:
        return f"{kernel} in this torch/library version takes no window_size"
    return None


def batch_cu_seqlens(problem: Problem) -> torch.Tensor:
    """``cu_seqlens`` (int32, on ``problem.device``) over the batch flattened to ``batch × seqlen``
    tokens: every sequence has the mask's documents (one document of ``seqlen`` for a mask without
    documents), sequence ``b``'s starting ``b × seqlen`` tokens in."""
    if problem.mask.documents:
        cu = mask_convert.cu_seqlens(problem.mask, problem.device)
    else:
        cu = torch.tensor([0, problem.seqlen], dtype=torch.int32, device=problem.device)
    if problem.batch > 1:
        starts = cu[:-1][None, :] + problem.seqlen * torch.arange(
            problem.batch, device=problem.device, dtype=torch.int32)[:, None]
        cu = torch.cat([starts.flatten(), cu.new_tensor([problem.batch * problem.seqlen])])
    return cu
