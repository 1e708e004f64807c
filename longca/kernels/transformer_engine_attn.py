"""TransformerEngine fused attention (optional extra: ``transformer-engine[pytorch]``).

``transformer_engine.pytorch.DotProductAttention`` picks its own backend (cuDNN fused attention or
flash-attn) — the row records TE's version; set ``NVTE_FUSED_ATTN``/``NVTE_FLASH_ATTN`` to pin one.
Full and causal go in as ``bshd``; packed documents as ``thd`` with ``cu_seqlens`` and a
``padding[_causal]`` mask type; windows as ``window_size=(left, right)`` (``sliding_window`` with
``no_mask``, ``sliding_window_causal`` with ``causal``).  GQA through ``num_gqa_groups``.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

import torch

from ..attention.problem import Problem
from . import register
from ._flash_masks import NO_WINDOW, batch_cu_seqlens, flash_mask
from ._library import Library
from .base import Kernel


def _loaded_library_dir(name: str) -> str | None:
    """The folder of the shared library ``name`` this process has loaded (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith(name):
                    return os.path.dirname(path)
    except (OSError, IndexError):
        pass
    return None


def keep_backward_state(out: torch.Tensor, attributes: tuple[str, ...], depth: int = 4) -> bool:
    """Let autograd run the backward behind ``out`` more than once (``retain_graph=True``), as the
    timing harness does, for a function that drops its state after one backward: TE's fused
    attention sets ``ctx.backward_objects = None`` in its backward, and ``ctx.tensor_objects = None``
    once it has rebuilt its saved tensors.  The node holding the first of ``attributes`` is found
    within ``depth`` nodes of ``out``; a pre-hook on it puts every one of ``attributes`` it held
    back before each backward.  True if found.
    """
    stack = [(out.grad_fn, 0)]
    while stack:
        node, level = stack.pop()
        if node is None or level > depth:
            continue
        if getattr(node, attributes[0], None) is not None:
            state = {name: getattr(node, name) for name in attributes if hasattr(node, name)}

            def restore(grad_outputs, node=node, state=state):
                for name, value in state.items():
                    setattr(node, name, value)

            node.register_prehook(restore)
            return True
        stack.extend((nxt, level + 1) for nxt, _ in node.next_functions)
    return False


# What TE's fused attention (FusedAttnFunc) drops in its backward: its arguments, and the tensor
# objects its saved tensors are rebuilt from (transformer_engine.pytorch.quantized_tensor's
# restore_from_func_ctx, TE 2.20).
TE_BACKWARD_STATE = ("backward_objects", "tensor_objects")


def _import_te():
    # torch's own cuDNN first: TransformerEngine otherwise loads whichever libcudnn it finds first
    # (another package's older one), after which torch refuses cuDNN in this process, in every
    # later cell of it too.  Loaded first, torch's is the one TE's library binds to.
    if torch.cuda.is_available() and torch.backends.cudnn.is_available():
        torch.backends.cudnn.version()
        if loaded := _loaded_library_dir("libcudnn.so"):
            os.environ.setdefault("CUDNN_HOME", loaded)  # where TE looks for cuDNN first
            # cuDNN's sub-libraries, which TE's library asks for by name: torch's, not a system copy.
            for sub in sorted(glob.glob(os.path.join(loaded, "libcudnn*.so*"))):
                ctypes.CDLL(sub, mode=ctypes.RTLD_GLOBAL)
    import transformer_engine.pytorch as te
    return te


_te = Library(_import_te, "transformer_engine.pytorch", "install transformer-engine[pytorch]")


class TransformerEngineAttention(Kernel):
    name = "te_fused"
    libraries = ("transformer-engine", "cudnn")
    description = "TransformerEngine DotProductAttention (cuDNN fused / flash backends)"
    devices = ("cuda",)
    dtypes = (torch.bfloat16, torch.float16)

    def available(self) -> str | None:
        return _te.missing()

    def supports_mask(self, problem: Problem) -> str | None:
        if flash_mask(problem) is None:
            return (f"te_fused adapter takes full, causal, sliding windows and packed documents, "
                    f"not {problem.mask_name!r}")
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        te = _te()
        fm = flash_mask(problem)
        packed = fm.packed
        mask_type = ("padding_causal" if fm.causal else "padding") if packed else ("causal" if fm.causal else "no_mask")
        # TE's window_size is FlashAttention's: key j in [i - left, i + right]; (-1, -1) none, and a
        # causal mask type takes (left, 0).
        window = None if fm.window == NO_WINDOW else fm.window
        module = te.DotProductAttention(problem.heads_q, problem.head_dim, num_gqa_groups=problem.heads_kv,
                                        attention_dropout=0.0, qkv_format="thd" if packed else "bshd",
                                        attn_mask_type=mask_type, window_size=window)
        prepared: dict[str, Any] = {"module": module, "packed": packed, "attn_mask_type": mask_type,
                                    "documents": len(fm.documents)}
        if window is not None:
            prepared["window"] = window
        if packed:
            prepared.update(cu_seqlens=batch_cu_seqlens(problem), max_seqlen=fm.max_document)
        return prepared

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        notes = super().notes(prepared)
        notes["version"] = getattr(_te(), "__version__", None)
        if "window" in prepared:
            notes["window"] = list(prepared["window"])  # as the flash-attn adapters record it
        return notes

    def forward(self, q, k, v, prepared):
        module = prepared["module"]
        b, s, hq, d = q.shape
        if prepared["packed"]:
            cu, mx = prepared["cu_seqlens"], prepared["max_seqlen"]
            out = module(q.reshape(b * s, hq, d), k.reshape(b * s, -1, d), v.reshape(b * s, -1, d),
                         cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=mx, max_seqlen_kv=mx)
        else:
            out = module(q, k, v)
        if out.requires_grad:
            keep_backward_state(out, TE_BACKWARD_STATE)
        return out.reshape(b, s, hq, d)  # TE returns heads flattened into the hidden dimension


register(TransformerEngineAttention())
