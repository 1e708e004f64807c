"""FlexAttention: one ``torch.compile``d kernel for every mask, driven by a ``BlockMask``.

The ``BlockMask`` is built from the mask's slices (``longca.attention.mask_convert.block_mask``, cached) in
``prepare``, outside the timed region; the compiled function compiles for the problem's shape on the
cell's first call (``min_warmup``), which is never timed.  Tiles the mask does
not touch are skipped by the kernel, so on a ``block_sparse`` mask this *is* block-sparse
FlexAttention, with FLOPs counted on the attended pairs only.

Two kernels share this code:

* ``flex`` — FlexAttention's default backend choice (Triton kernels on CUDA);
* ``flex_flash`` — the same ``BlockMask`` and ``mask_mod`` on FlexAttention's FLASH backend
  (``kernel_options={"BACKEND": "FLASH"}``): Inductor renders the ``mask_mod`` as a CuTe DSL
  function and calls FlashAttention-4's ``_flash_attn_fwd`` / ``_flash_attn_bwd`` with the block
  sparsity.  Asked for FLASH, torch either uses it or raises ("BACKEND='FLASH' but flash attention
  cannot be used: ...", NotImplementedError for what it has not implemented); it never falls back
  to Triton.  ``prepare`` compiles every variant the cell will call and turns such a refusal into
  ``Unsupported`` with torch's message, so the cell is an ``unsupported`` row, not an error.
"""

from __future__ import annotations

import functools
import importlib
import os
import traceback
import typing
from typing import Any, Iterator

import torch

from ..attention import mask_convert
from ..attention.problem import Problem
from . import register
from .base import Kernel, Unsupported

BLOCK_SIZE = 128  # FlexAttention's default tile; the BlockMask's granularity
FLASH_BACKEND = {"BACKEND": "FLASH"}


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
def _compiled(fullgraph: bool = False):
    import torch._functorch.config as functorch_config
    from torch.nn.attention.flex_attention import flex_attention

    # A backward timed repeatedly replays one graph (retain_graph=True); AOTAutograd's buffer
    # donation forbids that, so it is off (it only lets the backward reuse saved tensors' memory).
    functorch_config.donated_buffer = False
    # dynamic=False: one specialised kernel per shape, as a training run would use.
    return torch.compile(flex_attention, dynamic=False, fullgraph=fullgraph)


