"""FlashAttention 2, 3 and 4 from their own packages (optional extras).

* FlashAttention-2: ``flash_attn.flash_attn_func`` / ``flash_attn_varlen_func``;
* FlashAttention-3 (Hopper): ``flash_attn_interface`` from flash-attention's ``hopper/`` build;
* FlashAttention-4 (CuTe DSL): ``flash_attn.cute``.

All three take ``(batch, seqlen, heads, head_dim)`` (packed ``(tokens, heads, head_dim)`` for the
varlen entry point), GQA natively, and a mask as documents × causal × window (``_flash_masks``).
The releases differ in keyword names (``window_size=(l, r)`` vs ``window_size_left/right``), in how
an unbounded window side is written (``-1`` for FA2/FA3, ``None`` for FA4) and in whether the LSE is
returned too, so calls are built from the function's signature rather than pinned to one release.
A missing package makes the kernel ``unsupported`` with the import error.

FlashAttention-2 and -4 both install under the ``flash_attn`` import name (FA4 as the ``cute``
subpackage), so ``import flash_attn`` succeeding says nothing about FA2: each adapter is available
only when the entry point it calls resolves (and, for FA2, its CUDA extension imports).

FlashAttention-4 (checked against flash-attn-4 4.0.0b36's ``flash_attn.cute.interface``):
``flash_attn_func`` / ``flash_attn_varlen_func`` take ``causal``, ``window_size=(left, right)``
(``None`` = unbounded; ``causal`` forces ``right = 0``), ``cu_seqlens_q/k`` + ``max_seqlen_q/k``,
``softmax_scale`` and ``return_lse``, and always return ``(out, lse)`` with ``lse`` float32
``(batch, heads, seqlen)`` in natural log (None unless asked for or needed by autograd).  Its LSE
entry point for CP strategies (``lse_ops``) is the forward with ``return_lse=True`` and the
library's backward kernel ``interface._flash_attn_bwd`` (private: FA4 has no public backward that
takes a given output and LSE), fed the CP's global output and LSE.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from typing import Any

import torch

from ..attention.problem import Problem
from . import register
from ._flash_masks import NO_WINDOW, batch_cu_seqlens, flash_mask, unsupported_reason
from ._library import Library, Unusable
from ._lse_ops import LseOps
from .base import Kernel, Unsupported


class FlashAttnPackage(Kernel):
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)

    def __init__(self, name: str, module: str, description: str, distribution: str, *,
                 extensions: tuple[str, ...] = (), unbounded: int | None = -1,
                 lse_ops_class: type[LseOps] | None = None, version_from: str | None = None,
                 libraries: tuple[str, ...] = (), head_dims: tuple[int, ...] = (),
                 dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16),
                 dtype_reasons: dict[torch.dtype, str] | None = None, fp8_backward_missing: str | None = None,
                 deterministic: bool = False):
        self.name = name
        self.dtypes = dtypes
        self.dtype_reasons = dtype_reasons or {}
        # FlashAttention-3 is built with parts compiled out (scripts/build_kernels.sh keeps head dim
        # 128): its checks name what this build lacks.
        self.refusal_messages = ("This flash attention build does not support",
                                 "Flash-Attention was built with backward disabled",
                                 "FlashAttention forward only supports head dimension at most")
        if fp8_backward_missing:
            self.fp8_backward_missing = fp8_backward_missing
        # A deterministic-backward variant passes ``deterministic=True`` (FA3's flag: dq accumulated
        # in a fixed order instead of by atomics); its rows sit beside the default's.
        self.deterministic = deterministic
        # The head dims the release's kernels are built for (its docs); another is an `unsupported`
        # row naming them, not a library assertion read as an error.
        self.head_dims = head_dims
        self.libraries = libraries
        self.module = module            # forward calls module.flash_attn_func / flash_attn_varlen_func
        self.extensions = extensions    # compiled modules the entry point needs at call time
        self.description = description
        self.distribution = distribution
        self.unbounded = unbounded  # how this release writes an unbounded window side
        self.lse_ops_class = lse_ops_class
        # The distribution whose version the notes record, where the module's own __version__ is
        # not it (flash-attn-4 4.0.0b36's flash_attn.cute reports the "fa4" distribution: 0.0.0).
        self.version_from = version_from
        self._load = Library(self._import, self.module, f"install {distribution}")

    def _import(self):
        """The module whose entry points forward calls, once they and the extensions resolve."""
        entry = f"{self.module}.flash_attn_func"
        module = importlib.import_module(self.module)
        if not callable(getattr(module, "flash_attn_func", None)):
            where = getattr(module, "__file__", None) or ", ".join(getattr(module, "__path__", []))
            raise Unusable(f"{entry} is not importable ({self.module} at {where} has no flash_attn_func: another "
                           f"FlashAttention release provides {self.module}); install {self.distribution}")
        for extension in self.extensions:
            try:
                importlib.import_module(extension)
            except Exception as exc:  # noqa: BLE001
                raise Unusable(f"{extension} (the CUDA extension of {entry}) is not importable "
                               f"({type(exc).__name__}: {exc}); install {self.distribution}") from exc
        return module

    def available(self) -> str | None:
        return self._load.missing()

    def supports_mask(self, problem: Problem) -> str | None:
        return unsupported_reason(self.name, problem)

    def lse_ops(self, device: torch.device):
        if self.lse_ops_class is None or torch.device(device).type != "cuda" or self.available():
            return None
        return self.lse_ops_class(self._load())

    def prepare(self, problem: Problem) -> dict[str, Any]:
        fm = flash_mask(problem)
        prepared: dict[str, Any] = {"causal": fm.causal, "window": fm.window, "packed": fm.packed,
                                    "documents": len(fm.documents)}
        if fm.packed:
            prepared.update(cu_seqlens=batch_cu_seqlens(problem), max_seqlen=fm.max_document)
        if self.deterministic:
            mod = self._load()
            fn = mod.flash_attn_varlen_func if fm.packed else mod.flash_attn_func
            if "deterministic" not in inspect.signature(fn).parameters:
                raise Unsupported(f"{self.name}: {fn.__module__}.{fn.__name__} takes no `deterministic` flag")
            prepared["deterministic"] = True
        return prepared

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        notes["window"] = list(prepared["window"])
        notes["version"] = getattr(self._load(), "__version__", None)
        if self.version_from:
            try:
                notes["version"] = importlib.metadata.version(self.version_from)
            except importlib.metadata.PackageNotFoundError:
                pass
        return notes

    def forward(self, q, k, v, prepared):
        mod = self._load()
        if prepared["packed"]:
            b, s, h, d = q.shape
            fn = mod.flash_attn_varlen_func
            cu, mx = prepared["cu_seqlens"], prepared["max_seqlen"]
            kwargs = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": mx, "max_seqlen_k": mx}
            out = fn(q.reshape(b * s, h, d), k.reshape(b * s, -1, d), v.reshape(b * s, -1, d),
                     **kwargs, **self._mask_kwargs(fn, prepared))
            out = out[0] if isinstance(out, tuple) else out
            return out.reshape(b, s, h, d)
        fn = mod.flash_attn_func
        out = fn(q, k, v, **self._mask_kwargs(fn, prepared))
        return out[0] if isinstance(out, tuple) else out

    def _mask_kwargs(self, fn, prepared: dict[str, Any]) -> dict[str, Any]:
        params = tuple(inspect.signature(fn).parameters)
        kwargs = mask_kwargs(params, prepared["causal"], prepared["window"], self.unbounded)
        if prepared.get("deterministic"):
            kwargs["deterministic"] = True
        return kwargs


def mask_kwargs(params: tuple[str, ...], causal: bool, window: tuple[int, int],
                unbounded: int | None) -> dict[str, Any]:
    """The mask keywords for a flash-attn entry point taking ``params``: ``causal`` and, for a
    window, ``window_size=(left, right)`` or ``window_size_left/right`` (whichever the release
    has), with an unbounded side (``-1`` in ``_flash_masks``) written as ``unbounded``."""
    kwargs: dict[str, Any] = {"causal": causal}
    if window != NO_WINDOW:
        left, right = (unbounded if side < 0 else side for side in window)
        if "window_size" in params:
            kwargs["window_size"] = (left, right)
        elif "window_size_left" in params:
            kwargs["window_size_left"], kwargs["window_size_right"] = left, right
        else:
            raise TypeError(f"this flash-attn entry point takes no window (parameters: {', '.join(params)})")
    return kwargs


class Fa4LseOps(LseOps):
    """FlashAttention-4 as a CP local kernel: ``(b, h, s, d)`` blocks, KV heads already expanded.

    FA4 works on ``(b, s, h, d)``; the transposes are views (FA4 copies only a layout it cannot
    address).  ``causal`` pieces are square, where FA4's bottom-right causal is also top-left."""

    modes = frozenset({"full", "causal"})

    def __init__(self, module):
        self.module = module

    def forward(self, q, k, v, causal, bias, scale):
        out, lse = self.module.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               softmax_scale=scale, causal=causal, return_lse=True)
        return out.transpose(1, 2), lse.float()

    def backward(self, dout, q, k, v, out, lse, causal, bias, scale):
        from flash_attn.cute.interface import _flash_attn_bwd

        # The global LSE (rows with no key anywhere carry +inf: P = 0) makes this block's dq/dk/dv
        # its exact share of the full gradient.
        dq, dk, dv = _flash_attn_bwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                     out.transpose(1, 2), dout.transpose(1, 2), lse.float().contiguous(),
                                     softmax_scale=scale, causal=causal)[:3]
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


