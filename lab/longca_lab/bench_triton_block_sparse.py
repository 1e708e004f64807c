"""LongCA's Triton block-sparse kernel vs block-sparse FlexAttention (GPU; issue: kernels).

For each seqlen × mask (block_sparse at several block densities, non-causal and causal, and the
plain causal mask) × direction: our kernel (``triton_block_sparse``) and FlexAttention given the
equivalent ``BlockMask`` (``longca.attention.mask_convert.block_mask``, 128×128 tiles) run on the same
inputs.  Outputs (and dq/dk/dv for bwd) are first compared with each other (relative L2; a case
whose error exceeds ``--tol`` is reported, not timed as a win), then both are timed with
``triton.testing.do_bench`` (median, L2 flushed by do_bench).  SDPA flash on the dense problems
(full, and causal via ``is_causal``) is timed once per seqlen for scale.

FLOPs are counted on attended pairs only, next to where they divide the time:
``longca.attention.flops.attention_flops(mask, heads_q, head_dim, direction)`` = 4·area·heads·d (fwd),
× 2.5 (bwd).  Every case is independent: a failure (compile error, OOM …) prints its reason in the
table and the run goes on.  Prints a markdown table; ``--out`` also writes JSON lines.

    PYTHONPATH=. python lab/longca_lab/bench_triton_block_sparse.py
    PYTHONPATH=. python lab/longca_lab/bench_triton_block_sparse.py --seqlens 8192 --directions fwd \\
        --config fwd_m=128 fwd_n=128          # try other tiles (see Config in the kernel module)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
import traceback
from typing import Any, Callable

import torch
import torch.nn.functional as F

from longca.api import mask_convert, masks
from longca.api import attention_flops
from longca.api import triton_block_sparse as tbs
from longca.api import seqlen_label

BATCH, HEADS_Q, HEADS_KV, HEAD_DIM = 1, 64, 8, 128
DTYPE = torch.bfloat16
DEVICE = "cuda"  # --device cpu (with TRITON_INTERPRET=1, tiny shapes) only smoke-tests this script
FLEX_BLOCK = 128


def _cases(densities: list[float], with_causal: bool) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for causal in (False, True):
        for d in densities:
            label = f"block_sparse d={d}" + (" causal" if causal else "")
            out.append((label, "block_sparse", {"density": d, "causal": causal, "block": 128}))
    if with_causal:
        out.append(("causal", "causal", {}))
    return out


def _bench(fn: Callable[[], Any], warmup: int, rep: int) -> float:
    if DEVICE != "cuda":  # smoke test only: one untimed and three timed calls
        fn()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[1]
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return math.inf
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _free() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


_FLEX = None


def _flex():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def _inputs(seqlen: int, seed: int = 0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def rand(h):
        return torch.randn(BATCH, seqlen, h, HEAD_DIM, device=DEVICE, dtype=DTYPE, generator=gen)

    q, k, v, do = rand(HEADS_Q), rand(HEADS_KV), rand(HEADS_KV), rand(HEADS_Q)
    return q, k, v, do


def run_case(label: str, pattern: str, params: dict[str, Any], seqlen: int, direction: str,
             cfg: tbs.Config, args) -> dict[str, Any]:
    row: dict[str, Any] = {"seqlen": seqlen, "mask": label, "direction": direction}
    mask = masks.build(pattern, seqlen, seed=0, **params)
    flops = attention_flops(mask, HEADS_Q, HEAD_DIM, direction, BATCH)
    row.update(mask_density=mask.density(), flops=flops)
    q, k, v, do = _inputs(seqlen)
    bwd = direction == "bwd"
    for t in (q, k, v):
        t.requires_grad_(bwd)

    # Ours: layout + metadata built untimed.
    t0 = time.perf_counter()
    prepared = tbs.prepare(mask, DEVICE, HEAD_DIM, cfg)
    row["prepare_s"] = time.perf_counter() - t0
    stats = prepared.fwd_layout.stats()
    row.update(tile=f"{cfg.fwd_m}x{cfg.fwd_n}", tiles_full=stats["tiles_full"],
               tiles_partial=stats["tiles_partial"], tile_density=stats["tile_density"])
    ours = lambda: tbs.attention(q, k, v, prepared)  # noqa: E731

    # FlexAttention with the equivalent BlockMask ((b, h, s, d) views; GQA in-kernel as ours).
    flex = None
    try:
        block_mask = mask_convert.block_mask(mask, FLEX_BLOCK, DEVICE)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        flex = lambda: _flex()(qt, kt, vt, block_mask=block_mask, enable_gqa=True).transpose(1, 2)  # noqa: E731
        out_flex = flex()
    except Exception as exc:  # noqa: BLE001
        flex = None
        row["flex_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        traceback.print_exc(file=sys.stderr)
    out_ours = ours()

    # Correctness first: ours vs FlexAttention (same bf16 inputs, both fp32-accumulating); if
    # FlexAttention failed, ours vs the fp32 reference on query head 0 (forward output only).
    if flex is not None:
        errors = {"out": _rel(out_ours, out_flex)}
        if bwd:
            g_ours = torch.autograd.grad(out_ours, (q, k, v), do, retain_graph=True)
            g_flex = torch.autograd.grad(out_flex, (q, k, v), do, retain_graph=True)
            for name, a, b in zip(("dq", "dk", "dv"), g_ours, g_flex):
                errors[name] = _rel(a, b)
            del g_ours, g_flex
        row["checked_against"] = "flex"
    else:
        from longca.api import reference

        with torch.no_grad():
            ref = reference.attention(q[:, :, :1].float(), k[:, :, :1].float(), v[:, :, :1].float(), mask)
        errors = {"out[head 0]": _rel(out_ours[:, :, :1], ref)}
        del ref
        row["checked_against"] = "fp32 reference, head 0, forward output"
    row["err_vs_flex"] = max(errors.values())
    row["err_detail"] = ", ".join(f"{n} {e:.1e}" for n, e in errors.items())
    if row["err_vs_flex"] > args.tol:
        row["status"] = f"MISMATCH vs {row['checked_against']} ({row['err_detail']})"
        return row

    if bwd:
        fn_ours = lambda: torch.autograd.grad(out_ours, (q, k, v), do, retain_graph=True)  # noqa: E731
        fn_flex = (lambda: torch.autograd.grad(out_flex, (q, k, v), do, retain_graph=True)) if flex else None  # noqa: E731
    else:
        fn_ours, fn_flex = ours, flex
    for name, fn in (("ours", fn_ours), ("flex", fn_flex)):
        if name == "flex" and flex is None:
            continue
        try:
            ms = _bench(fn, args.warmup, args.rep)
            # FLOPs of the attended pairs / median time.
            row[f"{name}_ms"], row[f"{name}_tflops"] = ms, flops / (ms * 1e-3) / 1e12
        except Exception as exc:  # noqa: BLE001
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        _free()
    row["status"] = "ok" if flex is not None else "ok (flex failed; checked vs reference)"
    return row


def run_sdpa(seqlen: int, direction: str, causal: bool, args) -> dict[str, Any]:
    """SDPA flash on the dense problem (full or is_causal), for scale."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = masks.build("causal" if causal else "full", seqlen)
    flops = attention_flops(mask, HEADS_Q, HEAD_DIM, direction, BATCH)
    row: dict[str, Any] = {"seqlen": seqlen, "mask": f"SDPA flash, dense {'causal' if causal else 'full'}",
                           "direction": direction, "mask_density": mask.density(), "flops": flops}
    q, k, v, do = _inputs(seqlen)
    bwd = direction == "bwd"
    qt, kt, vt = (t.transpose(1, 2).requires_grad_(bwd) for t in (q, k, v))
    dot = do.transpose(1, 2)

    def fwd():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)

    out = fwd()
    fn = (lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)) if bwd else fwd  # noqa: E731
    ms = _bench(fn, args.warmup, args.rep)
    row.update(sdpa_ms=ms, sdpa_tflops=flops / (ms * 1e-3) / 1e12, status="ok")
    return row