class FlexAttention(Kernel):
    name = "flex"
    libraries = ("triton",)
    description = "FlexAttention (torch.compile), BlockMask built from the mask's slices"
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    min_warmup = 1  # the first call of a new shape compiles (backward compiles on its first call)
    # flex_attention documents value as (B, Hkv, S, Ev) and its output as (B, Hq, L, Ev); it checks
    # only that q and k agree, and inductor's template has its own V_HEAD_DIM (torch 2.13).  The
    # adapter passes v as it is.  (flex_block_sparse inherits this: the same call.)
    takes_head_dim_v = True
    flex_kernel_options: dict[str, Any] | None = None  # FlexAttention's kernel_options (backend choice)
    fullgraph = False

    def supports_mask(self, problem: Problem) -> str | None:
        if problem.direction == "bwd" and problem.device.type == "cpu":
            return "FlexAttention has no backward on CPU (torch raises NotImplementedError)"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        no_silent_fallback()
        # Nothing is compiled here: the cell's first call does it, untimed (the gate's call, the
        # timing's eager call before capture).  A forward made here on inputs that do not require
        # grad compiled an inference graph that no timed call uses (dynamo guards on requires_grad):
        # one compilation more for every shape, paid in every measuring process.
        return self._prepared(problem)

    def _prepared(self, problem: Problem) -> dict[str, Any]:
        device = problem.device
        block_mask = mask_convert.block_mask(problem.mask, BLOCK_SIZE, device)
        # The tiles holding a pair are the BlockMask's partial and full ones: counted from its row
        # counts, not from a second grid on the host (mask_convert.block_sparsity: seconds at 1M).
        tiles = -(-problem.mask.seqlen_q // BLOCK_SIZE) * -(-problem.mask.seqlen_k // BLOCK_SIZE)
        touched = block_mask.kv_num_blocks.sum() + block_mask.full_kv_num_blocks.sum()
        tile_density = float(touched) / tiles
        return {"block_mask": block_mask, "block_size": BLOCK_SIZE, "tile_density": tile_density,
                "enable_gqa": problem.gqa,
                # FlexAttention refuses inputs that require grad on CPU: there the forward is
                # measured as inference (no autograd graph), and the row says so.
                "inference_only": device.type == "cpu"}

    def forward(self, q, k, v, prepared):
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if prepared["inference_only"]:
            q, k, v = q.detach(), k.detach(), v.detach()
        out = _compiled(self.fullgraph)(q, k, v, block_mask=prepared["block_mask"],
                                        enable_gqa=prepared["enable_gqa"],
                                        kernel_options=self.kernel_options(prepared))
        return out.transpose(1, 2)

    def kernel_options(self, prepared: dict[str, Any]) -> dict[str, Any] | None:
        """FlexAttention's ``kernel_options`` for a call: the class's (the backend choice)."""
        return self.flex_kernel_options


# ---------------------------------------------------------------------------------------------
# FlexAttention on the FLASH backend (FlashAttention-4's CuTe kernels).
# ---------------------------------------------------------------------------------------------

# How torch (2.11: torch/_inductor/kernel/flex/flex_flash_attention.py, flex_attention.py) says the
# FLASH backend cannot take a problem.  NotImplementedError anywhere in the chain counts too (e.g.
# "FLASH backend backward does not support differentiating through logsumexp").
_TORCH_REFUSALS = ("BACKEND='FLASH'", "FLASH backend", "CuteDSL template failed",
                   "flash attention cannot be used")
# FlashAttention-4's own input checks (asserts / ValueErrors in flash_attn/cute/interface.py, e.g.
# dtype, head dim per architecture, block-size constraints) are the library refusing the problem.
_FA4_SOURCE = os.path.join("flash_attn", "cute") + os.sep


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: Dynamo/Inductor keep the original as ``inner_exception`` (raised
    ``from None``), others as ``__cause__``.  Not ``__context__``: an exception merely raised while
    handling another (e.g. a NotImplementedError torch caught itself) says nothing about this one."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [getattr(e, "inner_exception", None), e.__cause__]


def _first_lines(e: BaseException, n: int = 3) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return " ".join(line.strip() for line in text.splitlines()[:n] if line.strip())


def _raised_in_fa4(e: BaseException) -> bool:
    return any(_FA4_SOURCE in frame.filename for frame in traceback.extract_tb(e.__traceback__))


def flash_refusal(exc: BaseException) -> str | None:
    """torch's (or FA4's) reason when ``exc`` is the FLASH backend refusing a problem, else None
    (a genuine failure, reported as an error)."""
    for e in _chain(exc):
        if isinstance(e, NotImplementedError) or any(marker in str(e) for marker in _TORCH_REFUSALS):
            return _first_lines(e)
    for e in _chain(exc):
        if isinstance(e, (AssertionError, ValueError)) and _raised_in_fa4(e):
            return f"FlashAttention-4 refused it: {_first_lines(e)}"
    return None


@functools.lru_cache(maxsize=None)
def flash_backend_missing() -> str | None:
    """None when FlexAttention's FLASH backend can run here, else why not."""
    try:
        from torch.nn.attention import flex_attention as fa
    except Exception as exc:  # noqa: BLE001
        return f"this torch has no FlexAttention ({type(exc).__name__}: {exc})"
    # The literal torch validates kernel_options["BACKEND"] against (torch 2.11: AUTO, TRITON,
    # FLASH, TRITON_DECODE).
    if "FLASH" not in typing.get_args(getattr(fa, "_Backend", None)):
        return f"torch {torch.__version__}'s FlexAttention has no FLASH backend (kernel_options BACKEND)"
    try:  # torch itself only checks find_spec; importing proves the CuTe DSL stack loads
        importlib.import_module("flash_attn.cute")
    except Exception as exc:  # noqa: BLE001 — ImportError, or a broken CUTLASS DSL install
        return (f"flash_attn.cute is not importable ({type(exc).__name__}: {exc}); FlexAttention's FLASH "
                "backend runs FlashAttention-4 (pip install flash-attn-4)")
    return None


class FlexFlash(FlexAttention):
    name = "flex_flash"
    libraries = ("flash-attn-4",)
    description = "FlexAttention on its FLASH backend (FlashAttention-4 CuTe kernels), BlockMask from the slices"
    # CUDA only: on CPU torch lowers flex_attention to its C++ template whatever BACKEND says.
    devices = ("cuda",)
    # dtypes: flex's.  FA4 takes 16-bit inputs only; a float32 problem is refused by FA4's own check
    # ("inputs must be float16, bfloat16, ...") in prepare, so the row carries the library's reason.
    flex_kernel_options = FLASH_BACKEND
    # FlashAttention-4's CuTe kernels take a value head dim of their own only in some builds and
    # architectures (its (192, 128) path): not claimed until a GPU run shows this one does.
    takes_head_dim_v = False
    # A graph break would run flex_attention eagerly (the unfused math path): never, for this kernel.
    fullgraph = True

    def available(self) -> str | None:
        return flash_backend_missing()

    def supports_mask(self, problem: Problem) -> str | None:
        return None  # every mask: the BlockMask + mask_mod; what FLASH refuses, prepare reports

    def prepare(self, problem: Problem) -> dict[str, Any]:
        no_silent_fallback()  # past dynamo's recompile limit: an error, never an eager run
        try:
            return self._compile_everything(problem)
        except Unsupported:
            raise
        except Exception as exc:  # noqa: BLE001 — classified: a refusal is unsupported, the rest an error
            reason = flash_refusal(exc)
            if reason is None:
                raise
            raise Unsupported(f"{self.name}: torch's FlexAttention FLASH backend refused this problem: "
                              f"{reason}") from exc

    def _compile_everything(self, problem: Problem) -> dict[str, Any]:
        """Every variant the cell calls, compiled now so that a refusal happens here (untimed):
        the inference forward (the forward gate), the training forward (what a forward cell times,
        inputs requiring grad) and, for a backward cell, the backward."""
        prepared = {**self._prepared(problem), "flex_backend": "FLASH"}
        q, k, v, grad_out = problem.make_inputs(requires_grad=False)
        self.forward(q, k, v, prepared)
        q, k, v, grad_out = problem.make_inputs(requires_grad=True)
        out = self.forward(q, k, v, prepared)
        if problem.direction == "bwd":
            torch.autograd.grad(out, (q, k, v), grad_out)
        return prepared


register(FlexAttention())
register(FlexFlash())
