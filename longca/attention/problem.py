"""One attention problem: mask, shapes, dtype, device and direction, plus its inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ..spec import DIRECTIONS, ProblemSpec  # ProblemSpec re-exported: the settings of a Problem
from . import masks
from .masks import AttnMask

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    # fp8 inputs are quantized with unit scale (descale 1): standard-normal values sit inside e4m3's
    # normal range (2^-6 … 448), so the kernel and the float64 reference see the same fp8 numbers.
    "float8_e4m3fn": torch.float8_e4m3fn,
}
FP8_DTYPES = frozenset({torch.float8_e4m3fn})


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


@dataclass(frozen=True)
class Problem:
    """Tensors are ``(batch, seqlen, heads, head_dim)``; ``heads_q`` is a multiple of ``heads_kv``.
    ``v``, the output and its gradient have ``head_dim_v`` where it is set (None: ``head_dim``; one
    equal to ``head_dim`` is kept as None, so a problem has one spelling)."""

    mask_name: str
    seqlen: int
    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    direction: str
    seed: int = 0
    mask_params: Mapping[str, Any] = field(default_factory=dict)
    mask: AttnMask | None = None
    head_dim_v: int | None = None

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        for key in ("batch", "heads_q", "heads_kv", "head_dim"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)!r}")
        if self.head_dim_v is not None and self.head_dim_v <= 0:
            raise ValueError(f"head_dim_v must be positive, got {self.head_dim_v!r}")
        if self.head_dim_v == self.head_dim:
            object.__setattr__(self, "head_dim_v", None)
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}")
        if self.mask is None:
            built = masks.build(self.mask_name, self.seqlen, seed=self.seed, **dict(self.mask_params))
            object.__setattr__(self, "mask", built)
        object.__setattr__(self, "device", torch.device(self.device))

    @classmethod
    def from_spec(cls, spec: ProblemSpec, device: torch.device | None = None) -> "Problem":
        """The problem ``spec`` names, on ``device`` (default: the spec's own; a CP rank passes its
        local GPU)."""
        return cls(spec.pattern or spec.mask, spec.seqlen, spec.batch, spec.heads_q, spec.heads_kv, spec.head_dim,
                   parse_dtype(spec.dtype), torch.device(spec.device) if device is None else device,
                   spec.direction, spec.seed, dict(spec.mask_params), head_dim_v=spec.head_dim_v)

    @property
    def value_dim(self) -> int:
        """The head dim of v, the output and its gradient."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def split_head_dim(self) -> bool:
        """Whether v's head dim differs from q's and k's (DeepSeek-V3's MLA: 192/128)."""
        return self.head_dim_v is not None

    @property
    def gqa(self) -> bool:
        return self.heads_q != self.heads_kv

    def make_inputs(self, *, requires_grad: bool, seed: int | None = None):
        """Random q, k, v (never zeros: they hide unwritten outputs) and an upstream gradient; v and
        the gradient have ``value_dim`` (drawn in the same order, so an unsplit problem's inputs are
        the numbers they always were)."""
        # Drawn on the problem's device: a 32K × 64-head problem is ~600M numbers, seconds on a CPU.
        # The same seed gives the same inputs on the same kind of device.
        gen = torch.Generator(device=self.device).manual_seed(self.seed if seed is None else seed)
        shape_q = (self.batch, self.seqlen, self.heads_q, self.head_dim)
        shape_kv = (self.batch, self.seqlen, self.heads_kv, self.head_dim)
        shape_v = (self.batch, self.seqlen, self.heads_kv, self.value_dim)
        shape_out = (self.batch, self.seqlen, self.heads_q, self.value_dim)

        def rand(shape):
            t = torch.randn(shape, generator=gen, dtype=torch.float32, device=self.device).to(self.dtype)
            return t.requires_grad_(requires_grad)

        q, k, v = rand(shape_q), rand(shape_kv), rand(shape_v)
        grad_out = torch.randn(shape_out, generator=gen, dtype=torch.float32, device=self.device).to(self.dtype)
        return q, k, v, grad_out
