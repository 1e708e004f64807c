"""The adapter every attention kernel implements.

An adapter says whether it can run a problem (and why not), prepares whatever mask metadata it
needs outside the timed region, and runs the forward pass on ``(batch, seqlen, heads, head_dim)``
tensors; backward goes through autograd.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..attention.problem import FP8_DTYPES, Problem


class Unsupported(Exception):
    """The library refuses this problem (a mask, a direction, a dtype it cannot take).

    An adapter raises it, with the library's own reason, from ``prepare`` (where it builds graphs or
    compiles), when whether the library takes a problem is only known by asking it.  ``run_cell``
    turns it into an ``unsupported`` row carrying the message, never into ``error`` and never into
    a silent fallback to another implementation."""


class Kernel:
    name: str = ""
    description: str = ""
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    supports_backward: bool = True
    # Why a dtype outside ``dtypes`` is refused, where there is more to say than "does not take it"
    # (e.g. an fp8 path that exists only on another GPU generation).
    dtype_reasons: dict[torch.dtype, str] = {}
    # fp8 kernels measure the forward; a kernel whose fp8 backward LongCA drives sets this to None.
    fp8_backward_missing: str | None = "LongCA measures fp8 forward only"
    # Set by a deterministic-backward variant: what its rows record (``notes``) and what it passes on.
    deterministic: bool = False
    # What the library says, in an error it raises at call time, when *this build* does not take a
    # problem (a head dim or dtype compiled out): such an error is ``unsupported``, not ``error``.
    refusal_messages: tuple[str, ...] = ()
    # What the kernel calls besides torch (every kernel runs under it): distribution names, and
    # "cudnn" for the cuDNN library torch loaded.  Each row records their versions.
    libraries: tuple[str, ...] = ()
    # The head dims the library's kernels are built for; empty: any (what a shape's cell checks first).
    head_dims: tuple[int, ...] = ()
    # Whether it takes a value head dim other than the query/key one (``Problem.head_dim_v``:
    # DeepSeek-V3's MLA, 192/128).  True only where the library documents it and the adapter passes
    # v's shape through as it is.
    takes_head_dim_v: bool = False
    # Calls the timing must make before its timed ones whatever the config says (e.g. a compiled
    # kernel's first backward call compiles).
    min_warmup: int = 0

    # Per-kernel options (config `kernel_options: {<name>: {...}}`) and their defaults; an adapter
    # reads self.options[...].  They are part of only this kernel's cells' settings (cache key).
    options: dict[str, Any] = {}

    def with_options(self, options: dict[str, Any]) -> "Kernel":
        """This kernel with ``options`` over its defaults; an unknown option is a ValueError."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            accepted = ", ".join(sorted(self.options)) or "none"
            raise ValueError(f"kernel {self.name!r} has no option {', '.join(map(repr, unknown))} "
                             f"(it accepts: {accepted})")
        configured = copy.copy(self)
        configured.options = {**self.options, **options}
        return configured

    def available(self) -> str | None:
        """None when the kernel can run on this machine; otherwise the reason it cannot."""
        return None

    def supports(self, problem: Problem) -> str | None:
        """None when this kernel runs ``problem``; otherwise the reason it does not."""
        missing = self.available()
        if missing:
            return missing
        if problem.device.type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)}, not {problem.device.type}"
        if problem.dtype not in self.dtypes:
            why = self.dtype_reasons.get(problem.dtype)
            return f"{self.name} does not take {str(problem.dtype).removeprefix('torch.')}" + (f": {why}" if why else "")
        if problem.direction == "bwd" and not self.supports_backward:
            return f"{self.name} has no backward pass"
        if problem.direction == "bwd" and problem.dtype in FP8_DTYPES and self.fp8_backward_missing:
            return f"{self.name} has no fp8 backward here: {self.fp8_backward_missing}"
        if problem.direction == "fwd" and self.deterministic:
            return (f"{self.name} differs from its default only in the backward (a deterministic dq "
                    f"accumulation); its forward is the default kernel's row")
        if self.head_dims and problem.head_dim not in self.head_dims:
            dims = self.head_dims
            listed = f"{dims[0]}, {dims[1]} … {dims[-1]}" if len(dims) > 4 else ", ".join(map(str, dims))
            return f"{self.name} takes head dims {listed}, not {problem.head_dim}"
        if getattr(problem, "head_dim_v", None) is not None and not self.takes_head_dim_v:
            return (f"{self.name} takes one head dim for q, k and v, not {problem.head_dim} for q and k "
                    f"with {problem.head_dim_v} for v")
        return self.supports_mask(problem)

    def supports_mask(self, problem: Problem) -> str | None:
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        """Mask metadata built outside the timed region; also recorded in the row's notes.

        Raises ``Unsupported`` when the library refuses the problem once asked."""
        return {}

    def prepared_bytes(self, problem: Problem) -> int:
        """Device bytes ``prepare`` will hold for ``problem``, known before building it: what the
        cell's fit check (``longca.execution.measure.fits``) adds to the inputs' bytes.  Only what
        grows faster than the inputs needs saying (a dense mask); 0 by default."""
        return 0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                prepared: dict[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def lse_ops(self, device: torch.device):
        """Block attention with its log-sum-exp (``longca.kernels._lse_ops.LseOps``) on ``device``, for
        CP strategies that merge partial blocks; None when this kernel exposes no such entry point."""
        return None

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        """What the row should say about how this kernel ran (JSON-serialisable)."""
        notes = {k: v for k, v in prepared.items() if isinstance(v, (str, int, float, bool))}
        if self.deterministic:
            notes["deterministic"] = True
        return notes

    def refused(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by the library while running a problem, is its build refusing it."""
        return isinstance(exc, RuntimeError) and any(m in str(exc) for m in self.refusal_messages)

    def dequantize(self, out: torch.Tensor, prepared: dict[str, Any]) -> torch.Tensor:
        """The output as numbers, for the correctness gate (untimed): an fp8 output scaled by
        ``scale_o`` comes back divided by it.  Most kernels return plain numbers already."""
        return out
