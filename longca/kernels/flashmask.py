"""FlashMask (PaddlePaddle's ``paddle.nn.functional.flashmask_attention``), the paper's seventh dense kernel.

The mask goes in as FlashMask's column-wise row indices (``longca.attention.flashmask``: exact for
every mask whose columns each leave at most one masked run per triangle, all 14 patterns), built in
``prepare``.  Tensors cross between torch and Paddle through DLPack without copies, in the layout
both use (``[batch, tokens, heads, head_dim]``, GQA native); a ``torch.autograd.Function`` runs
Paddle's forward and, for a backward cell, ``paddle.grad`` on it, so the cell times it like any
other kernel.  Paddle issues its kernels on its own CUDA stream: the call orders that stream after
torch's current one and torch's after it with events, so CUDA events on torch's stream bracket
Paddle's work, and it refuses CUDA-graph capture (which would record none of it): the cell is timed
eagerly and says why.  It runs where a Paddle GPU build with ``flashmask_attention`` (3.0 or later)
is installed; elsewhere its rows are ``unsupported`` and name what is missing.
"""

from __future__ import annotations

import importlib
from collections import OrderedDict
from typing import Any

import torch

from ..attention import mask_convert
from ..attention.flashmask import FlashMaskIndices, NotRepresentable, to_flashmask
from ..attention.masks import AttnMask
from ..attention.problem import Problem
from . import register
from ._library import Library, Unusable
from .base import Kernel

MIN_VERSION = (3, 0)
# Conversions kept: a cell asks for its mask's in `supports` and again in `prepare` (and its gate's
# in between); a Python pass over every key column, ~0.5 s at 128K tokens.
KEPT_CONVERSIONS = 4


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class FlashMask(Kernel):
    name = "flashmask"
    libraries = ("paddlepaddle-gpu",)
    description = "FlashMask (PaddlePaddle flashmask_attention), masks as column-wise row indices"
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)
    mask_code = ("attention/flashmask.py",)
    module = "paddle"

    def __init__(self) -> None:
        self._load = Library(self._import)
        self._converted: OrderedDict = OrderedDict()

    def _import(self):
        try:
            paddle = importlib.import_module(self.module)
        except Exception as exc:  # noqa: BLE001 — ImportError or a broken install
            raise Unusable(f"PaddlePaddle is not installed ({type(exc).__name__}: {exc}): FlashMask needs a Paddle GPU "
                           f"build >= {'.'.join(map(str, MIN_VERSION))} (paddlepaddle-gpu from PaddlePaddle's own "
                           "index; PyPI's paddlepaddle-gpu is 2.6.2, without flashmask_attention)") from exc
        version = str(getattr(paddle, "__version__", "0"))
        if _version(version) < MIN_VERSION:
            raise Unusable(f"PaddlePaddle {version} is installed; FlashMask's flashmask_attention needs a GPU "
                           f"build >= {'.'.join(map(str, MIN_VERSION))}")
        if not paddle.is_compiled_with_cuda():
            raise Unusable(f"PaddlePaddle {version} is a CPU build; FlashMask needs its GPU build")
        if not hasattr(paddle.nn.functional, "flashmask_attention"):
            raise Unusable(f"PaddlePaddle {version} has no paddle.nn.functional.flashmask_attention")
        return paddle

    def available(self) -> str | None:
        return self._load.missing()

    def _indices(self, mask: AttnMask) -> FlashMaskIndices:
        key = mask_convert.mask_key(mask)
        if key not in self._converted:
            self._converted[key] = to_flashmask(mask)
            if len(self._converted) > KEPT_CONVERSIONS:
                self._converted.popitem(last=False)
        return self._converted[key]

    def supports_mask(self, problem: Problem) -> str | None:
        try:
            self._indices(problem.mask)
        except NotRepresentable as exc:
            return f"{self.name}: {exc}"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        paddle = self._load()
        fm = self._indices(problem.mask)
        indices = torch.from_numpy(fm.indices).to(problem.device)[None, None].expand(problem.batch, 1, -1, -1)
        return {"paddle_indices": _to_paddle(paddle, indices.contiguous()), "causal": fm.causal,
                "indices_per_column": int(fm.indices.shape[1]), "layout_copies": False}

    def forward(self, q, k, v, prepared):
        return _FlashMaskCall.apply(q, k, v, self._load(), prepared)

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        notes["version"] = str(getattr(self._load(), "__version__", None))
        return notes


def _to_paddle(paddle, tensor: torch.Tensor):
    return paddle.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(tensor))


def _to_torch(paddle, tensor) -> torch.Tensor:
    return torch.utils.dlpack.from_dlpack(paddle.utils.dlpack.to_dlpack(tensor))


class _OnPaddlesStream:
    """Paddle's work ordered between torch's: Paddle's stream waits for torch's current one on
    entry, torch's waits for Paddle's on exit (CUDA only)."""

    def __init__(self, paddle, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("flashmask runs on Paddle's CUDA stream, which a torch CUDA graph cannot capture")
            self.torch_stream = torch.cuda.current_stream(device)
            self.paddle_stream = torch.cuda.ExternalStream(paddle.device.current_stream().cuda_stream, device=device)

    def __enter__(self):
        if self.cuda:
            self.paddle_stream.wait_stream(self.torch_stream)
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.torch_stream.wait_stream(self.paddle_stream)
        return False


class _FlashMaskCall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, paddle, prepared):
        with _OnPaddlesStream(paddle, q.device):
            qp, kp, vp = (_to_paddle(paddle, t.detach().contiguous()) for t in (q, k, v))
            for t in (qp, kp, vp):
                t.stop_gradient = False
            out = paddle.nn.functional.flashmask_attention(
                qp, kp, vp, startend_row_indices=prepared["paddle_indices"], causal=prepared["causal"])
            result = _to_torch(paddle, out)
        ctx.paddle, ctx.saved = paddle, (qp, kp, vp, out)
        return result

    @staticmethod
    def backward(ctx, grad_out):
        paddle = ctx.paddle
        qp, kp, vp, out = ctx.saved
        with _OnPaddlesStream(paddle, grad_out.device):
            grads = paddle.grad([out], [qp, kp, vp], grad_outputs=[_to_paddle(paddle, grad_out.contiguous())],
                                retain_graph=True)
            dq, dk, dv = (_to_torch(paddle, g) for g in grads)
        return dq, dk, dv, None, None


register(FlashMask())
