"""Whether a cell can fit on its GPU, known from its shape before anything is allocated.

A cell past the GPU's memory used to find out by trying: its inputs, ``prepare`` (a dense mask of
1 TiB at 1M tokens) or the first call failed, in a measuring process that, having run other cells,
then measured it again in a fresh one.  The bytes a call holds at least are known from the shape:
q, k, v, the output and the upstream gradient, the gradients of a backward, the softmax statistics,
and what the kernel's ``prepare`` will hold (``Kernel.prepared_bytes``).  When they exceed what the
device can still give, the cell is an ``oom`` row at once, its reason stating the estimate; a cell
within it is measured, and one that still does not fit fails as before (the estimate leaves out the
kernel's workspace: it is a lower bound, so it never turns a cell that fits into an ``oom``).
"""

from __future__ import annotations

import torch

from ... import config
from ...attention.problem import Problem
from ...kernels.base import Kernel

GIB = 2**30


def need_bytes(kernel: Kernel, problem: Problem) -> dict[str, int]:
    """What one call of the cell holds at least, by what holds it (bytes)."""
    shape = {"batch": problem.batch, "head_dim": problem.head_dim, "heads_q": problem.heads_q,
             "heads_kv": problem.heads_kv, "head_dim_v": problem.value_dim}
    dtype = str(problem.dtype).removeprefix("torch.")
    backward = problem.direction == "bwd"
    element = torch.empty((), dtype=problem.dtype).element_size()
    per_q = problem.batch * problem.seqlen * problem.heads_q * problem.value_dim * element  # the upstream gradient
    return {
        # q, k, v and the output (and their gradients for a backward): config's own count, the one
        # it warns with before a run.
        "inputs, outputs" + (" and gradients" if backward else ""): config.input_bytes(shape, problem.seqlen, dtype,
                                                                                     backward),
        # Made with the inputs for a forward too (timed.timed_call); a backward's is among its gradients.
        "upstream gradient": 0 if backward else per_q,
        "softmax statistics": problem.batch * problem.heads_q * problem.seqlen * 4,  # float32 LSE
        "prepared mask": kernel.prepared_bytes(problem),
    }


def available_bytes(device: torch.device) -> int:
    """What the allocator can still hand out on ``device``: the driver's free memory and what this
    process's allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def refusal(kernel: Kernel, problem: Problem) -> str | None:
    """The ``oom`` reason when the cell's least need exceeds what its GPU can give; None otherwise
    (and off CUDA, where a cell's memory is the host's and the cap's: ``limits.cell_memory_mb``)."""
    if problem.device.type != "cuda":
        return None
    parts = need_bytes(kernel, problem)
    need, have = sum(parts.values()), available_bytes(problem.device)
    if need <= have:
        return None
    spelled = ", ".join(f"{name} {b / GIB:.1f} GiB" for name, b in parts.items() if b)
    return (f"does not fit, estimated before allocating: one call holds at least {need / GIB:.1f} GiB "
            f"({spelled}; the kernel's workspace besides) and the GPU can give {have / GIB:.1f} GiB")
