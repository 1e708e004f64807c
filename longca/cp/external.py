"""CP libraries LongCA can drive when they are installed: ring-flash-attn, yunchang (USP) and
TransformerEngine's context parallelism.  None is a dependency; a missing one makes its cells
``unsupported`` with the import error, like an optional kernel."""

from __future__ import annotations

import importlib

from . import layout as layouts
from . import register
from .base import Strategy, Unsupported
from .blocks import share


class External(Strategy):
    module = ""
    options = {"layout": "zigzag"}
    own_collectives = "the library calls its own collectives"

    def _import(self, device):
        if device.type != "cuda":
            raise Unsupported(f"{self.name} runs flash-attn CUDA kernels only")
        try:
            return importlib.import_module(self.module)
        except Exception as exc:  # noqa: BLE001 — any import failure is the reason
            raise Unsupported(f"{self.module} is not installed here ({type(exc).__name__}: {exc})") from None


@register
class RingFlashAttn(External):
    name = "ring_flash_attn"
    module = "ring_flash_attn"
    description = "zhuzilin/ring-flash-attention's zigzag ring (flash-attn kernels), causal or full"

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        lib = self._import(device)
        if mask.name not in ("full", "causal"):
            raise Unsupported("ring_flash_attn's zigzag function takes full or causal only")
        self.fn, self.causal = lib.zigzag_ring_flash_attn_func, mask.name == "causal"
        self.layout = layouts.build("zigzag", mask, self.world)
        self.rank_area = share(mask.area(), self.world, self.rank)  # the library's split is its own
        self.notes = {"layout": "zigzag"}

    def attention(self, q, k, v):
        return self.fn(q, k, v, causal=self.causal, group=self.group)


class _NotValidated(External):
    """Installed or not, no adapter for this library has been checked against the reference here
    (none installs on the machines this project can use), so it never reports a number."""

    why = ""

    def plan(self, mask, heads_q, heads_kv, head_dim, device, dtype) -> None:
        self._import(device)
        raise Unsupported(f"{self.why}; no LongCA adapter for it has been validated yet")


@register
class Yunchang(_NotValidated):
    name = "yunchang"
    module = "yunchang"
    description = "feifeibear/long-context-attention's LongContextAttention (USP)"
    why = "yunchang needs its process-group setup (set_seq_parallel_pg) per model"


@register
class TransformerEngineCP(_NotValidated):
    name = "te_cp"
    module = "transformer_engine.pytorch"
    description = "TransformerEngine DotProductAttention with context parallelism (p2p)"
    why = "TransformerEngine CP needs a CUDA stream and cp_group per layer"
