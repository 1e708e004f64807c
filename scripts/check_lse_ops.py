"""The CP local-kernel entry points (``Kernel.lse_ops``) against the float64 reference, on one GPU.

What a CP strategy does with a local kernel, without a process group: a mask's slices as the
pieces the kernel takes (full rectangles, square causal triangles), each run through the kernel's
attention-with-LSE, merged by LSE, then the backward of every piece from the *global* output and
LSE.  Output, LSE and dq/dk/dv are compared with ``longca.attention.reference`` (relative L2 error, the
cell gate's tolerances).  A mask a kernel's pieces cannot express is reported ``unsupported``.
``--blocks N`` splits the keys into N blocks, each its own call (or pieces) into the same running
output, LSE and dq, as a ring's steps do: what a kernel that reduces into given buffers (FFA) must
get right across calls.  A kernel with a whole-block entry point (``longca.cp.fused``) runs each
block as one call.

    PYTHONPATH=. python scripts/check_lse_ops.py --kernels cudnn_fe flash_attn4 sdpa_cudnn
    PYTHONPATH=. python scripts/check_lse_ops.py --kernels ffa --blocks 3 --seqlen 4096

Exit status 1 when any case is wrong or fails.
"""

from __future__ import annotations

import argparse
import sys

import torch

from longca.attention import masks, reference
from longca.cp.blocks import Span, restrict
from longca.cp.local import BlockAttention
from longca.execution.measure.gate import GATE_TOLERANCE
from longca.kernels.base import Unsupported

DOCS = {"histogram": {"edges": [16, 64, 200], "weights": [1, 1]}}
# Masks made of full rectangles and bottom-right causal slices (what full/causal pieces take),
# plus one that is not (sliding_window: its band leaves bi_causal pieces).
MASKS = {"full": {}, "causal": {}, "varlen_causal": DOCS, "shared_question": DOCS, "causal_blockwise": DOCS,
         "sliding_window": {"window": 48}}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300)).item()


def check_one(kernel: str, mask_name: str, args) -> tuple[str, str]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    mask = masks.build(mask_name, args.seqlen, seed=1, **MASKS[mask_name])
    bounds = [args.seqlen * i // args.blocks for i in range(args.blocks + 1)]
    keys = list(zip(bounds, bounds[1:]))
    try:
        block = BlockAttention(kernel, device, args.heads_q, args.heads_kv, args.head_dim)
        queries = (Span(0, args.seqlen, 0),)
        pieces = [block.pieces(restrict(mask, queries, (Span(a, b, 0),))) for a, b in keys]
    except Unsupported as exc:
        return "unsupported", str(exc)
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = (args.heads_q, args.heads_kv, args.heads_kv, args.heads_q)
    q, k, v, do = (torch.randn(1, args.seqlen, h, args.head_dim, generator=gen, device=device).to(dtype)
                   for h in shapes)
    acc = block.new_accumulators(q)
    for (a, b), p in zip(keys, pieces):
        block.forward(q, k[:, a:b], v[:, a:b], p, acc)
    out, lse = block.finish(acc, dtype)
    dq = block.new_dq(q)
    dk, dv = (torch.zeros(k.shape, dtype=torch.float32, device=device) for _ in range(2))
    for (a, b), p in zip(keys, pieces):
        share = block.backward(do, q, k[:, a:b], v[:, a:b], out, block.backward_lse(lse), p, dq)
        if share is not None:
            dk[:, a:b] += share[0]
            dv[:, a:b] += share[1]

    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    ref, ref_lse = reference.attention(q64, k64, v64, mask, return_lse=True)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    errors = {"out": _rel(out, ref), "lse": _rel(lse, ref_lse),
              **{n: _rel(g, r) for n, g, r in zip(("dq", "dk", "dv"), (block.dq_result(dq, torch.float32), dk, dv), ref_grads)}}
    tol = GATE_TOLERANCE["bwd"][dtype]
    calls = sum(1 if block.calls == "fused" else len(p) for p in pieces if p)
    detail = ", ".join(f"{n} {e:.2e}" for n, e in errors.items()) + f" (tolerance {tol:.0e}; {calls} calls)"
    return ("ok" if max(errors.values()) <= tol else "wrong"), detail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["cudnn_fe", "flash_attn4", "sdpa_cudnn"])
    parser.add_argument("--masks", nargs="+", default=list(MASKS), choices=list(MASKS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--heads-q", type=int, default=8)
    parser.add_argument("--heads-kv", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=1, help="key blocks, each its own call(s) (a ring's steps)")
    args = parser.parse_args()
    bad = False
    for kernel in args.kernels:
        for mask in args.masks:
            try:
                status, detail = check_one(kernel, mask, args)
            except Exception as exc:  # noqa: BLE001 — reported, and fails the run
                status, detail = "error", f"{type(exc).__name__}: {exc}"
            bad |= status in ("wrong", "error")
            print(f"{kernel:14s} {mask:18s} {status:12s} {detail}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
