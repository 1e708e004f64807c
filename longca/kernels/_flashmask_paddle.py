"""FlashMask through PaddlePaddle (``paddle.nn.functional.flashmask_attention``, Paddle GPU >= 3.0):
the ``flashmask`` adapter's fallback where FlashMask's PyTorch binding is not installed.

Tensors cross between torch and Paddle through DLPack without copies, in the layout both use
(``[batch, tokens, heads, head_dim]``, GQA native); a ``torch.autograd.Function`` runs Paddle's
forward and, for a backward cell, ``paddle.grad`` on it, so the cell times it like any other kernel.
Paddle issues its kernels on its own CUDA stream: the call orders that stream after torch's current
one and torch's after it with events, so CUDA events on torch's stream bracket Paddle's work, and it
refuses CUDA-graph capture (which would record none of it): the cell is timed eagerly and says why.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ._library import Unusable

MIN_VERSION = (3, 0)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def load(module: str = "paddle"):
    """Paddle, or ``Unusable`` saying why it cannot serve FlashMask."""
    try:
        paddle = importlib.import_module(module)
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


def to_paddle(paddle, tensor: torch.Tensor):
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


class FlashMaskCall(torch.autograd.Function):
    """``FlashMaskCall.apply(q, k, v, paddle, prepared)``: Paddle's forward, and ``paddle.grad`` as
    the backward (``prepared["paddle_indices"]``, ``prepared["causal"]``)."""

    @staticmethod
    def forward(ctx, q, k, v, paddle, prepared: dict[str, Any]):
        with _OnPaddlesStream(paddle, q.device):
            qp, kp, vp = (to_paddle(paddle, t.detach().contiguous()) for t in (q, k, v))
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
            grads = paddle.grad([out], [qp, kp, vp], grad_outputs=[to_paddle(paddle, grad_out.contiguous())],
                                retain_graph=True)
            dq, dk, dv = (_to_torch(paddle, g) for g in grads)
        return dq, dk, dv, None, None
