"""FlashAttention 2, 3 and 4 from their own packages (optional extras).

* FlashAttention-2: ``flash_attn.flash_attn_func`` / ``flash_attn_varlen_func``;
* FlashAttention-3 (Hopper): ``flash_attn_interface`` from flash-attention's ``hopper/`` build;
* FlashAttention-4 (CuTe DSL): ``flash_attn.cute``.

All three take ``(batch, seqlen, heads, head_dim)`` (packed ``(tokens, heads, head_dim)`` for the
varlen entry point), GQA natively, and a mask as documents × causal × window (``_flash_masks``).
The releases differ in keyword names (``window_size=(l, r)`` vs ``window_size_left/right``) and in
whether the LSE is returned too, so calls are built from the function's signature rather than
pinned to one release.  A missing package makes the kernel ``unsupported`` with the import error.

FlashAttention-2 and -4 both install under the ``flash_attn`` import name (FA4 as the ``cute``
subpackage), so ``import flash_attn`` succeeding says nothing about FA2: each adapter is available
only when the entry point it calls resolves (and, for FA2, its CUDA extension imports).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

from .. import mask_convert
from ..problem import Problem
from . import register
from ._flash_masks import NO_WINDOW, flash_mask, unsupported_reason
from .base import Kernel


class FlashAttnPackage(Kernel):
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)

    def __init__(self, name: str, module: str, description: str, distribution: str,
                 extensions: tuple[str, ...] = ()):
        self.name = name
        self.module = module            # forward calls module.flash_attn_func / flash_attn_varlen_func
        self.extensions = extensions    # compiled modules the entry point needs at call time
        self.description = description
        self.distribution = distribution
        self._module: Any = None
        self._error: str | None = None

    def _load(self):
        # Lazy (first availability check or call), never at registry load: a missing library must
        # make cells unsupported, not fail `import longca.kernels`.
        if self._module is None and self._error is None:
            self._error = self._missing_entry_point()
        return self._module

    def _missing_entry_point(self) -> str | None:
        entry = f"{self.module}.flash_attn_func"
        try:
            module = importlib.import_module(self.module)
        except Exception as exc:  # noqa: BLE001 — ImportError, or a broken CUDA extension
            return f"{self.module} is not importable ({type(exc).__name__}: {exc}); install {self.distribution}"
        if not callable(getattr(module, "flash_attn_func", None)):
            where = getattr(module, "__file__", None) or ", ".join(getattr(module, "__path__", []))
            return (f"{entry} is not importable ({self.module} at {where} has no flash_attn_func: another "
                    f"FlashAttention release provides {self.module}); install {self.distribution}")
        for extension in self.extensions:
            try:
                importlib.import_module(extension)
            except Exception as exc:  # noqa: BLE001
                return (f"{extension} (the CUDA extension of {entry}) is not importable "
                        f"({type(exc).__name__}: {exc}); install {self.distribution}")
        self._module = module
        return None

    def available(self) -> str | None:
        self._load()
        return self._error

    def supports_mask(self, problem: Problem) -> str | None:
        return unsupported_reason(self.name, problem)

    def prepare(self, problem: Problem) -> dict[str, Any]:
        fm = flash_mask(problem)
        prepared: dict[str, Any] = {"causal": fm.causal, "window": fm.window, "packed": fm.packed,
                                    "documents": len(fm.documents)}
        if fm.packed:
            cu = mask_convert.cu_seqlens(problem.mask, problem.device)
            if problem.batch > 1:  # every sequence of the batch has the same documents
                starts = cu[:-1][None, :] + problem.seqlen * torch.arange(
                    problem.batch, device=problem.device, dtype=torch.int32)[:, None]
                cu = torch.cat([starts.flatten(), cu.new_tensor([problem.batch * problem.seqlen])])
            prepared.update(cu_seqlens=cu, max_seqlen=fm.max_document)
        return prepared

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        notes["window"] = list(prepared["window"])
        notes["version"] = getattr(self._module, "__version__", None)
        return notes

    def forward(self, q, k, v, prepared):
        mod = self._load()
        if prepared["packed"]:
            b, s, h, d = q.shape
            fn = mod.flash_attn_varlen_func
            cu, mx = prepared["cu_seqlens"], prepared["max_seqlen"]
            kwargs = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": mx, "max_seqlen_k": mx}
            out = fn(q.reshape(b * s, h, d), k.reshape(b * s, -1, d), v.reshape(b * s, -1, d),
                     **kwargs, **_mask_kwargs(fn, prepared))
            out = out[0] if isinstance(out, tuple) else out
            return out.reshape(b, s, h, d)
        fn = mod.flash_attn_func
        out = fn(q, k, v, **_mask_kwargs(fn, prepared))
        return out[0] if isinstance(out, tuple) else out


def _mask_kwargs(fn, prepared: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {"causal": prepared["causal"]}
    window = prepared["window"]
    if window != NO_WINDOW:
        left, right = window
        if "window_size" in params:
            kwargs["window_size"] = (left, right)
        else:  # FlashAttention-4: None = unbounded
            kwargs["window_size_left"] = None if left < 0 else left
            kwargs["window_size_right"] = None if right < 0 else right
    return kwargs


register(FlashAttnPackage("flash_attn2", "flash_attn", "FlashAttention-2 (flash-attn package)", "flash-attn",
                          extensions=("flash_attn_2_cuda",)))
register(FlashAttnPackage("flash_attn3", "flash_attn_interface",
                          "FlashAttention-3 (Hopper; flash-attention's hopper/ build)",
                          "flash-attention's hopper/ package (flash_attn_3)"))
register(FlashAttnPackage("flash_attn4", "flash_attn.cute", "FlashAttention-4 (CuTe DSL, flash_attn.cute)",
                          "flash-attn-cute (flash-attention's flash_attn/cute)"))
