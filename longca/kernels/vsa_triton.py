"""VSA's Triton kernel (FastVideo's ``fastvideo-kernel``: ``block_sparse_attn_triton``) on a per-head
block pattern.

Video Sparse Attention computes attention over 64-token tiles, each query tile attending the key
tiles listed for it (``q2k_idx``, ``q2k_num`` per batch, head and query tile).  A
``block_sparse_heads`` pattern goes in as those lists at 64-token granularity (a 128-token block is
its four 64-token tiles, the same attended pairs; so are variable tiles), each KV head's lists repeated for its query
group.  The kernel takes as many key heads as query heads, so K and V are expanded to the query
heads inside the timed call (``kv_expanded: true`` in the row's notes, as ``sdpa_efficient``); its
backward inverts the lists at every call (``k2q``), as the library does.  This is the Triton path
only: the package's ThunderKittens kernel (sm_90a, a CUDA build) is ``vsa_cuda``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

import torch

from ..attention.masks import HeadBlockMask
from ..attention.problem import Problem
from . import register
from ._library import Library
from .base import Kernel

VSA_TILE = 64  # the kernel's tile: query and key tiles of 64 tokens


def tile_lists(mask: HeadBlockMask, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q2k_idx, q2k_num)``: per query head and 64-token query tile, the kept 64-token key tiles
    (in key order, padded with 0 past ``q2k_num``), shaped ``(1, heads_q, tiles)`` + ``(tiles,)``."""
    table = torch.from_numpy(mask.unit_table(VSA_TILE)).repeat_interleave(mask.group, dim=0)
    num = table.sum(-1, dtype=torch.int32)
    order = torch.argsort((~table).to(torch.int8), dim=-1, stable=True)[..., :int(num.max())]
    idx = torch.where(torch.arange(order.shape[-1]) < num.unsqueeze(-1), order, torch.zeros_like(order))
    return idx.to(torch.int32).unsqueeze(0).contiguous().to(device), num.unsqueeze(0).contiguous().to(device)


class VSATriton(Kernel):
    name = "vsa_triton"
    libraries = ("fastvideo-kernel", "triton")
    description = "VSA's Triton block-sparse kernel (fastvideo-kernel), 64-token tiles (block_sparse_heads, variable_block_sparse_heads)"
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)
    head_masks = True
    mask_code = ("attention/masks/head_blocks.py",)
    module = "fastvideo_kernel.block_sparse_attn"

    tile = VSA_TILE

    def __init__(self) -> None:
        self._load = Library(self._import, f"{self.module}.block_sparse_attn_triton",
                             "install fastvideo-kernel (FastVideo's VSA; its Triton kernels need no build)")

    def _import(self):
        return importlib.import_module(self.module).block_sparse_attn_triton

    def available(self) -> str | None:
        return self._load.missing()

    def supports_mask(self, problem: Problem) -> str | None:
        mask = problem.mask
        if not isinstance(mask, HeadBlockMask):
            return f"{self.name} runs per-head block patterns (block_sparse_heads)"
        if mask.granularity() % VSA_TILE:
            return (f"{self.name} attends {VSA_TILE}-token tiles; the pattern's tiles are multiples of "
                    f"{mask.granularity()} tokens")
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        idx, num = tile_lists(problem.mask, problem.device)
        tiles = torch.full((problem.seqlen // VSA_TILE,), VSA_TILE, dtype=torch.int32, device=problem.device)
        return {"q2k_idx": idx, "q2k_num": num, "tile_sizes": tiles, "group": problem.heads_q // problem.heads_kv,
                "kv_expanded": problem.gqa, "max_tiles_per_row": int(idx.shape[-1])}

    def forward(self, q, k, v, prepared):
        group = prepared["group"]
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(group, dim=1)
        v = v.transpose(1, 2).repeat_interleave(group, dim=1)
        batch = q.shape[0]
        idx, num = prepared["q2k_idx"].expand(batch, -1, -1, -1), prepared["q2k_num"].expand(batch, -1, -1)
        out, _lse = self._load()(q, k, v, idx.contiguous(), num.contiguous(), prepared["tile_sizes"])
        return out.transpose(1, 2)

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        try:
            notes["version"] = importlib.metadata.version("fastvideo-kernel")
        except importlib.metadata.PackageNotFoundError:
            notes["version"] = None
        return notes


register(VSATriton())
