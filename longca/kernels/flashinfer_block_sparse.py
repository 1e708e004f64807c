"""FlashInfer's variable-block-sparse attention (``flashinfer.VariableBlockSparseAttentionWrapper``) on a
per-head block pattern.

The wrapper takes, per KV head, a boolean map of kept blocks ``[heads_kv, row blocks, column
blocks]`` with each block row's and column's size; query head ``h`` reads KV head ``h // group``.
A per-head block pattern holds one table per KV head shared by its query group, so it goes in as
it is, blocks of the pattern's sizes (``variable_block_sparse_heads``: each head's own).  ``plan`` (it synchronises and builds the schedule) runs
in ``prepare``, once per problem; the timed call is ``run``.  FlashInfer lays tensors out head-major
(``q [heads_q, tokens, d]``, ``k``/``v`` ``[heads_kv, tokens, d]``), so the call transposes in and
out (``layout_copies: true`` in the row's notes, as the FFA adapter packs tokens).  One sequence per
call (the wrapper has no batch) and forward only: the library has no backward for it.  On Hopper it
runs the FA3 backend (``backend`` in the notes).
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

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace


class FlashInferBlockSparse(Kernel):
    name = "flashinfer_block_sparse"
    libraries = ("flashinfer-python",)
    description = ("FlashInfer's variable-block-sparse attention (FA3 backend on Hopper), block_sparse_heads and "
                   "variable_block_sparse_heads masks")
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)
    supports_backward = False
    head_masks = True
    mask_code = ("attention/masks/head_blocks.py",)
    module = "flashinfer"

    def __init__(self) -> None:
        self._load = Library(lambda: importlib.import_module(self.module).VariableBlockSparseAttentionWrapper,
                             f"{self.module}.VariableBlockSparseAttentionWrapper",
                             "install flashinfer-python (its kernels compile on first use with nvcc, or come "
                             "prebuilt: scripts/build_kernels.sh)")

    def available(self) -> str | None:
        return self._load.missing()

    def supports_mask(self, problem: Problem) -> str | None:
        if not isinstance(problem.mask, HeadBlockMask):
            return f"{self.name} runs per-head block patterns (block_sparse_heads)"
        if problem.batch != 1:
            return f"{self.name} takes one sequence per call (batch {problem.batch})"
        return None

    @staticmethod
    def backend(device: torch.device) -> str:
        """FA3's kernels on Hopper (sm_90), FA2's elsewhere: what FlashInfer's ``auto`` picks."""
        return "fa3" if torch.cuda.get_device_capability(device)[0] == 9 else "fa2"

    def prepare(self, problem: Problem) -> dict[str, Any]:
        mask: HeadBlockMask = problem.mask
        device = problem.device
        backend = self.backend(device) if device.type == "cuda" else "fa2"
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = self._load()(workspace, backend=backend)
        kept = torch.from_numpy(mask.kept_blocks).to(device)
        sizes = torch.from_numpy(mask.tile_sizes()).to(device=device, dtype=torch.int32)
        wrapper.plan(kept, sizes, sizes, problem.heads_q, problem.heads_kv, problem.head_dim,
                     causal=False, q_data_type=problem.dtype, kv_data_type=problem.dtype)
        return {"wrapper": wrapper, "workspace": workspace, "backend": backend, "layout_copies": True}

    def forward(self, q, k, v, prepared):
        # (1, tokens, heads, d) → FlashInfer's (heads, tokens, d) and back.
        head_major = lambda x: x[0].transpose(0, 1).contiguous()
        out = prepared["wrapper"].run(head_major(q), head_major(k), head_major(v))
        return out.transpose(0, 1).unsqueeze(0)

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        try:
            notes["version"] = importlib.metadata.version("flashinfer-python")
        except importlib.metadata.PackageNotFoundError:
            notes["version"] = None
        return notes


register(FlashInferBlockSparse())
