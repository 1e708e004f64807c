"""FlexAttention on a per-head block pattern: a ``BlockMask`` made directly from the kept tiles.

The sparse study's masks (``block_sparse_heads``, ``variable_block_sparse_heads``) differ per KV
head, so the ``BlockMask`` has one row of kept key tiles per query head and tile (each KV head's
table repeated for its query group: FlexAttention indexes the mask by query head).  Every kept tile
is whole, so the tiles go in as *full* blocks on a GPU (no ``mask_mod`` is evaluated inside them)
and the ``BlockMask``'s tile is the pattern's own block (variable tiles: their common unit,
``granularity()``).  FlexAttention's default Triton tile on a GPU is 128 queries: for a 64-token
block the forward is asked for 64 × 64 tiles (``BLOCK_M``/``BLOCK_N``), which the block must be a
multiple of; the backward has no such option, and where none of its tile configurations divides
the block the cell is ``unsupported`` with torch's reason.  The ``BlockMask`` is made and the
function compiled (forward, and backward for a backward cell) in ``prepare``, untimed.
"""

from __future__ import annotations

from typing import Any

import torch

from ..attention.masks import HeadBlockMask
from ..attention.problem import Problem
from . import register
from .base import Unsupported
from .flex import FlexAttention, _chain, _first_lines, no_silent_fallback

DEFAULT_TILE = 128  # FlexAttention's forward query tile; smaller blocks ask for their own size
# How Inductor says none of its backward tile configurations divides the BlockMask's tile (torch
# 2.11 on sm_90, head dim 128: one configuration, 64 x 128, so 64-token blocks have none).
NO_TILE_CONFIG = "NoValidChoicesError"


def kept_tile_indices(mask: HeadBlockMask, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(counts, indices)`` of the kept key tiles per (query head, query tile), as
    ``BlockMask.from_kv_blocks`` takes them: ``(1, heads_q, tiles)`` and ``(1, heads_q, tiles,
    tiles)`` int32, each row's kept tiles first in key order."""
    table = torch.from_numpy(mask.unit_table(mask.granularity())).repeat_interleave(mask.group, dim=0)
    counts = table.sum(-1, dtype=torch.int32)
    # A stable sort of "not kept" puts the kept tiles first, in key order.
    indices = torch.argsort((~table).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts.unsqueeze(0).to(device), indices.unsqueeze(0).to(device)


class FlexBlockSparse(FlexAttention):
    name = "flex_block_sparse"
    description = "FlexAttention with a BlockMask of each head's kept tiles (block_sparse_heads, variable_block_sparse_heads)"
    head_masks = True
    mask_code = ("attention/masks/head_blocks.py",)

    def supports_mask(self, problem: Problem) -> str | None:
        if not isinstance(problem.mask, HeadBlockMask):
            return f"{self.name} runs per-head block patterns (block_sparse_heads); other masks: flex"
        return super().supports_mask(problem)

    def _prepared(self, problem: Problem) -> dict[str, Any]:
        from torch.nn.attention.flex_attention import BlockMask

        mask: HeadBlockMask = problem.mask
        tile = mask.granularity()
        counts, indices = kept_tile_indices(mask, problem.device)
        if problem.device.type == "cuda":
            block_mask = BlockMask.from_kv_blocks(torch.zeros_like(counts), indices, counts, indices,
                                                  BLOCK_SIZE=tile)
        else:
            # torch's CPU template does not compile a BlockMask of full blocks only (C++ error
            # "'kv_indices' was not declared", torch 2.13): on a CPU the kept tiles go in as
            # partial blocks with no mask_mod, the same attention.
            block_mask = BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=tile)
        options = None
        if problem.device.type == "cuda" and tile < DEFAULT_TILE:
            options = {"BLOCK_M": tile, "BLOCK_N": tile}
        return {"block_mask": block_mask, "block_size": tile, "tile_density": mask.params["kept_actual"],
                "enable_gqa": problem.gqa, "inference_only": problem.device.type == "cpu",
                "flex_tile_options": options}

    def kernel_options(self, prepared: dict[str, Any]) -> dict[str, Any] | None:
        """The problem's tile options (a block smaller than FlexAttention's default tile asks for its own)."""
        return prepared["flex_tile_options"]

    def prepare(self, problem: Problem) -> dict[str, Any]:
        no_silent_fallback()
        prepared = self._prepared(problem)
        q, k, v, _ = problem.make_inputs(requires_grad=False)
        self.forward(q, k, v, prepared)  # compiles for this shape now (untimed)
        if problem.direction == "bwd" and problem.device.type == "cuda":
            self._compile_backward(problem, prepared)
        return prepared

    def _compile_backward(self, problem: Problem, prepared: dict[str, Any]) -> None:
        """Compile the backward now, so that a tile FlexAttention has no backward for is an
        ``unsupported`` row with torch's reason, not an error in the timing."""
        q, k, v, grad_out = problem.make_inputs(requires_grad=True)
        try:
            torch.autograd.grad(self.forward(q, k, v, prepared), (q, k, v), grad_out)
        except Exception as exc:  # noqa: BLE001 — only the "no tile config" refusal is unsupported
            refusal = next((e for e in _chain(exc) if NO_TILE_CONFIG in str(e)), None)
            if refusal is None:
                raise
            raise Unsupported(f"{self.name}: FlexAttention's backward (torch {torch.__version__}) has no tile "
                              f"configuration for {problem.mask.granularity()}-token blocks on this GPU: "
                              f"{_first_lines(refusal, 1)}") from exc

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        notes["flex_tile_options"] = str(prepared["flex_tile_options"])
        return notes


register(FlexBlockSparse())
