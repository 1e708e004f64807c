"""Kernels that exist to prove the harness catches failures; registered only for the tests.

They run real code that really fails: ``test_wrong`` returns a perturbed result, ``test_oom``
really asks the allocator for more memory than any machine has.  Set ``LONGCA_TEST_KERNELS=1``
to register them.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import register
from .base import Kernel


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


if os.environ.get("LONGCA_TEST_KERNELS") == "1":
    register(WrongKernel())
    register(OomKernel())