# FlashAttention-2 and -3: multiples of 8 up to 256 (their READMEs: "all head dimensions up to 256");
# FlashAttention-4 on Hopper: 64, 96 and 128 (flash_attn/cute/interface.py's supported features;
# its (192, 128) is Blackwell's, and q and v share one head dim here).
UP_TO_256 = tuple(range(8, 257, 8))
register(FlashAttnPackage("flash_attn2", "flash_attn", "FlashAttention-2 (flash-attn package)", "flash-attn",
                          extensions=("flash_attn_2_cuda",), libraries=("flash-attn",), head_dims=UP_TO_256))
# FlashAttention-3 takes fp8 (e4m3) q/k/v in its forward (descales default to 1; the output is bf16);
# it has no fp8 backward.
# A value head dim of its own (``takes_head_dim_v``, MLA's 192/128): FlashAttention-3 has the
# (192, 128) kernels only when built with them, and LongCA's build disables them
# (scripts/build_kernels.sh: FA3_FLAGS HDIMDIFF192=TRUE -> FLASH_ATTENTION_DISABLE_HDIMDIFF192), so every FlashAttention
# kernel here keeps the default False: an ``unsupported`` row, "takes one head dim for q, k and v".
FA3 = dict(module="flash_attn_interface", distribution="flash-attention's hopper/ package (flash_attn_3)",
           libraries=("flash-attn-3",), head_dims=UP_TO_256,
           dtypes=(torch.bfloat16, torch.float16, torch.float8_e4m3fn),
           fp8_backward_missing="FlashAttention-3's fp8 kernels are forward only")
register(FlashAttnPackage("flash_attn3", description="FlashAttention-3 (Hopper; flash-attention's hopper/ build)",
                          **FA3))
register(FlashAttnPackage("flash_attn3_deterministic", deterministic=True,
                          description="FlashAttention-3 with its deterministic backward (deterministic=True)",
                          **FA3))
register(FlashAttnPackage("flash_attn4", "flash_attn.cute", "FlashAttention-4 (CuTe DSL, flash_attn.cute)",
                          "flash-attn-cute (flash-attention's flash_attn/cute)", unbounded=None,
                          lse_ops_class=Fa4LseOps, version_from="flash-attn-4",
                          libraries=("flash-attn-4",), head_dims=(64, 96, 128),
                          dtype_reasons={torch.float8_e4m3fn: "FlashAttention-4's fp8 path is Blackwell's (sm_100) only"}))
