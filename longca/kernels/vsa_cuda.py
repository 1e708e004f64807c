"""VSA's CUDA kernel (FastVideo's ``fastvideo-kernel``: ThunderKittens' ``block_sparse_h100.cu``, sm_90a)
on a per-head block pattern, beside its Triton kernel (``vsa_triton``).

The same inputs as ``vsa_triton`` (``tile_lists``: per query head and 64-token query tile, the kept
64-token key tiles), through the library's own autograd op ``block_sparse_attn_sm90``
(``fastvideo_kernel.block_sparse_attn``), which calls ``fastvideo_kernel._C.fastvideo_kernel_ops``'s
``block_sparse_fwd`` / ``block_sparse_bwd``.  Those exist only in a build with the ThunderKittens
kernels (PyPI's source distribution lacks ThunderKittens: ``scripts/build_kernels.sh OUT vsa_cuda``).

What the kernel takes, from its C++ checks: bf16, head dim 64 or 128, one sequence (``batch == 1``),
fewer key heads than query heads in the forward (``kv_head = q_head / group``).  Its backward
requires the inverted lists (``k2q``, one per query head, as the library builds them) to have as many
heads as K and V, so a backward cell with GQA expands K and V to the query heads inside the timed call
(``kv_expanded: true`` in the row's notes, as ``vsa_triton`` always does); the forward stays native.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ..attention.problem import Problem
from . import register
from ._library import Unusable
from .vsa_triton import VSATriton, tile_lists

HEAD_DIMS = (64, 128)  # the kernel's instantiations (block_sparse_h100.cu)
EXTENSION = "fastvideo_kernel._C.fastvideo_kernel_ops"


class VSACuda(VSATriton):
    name = "vsa_cuda"
    libraries = ("fastvideo-kernel", "triton")  # the backward inverts the lists with a Triton kernel
    description = ("VSA's CUDA block-sparse kernel (fastvideo-kernel, ThunderKittens, sm_90a), 64-token tiles "
                   "(block_sparse_heads, variable_block_sparse_heads)")
    dtypes = (torch.bfloat16,)

    def _import(self):
        try:
            ops = importlib.import_module(EXTENSION)
        except Exception as exc:  # noqa: BLE001 — ImportError, or the extension does not load
            raise Unusable(f"{EXTENSION} is not importable ({type(exc).__name__}: {exc}); VSA's CUDA kernel "
                           "needs fastvideo-kernel built with its ThunderKittens kernels (PyPI's source "
                           "distribution has no ThunderKittens: scripts/build_kernels.sh OUT_DIR vsa_cuda)") from exc
        missing = [name for name in ("block_sparse_fwd", "block_sparse_bwd") if not hasattr(ops, name)]
        if missing:
            raise Unusable(f"{EXTENSION} has no {', '.join(missing)}: fastvideo-kernel was built without its "
                           "ThunderKittens (sm_90a) kernels")
        return importlib.import_module(self.module).block_sparse_attn_sm90

    def supports_mask(self, problem: Problem) -> str | None:
        pattern = super().supports_mask(problem)
        if pattern:
            return pattern
        if problem.head_dim not in HEAD_DIMS:
            return f"{self.name} has head dims {', '.join(map(str, HEAD_DIMS))}, not {problem.head_dim}"
        if problem.batch != 1:
            return f"{self.name} takes one sequence (the library: \"please set batch to 1\"), not {problem.batch}"
        if problem.device.type == "cuda" and torch.cuda.get_device_capability(problem.device) != (9, 0):
            major, minor = torch.cuda.get_device_capability(problem.device)
            return f"{self.name} is built for sm_90a (H100/H200), not sm_{major}{minor}"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        idx, num = tile_lists(problem.mask, problem.device)
        tiles = torch.full((problem.seqlen // self.tile,), self.tile, dtype=torch.int32, device=problem.device)
        expand = problem.gqa and problem.direction == "bwd"
        return {"q2k_idx": idx, "q2k_num": num, "tile_sizes": tiles,
                "group": problem.heads_q // problem.heads_kv if expand else 1,
                "kv_expanded": expand, "max_tiles_per_row": int(idx.shape[-1])}

    def forward(self, q, k, v, prepared):
        group = prepared["group"]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out, _lse = self._load()(q, k, v, prepared["q2k_idx"], prepared["q2k_num"], prepared["tile_sizes"])
        return out.transpose(1, 2)


register(VSACuda())