def _fmt(x: Any, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| seqlen | mask | dir | tiles (ours) full/partial, density | ours (or SDPA) ms | "
          "TFLOPs/s | flex ms | flex TFLOPs/s | flex ms / ours ms | rel. err | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tiles = (f"{r['tiles_full']}/{r['tiles_partial']}, {r['tile_density']:.3f}"
                 if "tiles_full" in r else "")
        ours_ms, flex_ms = r.get("ours_ms", r.get("sdpa_ms")), r.get("flex_ms")
        ours_tf = r.get("ours_tflops", r.get("sdpa_tflops"))
        speed = f"{flex_ms / r['ours_ms']:.2f}×" if r.get("ours_ms") and flex_ms else ""
        status = r.get("status", "")
        for key in ("ours_error", "flex_error"):
            if key in r:
                status += f"; {key}: {r[key]}"
        err = _fmt(r.get("err_vs_flex"), ".1e")
        print(f"| {seqlen_label(r['seqlen'])} | {r['mask']} | {r['direction']} | {tiles} | "
              f"{_fmt(ours_ms, '.3f')} | {_fmt(ours_tf, '.1f')} | {_fmt(flex_ms, '.3f')} | "
              f"{_fmt(r.get('flex_tflops'), '.1f')} | {speed} | {err if 'err_vs_flex' in r else ''} | "
              f"{status} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--densities", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    ap.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument("--no-causal", action="store_true", help="skip the plain causal mask")
    ap.add_argument("--no-sdpa", action="store_true", help="skip the dense SDPA flash rows")
    ap.add_argument("--config", nargs="*", default=[],
                    help="kernel Config overrides, e.g. fwd_m=128 fwd_n=128 bwd_warps=8")
    ap.add_argument("--tol", type=float, default=2e-2,
                    help="max relative L2 error vs FlexAttention (both bf16 → ~1e-2 is normal)")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=200, help="do_bench repetition budget, ms")
    ap.add_argument("--out", default=None, help="also write the rows as JSON lines here")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--shape", type=int, nargs=3, default=None, metavar=("HQ", "HKV", "D"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()

    global DEVICE, HEADS_Q, HEADS_KV, HEAD_DIM
    DEVICE = args.device
    if args.shape:
        HEADS_Q, HEADS_KV, HEAD_DIM = args.shape
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    overrides = {k: int(v) for k, v in (item.split("=", 1) for item in args.config)}
    cfg = dataclasses.replace(tbs.default_config(HEAD_DIM, DEVICE), **overrides)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    print(f"device: {name}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"bf16, batch {BATCH}, heads {HEADS_Q}:{HEADS_KV} (GQA), head_dim {HEAD_DIM}; "
          f"ours: {cfg}; flex: BlockMask {FLEX_BLOCK}x{FLEX_BLOCK}, torch.compile; "
          f"do_bench median (warmup {args.warmup} ms, rep {args.rep} ms); "
          f"TFLOPs/s on attended pairs (attention_flops)\n")
    rows: list[dict[str, Any]] = []
    for seqlen in args.seqlens:
        for direction in args.directions:
            if not args.no_sdpa:
                for causal in (False, True):
                    try:
                        rows.append(run_sdpa(seqlen, direction, causal, args))
                    except Exception as exc:  # noqa: BLE001
                        rows.append({"seqlen": seqlen, "direction": direction,
                                     "mask": f"SDPA flash, dense {'causal' if causal else 'full'}",
                                     "status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
                    _free()
            for label, pattern, params in _cases(args.densities, not args.no_causal):
                try:
                    row = run_case(label, pattern, params, seqlen, direction, cfg, args)
                except Exception as exc:  # noqa: BLE001 — one failed case never stops the run
                    row = {"seqlen": seqlen, "mask": label, "direction": direction,
                           "status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
                    traceback.print_exc(file=sys.stderr)
                rows.append(row)
                _free()
                print(f"  done {seqlen} {label} {direction}: {row.get('status')}", file=sys.stderr, flush=True)
    print_table(rows)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
