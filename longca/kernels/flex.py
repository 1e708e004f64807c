"""FlexAttention: one ``torch.compile``d kernel for every mask, driven by a ``BlockMask``.

The ``BlockMask`` is built from the mask's slices (``longca.mask_convert.block_mask``, cached) in
``prepare``, outside the timed region, and the compiled function is warmed on the problem's shape
there too, so neither compilation nor block-mask construction is ever timed.  Tiles the mask does
not touch are skipped by the kernel, so on a ``block_sparse`` mask this *is* block-sparse
FlexAttention, with FLOPs counted on the attended pairs only.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .. import mask_convert
from ..problem import Problem
from . import register
from .base import Kernel

BLOCK_SIZE = 128  # FlexAttention's default tile; the BlockMask's granularity


# torch.compile specialises flex_attention per shape and per mask structure (the mask_mod's closure),
# and past dynamo's recompile limit (8 by default) it silently runs the function *eagerly*, which
# materialises the (heads x L x L) fp32 scores: in one long-lived process on an H200 every flex cell
# at 16K and 32K failed with "CUDA out of memory. Tried to allocate 64.00 GiB" (256 GiB at 32K) after
# 1K-8K had used up the limit.  A resident measuring process meets every shape of the grid, so the
# limit is raised far above any grid, and reaching it is an error (an `error` row), never a fallback.
RECOMPILE_LIMIT = 4096


@functools.lru_cache(maxsize=None)
def no_silent_fallback() -> None:
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 16 * RECOMPILE_LIMIT)
    dynamo_config.fail_on_recompile_limit_hit = True


@functools.lru_cache(maxsize=None)
def _compiled():
    import torch._functorch.config as functorch_config
    from torch.nn.attention.flex_attention import flex_attention

    # A backward timed repeatedly replays one graph (retain_graph=True); AOTAutograd's buffer
    # donation forbids that, so it is off (it only lets the backward reuse saved tensors' memory).
    functorch_config.donated_buffer = False
    # dynamic=False: one specialised kernel per shape, as a training run would use.
    return torch.compile(flex_attention, dynamic=False)


class FlexAttention(Kernel):
    name = "flex"
    description = "FlexAttention (torch.compile), BlockMask built from the mask's slices"
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    min_warmup = 1  # the first call of a new shape compiles (backward compiles on its first call)

    def supports_mask(self, problem: Problem) -> str | None:
        if problem.direction == "bwd" and problem.device.type == "cpu":
            return "FlexAttention has no backward on CPU (torch raises NotImplementedError)"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        no_silent_fallback()
        device = problem.device
        # create_block_mask evaluates mask_mod on every pair: compiled on GPU, eager at CPU sizes.
        block_mask = mask_convert.block_mask(problem.mask, BLOCK_SIZE, device, compile=device.type == "cuda")
        _, tile_density = mask_convert.block_sparsity(problem.mask, BLOCK_SIZE, BLOCK_SIZE)
        prepared = {"block_mask": block_mask, "block_size": BLOCK_SIZE, "tile_density": tile_density,
                    "enable_gqa": problem.gqa,
                    # FlexAttention refuses inputs that require grad on CPU: there the forward is
                    # measured as inference (no autograd graph), and the row says so.
                    "inference_only": device.type == "cpu"}
        # Compile for this exact shape and memory layout now (untimed).
        q, k, v, _ = problem.make_inputs(requires_grad=False)
        self.forward(q, k, v, prepared)
        return prepared

    def forward(self, q, k, v, prepared):
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if prepared["inference_only"]:
            q, k, v = q.detach(), k.detach(), v.detach()
        out = _compiled()(q, k, v, block_mask=prepared["block_mask"], enable_gqa=prepared["enable_gqa"])
        return out.transpose(1, 2)


register(FlexAttention())
