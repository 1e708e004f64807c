"""Kernels that exist to prove the harness catches failures; registered only for the tests.

They run real code that really fails: ``test_wrong`` returns a perturbed result, ``test_oom``
really asks the allocator for more memory than any machine has, ``test_segfault`` really
dereferences NULL, ``test_abort`` really aborts, ``test_hang`` really never returns, ``test_hog``
really allocates (and touches) memory until the cell's memory cap stops it, and ``test_sleep`` is a
correct kernel that takes a set time per call (option ``seconds``), and ``test_refuses`` is refused
by its "library" in ``prepare`` (``Unsupported``), as a cuDNN graph or a FlexAttention backend
refuses a problem.  ``test_leaky`` is correct but keeps a buffer per prepared problem for the life of
the process, as a cache of workspaces does, and ``test_tight`` is correct only where nothing was left
behind: after a ``test_leaky`` cell in the same process it really runs out of memory.
``test_exits`` raises ``SystemExit`` when it prepares a problem, as a library that calls ``sys.exit``
while it loads on first use does.  ``test_fp8`` does an fp8 kernel's arithmetic on the CPU (fp8
inputs, P rounded to e4m3 with scale 448 before P·V, float32 accumulation), so the fp8 gate's
tolerance is checked against the rounding it is meant to allow; ``test_fp8_wrong`` also drops the
scale (P to e4m3 unscaled: small probabilities fall into e4m3's subnormals), which it must not.  Set
``LONGCA_TEST_KERNELS=1`` to register them.
"""

from __future__ import annotations

import ctypes
import os
import resource
import threading
import time

import torch
import torch.nn.functional as F

from . import register
from .base import Kernel, Unsupported


class WrongKernel(Kernel):
    name = "test_wrong"
    description = "test-only: dense SDPA whose output is off by 5%"

    def prepare(self, problem):
        return {"attn_mask": problem.mask.to_dense().to(problem.device)}

    def forward(self, q, k, v, prepared):
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=prepared["attn_mask"],
                                             enable_gqa=q.shape[1] != k.shape[1])
        return (out * 1.05).transpose(1, 2)


class OomKernel(Kernel):
    name = "test_oom"
    description = "test-only: allocates a 2**50-byte workspace"

    def forward(self, q, k, v, prepared):
        workspace = torch.empty(2**50, dtype=torch.uint8, device=q.device)
        return q + workspace[:1].to(q.dtype)


class RefusingKernel(Kernel):
    name = "test_refuses"
    description = "test-only: its library refuses every problem in prepare"
    REASON = "test library: this problem is not supported (refused when asked)"

    def prepare(self, problem):
        raise Unsupported(self.REASON)

    def forward(self, q, k, v, prepared):
        raise AssertionError("never reached: prepare refuses")


class _DenseSdpa(Kernel):
    """Correct dense attention; subclasses add a failure (or a delay) in front of it."""

    def prepare(self, problem):
        return {"attn_mask": problem.mask.to_dense().to(problem.device)}

    def forward(self, q, k, v, prepared):
        self.before()
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=prepared["attn_mask"],
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2)

    def before(self) -> None:
        pass


class SegfaultKernel(_DenseSdpa):
    name = "test_segfault"
    description = "test-only: reads address 0 (SIGSEGV)"

    def before(self):
        ctypes.string_at(0)


class AbortKernel(_DenseSdpa):
    name = "test_abort"
    description = "test-only: calls abort() (SIGABRT), as a failed C++ assertion does"

    def before(self):
        os.abort()


class HangKernel(_DenseSdpa):
    name = "test_hang"
    description = "test-only: never returns"

    def before(self):
        threading.Event().wait()


class HogKernel(_DenseSdpa):
    name = "test_hog"
    description = "test-only: allocates and touches 64 MiB blocks until allocation fails"

    def supports(self, problem):
        # Without a cap this would take the machine's memory, not the cell's.
        if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
            return "test_hog runs only under a memory cap (limits.cell_memory_mb)"
        return super().supports(problem)

    def before(self):
        blocks = []
        while True:
            blocks.append(torch.ones(2**26, dtype=torch.uint8))  # ones, not empty: pages are touched


LEFT_BEHIND: list[torch.Tensor] = []  # test_leaky's buffers: never freed in this process


class LeakyKernel(_DenseSdpa):
    name = "test_leaky"
    description = "test-only: correct, and keeps a buffer per prepared problem (a cache that never frees)"

    def prepare(self, problem):
        LEFT_BEHIND.append(torch.empty(2**20, dtype=torch.uint8, device=problem.device))
        return super().prepare(problem)


class TightKernel(_DenseSdpa):
    name = "test_tight"
    description = "test-only: correct alone; out of memory in a process holding test_leaky's buffers"

    def before(self):
        if LEFT_BEHIND:
            torch.empty(2**50, dtype=torch.uint8)


class SleepKernel(_DenseSdpa):
    name = "test_sleep"
    description = "test-only: correct, and sleeps `seconds` per call"
    options = {"seconds": 0.0}

    def before(self):
        time.sleep(self.options["seconds"])


class Fp8Kernel(Kernel):
    name = "test_fp8"
    description = "test-only: fp8 attention arithmetic in float32 (P rounded to e4m3, scale 448)"
    dtypes = (torch.float8_e4m3fn,)
    P_SCALE = 448.0

    def prepare(self, problem):
        return {"attn_mask": problem.mask.to_dense().to(problem.device)}

    def forward(self, q, k, v, prepared):
        q, k, v = (t.to(torch.float32).transpose(1, 2) for t in (q, k, v))
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        p = torch.softmax(scores.masked_fill(~prepared["attn_mask"], float("-inf")), dim=-1)
        p = (p * self.P_SCALE).to(torch.float8_e4m3fn).to(torch.float32) / self.P_SCALE
        return (p @ v).transpose(1, 2).to(torch.bfloat16)


class Fp8WrongKernel(Fp8Kernel):
    name = "test_fp8_wrong"
    description = "test-only: fp8 attention with P rounded to e4m3 unscaled"
    P_SCALE = 1.0


class BuiltWithoutKernel(_DenseSdpa):
    name = "test_built_without"
    description = "test-only: its 'build' lacks head dims above 32 and says so at call time, as FA3's does"
    refusal_messages = ("This build does not support head dimension",)

    def before(self) -> None:
        raise RuntimeError("This build does not support head dimension 64 (compiled out)")


class ExitingKernel(_DenseSdpa):
    name = "test_exits"
    description = "test-only: its 'library' calls sys.exit while loading (SystemExit, not an Exception)"

    def prepare(self, problem):
        raise SystemExit(3)


if os.environ.get("LONGCA_TEST_KERNELS") == "1":
    for _kernel in (WrongKernel, OomKernel, RefusingKernel, SegfaultKernel, AbortKernel, HangKernel, HogKernel,
                    SleepKernel, LeakyKernel, TightKernel, ExitingKernel, Fp8Kernel, Fp8WrongKernel,
                    BuiltWithoutKernel):
        register(_kernel())
