"""MagiAttention's flexible flash attention, FFA (``magi_attention.functional.flex_flash_attn_func``;
optional: github.com/SandAI-org/MagiAttention, Hopper).

FFA takes a mask as a list of (query range, key range, type) triples, the type one of full, causal
(bottom-right aligned), inverse causal (top-left aligned) and bi-causal (their intersection): the
four kinds of LongCA's slices (``longca.attention.masks.slices``), aligned the same way.  So every
mask passes one to one, each slice as a range pair with its kind's type, and FFA runs the mask's
exact structure whatever the pattern.  Tensors are packed tokens ``(tokens, heads, head_dim)`` with
GQA native; a batch of sequences is the ranges repeated at each sequence's offset.  Ranges may
overlap in queries (a row's keys split over slices): FFA reduces such rows atomically, its default.
FFA compiles each kernel variant at its first call (JIT), outside the timed calls: the warm-up
and the memory part's unmeasured first call make it.  A missing package makes cells
``unsupported`` with the import error.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

import torch

from ..attention.masks.slices import AttnMask, SliceKind
from ..attention.problem import Problem
from . import register
from ._library import Library
from .base import Kernel

# FFA's attn_type_map values (flex_flash_attn_func's docstring).
FFA_TYPE = {SliceKind.FULL: 0, SliceKind.CAUSAL: 1, SliceKind.INV_CAUSAL: 2, SliceKind.BI_CAUSAL: 3}


def ffa_ranges(mask: AttnMask, batch: int = 1) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """``(q_ranges, k_ranges, attn_type_map)`` of ``mask`` for ``batch`` packed sequences: one
    triple per slice that attends anything, sequence ``b``'s offset by ``b × seqlen``."""
    q_ranges, k_ranges, types = [], [], []
    for b in range(batch):
        q_off, k_off = b * mask.seqlen_q, b * mask.seqlen_k
        for s in mask.slices:
            if s.area() == 0:
                continue
            q_ranges.append([q_off + s.q_start, q_off + s.q_end])
            k_ranges.append([k_off + s.k_start, k_off + s.k_end])
            types.append(FFA_TYPE[s.kind])
    return q_ranges, k_ranges, types


class MagiFFA(Kernel):
    name = "ffa"
    libraries = ("magi-attention",)
    description = "MagiAttention's flexible flash attention (FFA), ranges with a type each"
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)
    module = "magi_attention.functional"
    distribution = "magi-attention (MagiAttention, github.com/SandAI-org/MagiAttention)"

    def __init__(self) -> None:
        self._load = Library(lambda: importlib.import_module(self.module).flex_flash_attn_func,
                             f"{self.module}.flex_flash_attn_func", f"install {self.distribution}")

    def available(self) -> str | None:
        return self._load.missing()

    def prepare(self, problem: Problem) -> dict[str, Any]:
        q_ranges, k_ranges, types = ffa_ranges(problem.mask, problem.batch)
        as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=problem.device)  # noqa: E731
        return {"q_ranges": as_tensor(q_ranges), "k_ranges": as_tensor(k_ranges),
                "attn_type_map": as_tensor(types), "ranges": len(types)}

    def forward(self, q, k, v, prepared):
        b, s, h, d = q.shape
        out, _meta = self._load()(q.reshape(b * s, h, d), k.reshape(b * s, -1, d), v.reshape(b * s, -1, d),
                                  q_ranges=prepared["q_ranges"], k_ranges=prepared["k_ranges"],
                                  attn_type_map=prepared["attn_type_map"])
        return out.reshape(b, s, h, d)

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        try:
            notes["version"] = importlib.metadata.version("magi_attention")
        except importlib.metadata.PackageNotFoundError:
            notes["version"] = None
        return notes


register(MagiFFA())
