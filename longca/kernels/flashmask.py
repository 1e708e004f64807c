"""FlashMask V3, the paper's seventh dense kernel: through its PyTorch binding where it is installed,
else through PaddlePaddle.

The mask goes in as FlashMask's column-wise row indices (``longca.attention.flashmask``: exact for
every mask whose columns each leave at most one masked run per triangle, all 14 patterns), built in
``prepare``: ``startend_row_indices [batch, 1, seqlen_k, 1|2|4]`` int32 (one head of indices: every
LongCA mask is the same for all heads, and FlashMask reads head ``h`` of the indices for query head
``h * n_index_heads / heads_q``) with the ``causal`` flag they go with.  FlashMask's ``window_size``
is not used: the binding turns it into these same indices and refuses it beside them, so sliding
windows go in as indices like every other mask.

* The PyTorch binding (PaddlePaddle/flash-attention's ``flashmask_attention_v3`` built with
  ``setup_torch.py``: package ``flashmask``, extension ``flashmask._C`` registering
  ``torch.ops.flashmask.fwd/bwd``; ``scripts/build_kernels.sh OUT flashmask``):
  ``flashmask.flashmask_attention(q, k, v, startend_row_indices, causal=...)``, one call per cell on
  torch's stream, backward through its ``torch.autograd.Function``, GQA native (``heads_q`` a
  multiple of the key heads).  Its builds are bf16 only (upstream's setup_torch.py compiles no fp16).
* Else Paddle's ``flashmask_attention`` (GPU build >= 3.0), as before: ``_flashmask_paddle``.

Neither installed: the rows are ``unsupported`` and name what each needs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..attention import mask_convert
from ..attention.flashmask import FlashMaskIndices, NotRepresentable, to_flashmask
from ..attention.masks import AttnMask
from ..attention.problem import Problem
from . import _flashmask_paddle, register
from ._library import Library, Unusable
from .base import Kernel

# Conversions kept: a cell asks for its mask's in `supports` and again in `prepare` (and its gate's
# in between); a Python pass over every key column, ~0.5 s at 128K tokens.
KEPT_CONVERSIONS = 4
BINDING_DTYPES = (torch.bfloat16,)


@dataclass(frozen=True)
class _Backend:
    """What serves the calls: ``"torch"`` (the binding's ``flashmask_attention``) or ``"paddle"``."""

    kind: str
    library: Any
    dtypes: tuple[torch.dtype, ...]
    version: str | None


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class FlashMask(Kernel):
    name = "flashmask"
    libraries = ("flashmask", "paddlepaddle-gpu")
    description = ("FlashMask V3 (its PyTorch binding flashmask._C, else PaddlePaddle's flashmask_attention), "
                   "masks as column-wise row indices")
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)
    mask_code = ("attention/flashmask.py", "kernels/_flashmask_paddle.py")
    binding = "flashmask"
    module = "paddle"

    def __init__(self) -> None:
        self._load = Library(self._import)
        self._converted: OrderedDict = OrderedDict()

    def _import(self) -> _Backend:
        try:
            binding = importlib.import_module(self.binding)
            call: Callable = binding.flashmask_attention
            return _Backend("torch", call, BINDING_DTYPES, _distribution_version("flashmask"))
        except Exception as exc:  # noqa: BLE001 — ImportError, a missing name, an extension that does not load
            without_binding = (f"FlashMask's PyTorch binding is not importable ({type(exc).__name__}: {exc}; "
                               "build it with scripts/build_kernels.sh OUT_DIR flashmask)")
        try:
            paddle = _flashmask_paddle.load(self.module)
        except Unusable as exc:
            raise Unusable(f"{without_binding}, and {exc}") from exc
        return _Backend("paddle", paddle, self.dtypes, str(getattr(paddle, "__version__", None)))

    def available(self) -> str | None:
        return self._load.missing()

    def _indices(self, mask: AttnMask) -> FlashMaskIndices:
        key = mask_convert.mask_key(mask)
        if key not in self._converted:
            self._converted[key] = to_flashmask(mask)
            if len(self._converted) > KEPT_CONVERSIONS:
                self._converted.popitem(last=False)
        return self._converted[key]

    def supports(self, problem: Problem) -> str | None:
        reason = super().supports(problem)
        if reason is None and problem.dtype not in self._load().dtypes:
            return (f"{self.name}: FlashMask's PyTorch binding is built for bfloat16 only (setup_torch.py compiles "
                    f"no fp16 kernels), not {str(problem.dtype).removeprefix('torch.')}")
        return reason

    def supports_mask(self, problem: Problem) -> str | None:
        try:
            self._indices(problem.mask)
        except NotRepresentable as exc:
            return f"{self.name}: {exc}"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        backend = self._load()
        fm = self._indices(problem.mask)
        # [batch, 1, seqlen_k, n]: one head of indices for all heads; the binding asserts the batch.
        indices = torch.from_numpy(fm.indices).to(problem.device)[None, None].expand(problem.batch, 1, -1, -1)
        prepared = {"causal": fm.causal, "indices_per_column": int(fm.indices.shape[1]), "layout_copies": False,
                    "backend": backend.kind}
        if backend.kind == "torch":
            prepared["indices"] = indices.contiguous()
        else:
            prepared["paddle_indices"] = _flashmask_paddle.to_paddle(backend.library, indices.contiguous())
        return prepared

    def forward(self, q, k, v, prepared):
        backend = self._load()
        if backend.kind == "torch":
            return backend.library(q, k, v, prepared["indices"], causal=prepared["causal"])
        return _flashmask_paddle.FlashMaskCall.apply(q, k, v, backend.library, prepared)

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        notes["version"] = self._load().version
        return notes


register(FlashMask())
