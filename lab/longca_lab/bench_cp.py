"""CP strategies on several GPUs, next to the same local kernel doing the same per-GPU work alone.

Run under torchrun on one host (NCCL; keep NVLink multicast off):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=. \
        torchrun --standalone --nproc-per-node 2 lab/longca_lab/bench_cp.py --out /tmp/cp.jsonl

Each CP cell goes through ``longca.execution.measure.cp_cell.run_cell`` (the workflow's own code: correctness gate
against the float64 reference, then the slowest rank's median over warmed-up iterations).  The
single-GPU baseline is rank 0's share of the work (its query shard against every key it needs,
the same pieces through the same kernel) with no communication at all, timed by the same harness,
so ``efficiency = strategy TFLOPs/s per GPU / baseline TFLOPs/s`` (``--no-baseline`` skips it).
``--variants`` runs each strategy once per set of options, side by side in one process group: a JSON
list of objects for every strategy (``'[{"head_chunks": 1}, {"head_chunks": 2, "comm_sm_margin": 16}]'``)
or an object of such lists by strategy (``'{"magi": [{"chunk_size": 1024}], "ulysses": [{}]}'``);
``local_kernel`` goes to the strategies that take it.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from longca.api import cp, cp_seqlen
from longca.api import Problem, parse_dtype
from longca.api import layout as layouts
from longca.api import area, restrict
from longca.api import BlockAttention
from longca.api import timing
from longca.api import CPSpec, run_cp_cell as run_cell

MASK_PARAMS = {"full": {}, "causal": {}, "varlen_causal": {}}


def baseline(spec: CPSpec, local_kernel: str, device) -> dict:
    """Rank 0's per-GPU work on one GPU: its zigzag/per-document shard of queries against all keys."""
    problem = Problem(spec.mask, spec.seqlen, spec.batch, spec.heads_q, spec.heads_kv, spec.head_dim,
                      parse_dtype(spec.dtype), device, spec.direction, spec.seed, dict(spec.mask_params))
    layout = layouts.build("auto", problem.mask, spec.cp_size)
    slices = restrict(problem.mask, layout.shards[0], layout.concatenated(range(spec.cp_size)))
    block = BlockAttention(local_kernel, device, spec.heads_q, spec.heads_kv, spec.head_dim)
    pieces = block.pieces(slices)
    q, k, v, dout = problem.make_inputs(requires_grad=False)
    q = layout.dispatch(q, 0)
    dout = layout.dispatch(dout, 0)
    k_all = torch.cat([layout.dispatch(k, r) for r in range(spec.cp_size)], dim=1)
    v_all = torch.cat([layout.dispatch(v, r) for r in range(spec.cp_size)], dim=1)

    def fwd():
        acc = block.new_accumulators(q)
        block.forward(q, k_all, v_all, pieces, acc)
        return block.finish(acc, q.dtype)

    out, lse = fwd()
    lse_bwd = block.backward_lse(lse)

    def bwd():
        dq = block.new_dq(q)
        return block.backward(dout, q, k_all, v_all, out, lse_bwd, pieces, dq)

    result = timing.measure(bwd if spec.direction == "bwd" else fwd, device=device, warmup=spec.warmup,
                            reps=spec.reps)
    flops = 4 * area(slices) * spec.heads_q * spec.head_dim * spec.batch * (2.5 if spec.direction == "bwd" else 1)
    return {"median_ms": result.median_ms, "tflops": flops / (result.median_ms * 1e-3) / 1e12}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--strategies", default="ring,allgather,ulysses,usp,double_ring,torch_cp")
    ap.add_argument("--local-kernels", default="sdpa_cudnn")
    ap.add_argument("--masks", default="full,causal,varlen_causal")
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--directions", default="fwd,bwd")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gate-seqlen", type=int, default=1024)
    ap.add_argument("--budget-s", type=float, default=480, help="skip what is left after this long")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default="[{}]",
                    help="a JSON list of option sets run per strategy, or an object of such lists by strategy")
    ap.add_argument("--no-baseline", action="store_true", help="time no one-GPU share")
    args = ap.parse_args()
    variants = json.loads(args.variants)
    strategies = args.strategies.split(",")
    runs = [(s, v) for s in strategies for v in (variants.get(s, [{}]) if isinstance(variants, dict) else variants)]
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % max(torch.cuda.device_count(), 1)) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    started = time.time()
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        for mask in args.masks.split(","):
            for direction in args.directions.split(","):
                for local_kernel in args.local_kernels.split(","):
                    base_spec = CPSpec(strategy="allgather", mask=mask, seqlen=cp_seqlen(tokens, world), cp_size=world,
                                       direction=direction, dtype=args.dtype, heads_q=64,
                                       heads_kv=8, head_dim=128, mask_params=MASK_PARAMS.get(mask, {}), seed=1,
                                       warmup=args.warmup, reps=args.reps, gate_seqlen=args.gate_seqlen,
                                       device=args.device)
                    base = None
                    if rank == 0 and not args.no_baseline:
                        try:
                            base = baseline(base_spec, local_kernel, device)
                        except Exception as exc:  # noqa: BLE001
                            base = {"error": f"{type(exc).__name__}: {exc}"}
                    dist.barrier()
                    for strategy, variant in runs:
                        over = time.time() - started > args.budget_s
                        flag = [over]
                        dist.broadcast_object_list(flag, src=0)
                        if flag[0]:
                            continue
                        takes_kernel = "local_kernel" in cp.get(strategy).options
                        options = {**({"local_kernel": local_kernel} if takes_kernel else {}), **variant}
                        spec = CPSpec(**{**base_spec.__dict__, "strategy": strategy, "strategy_options": options})
                        row = run_cell(spec)
                        if rank == 0:
                            keep = {k: row.get(k) for k in (
                                "strategy", "mask", "seqlen", "tokens_per_rank", "cp_size", "direction", "dtype",
                                "status", "reason", "tflops_per_gpu", "tflops_per_gpu_p20", "tflops_per_gpu_p80",
                                "median_ms", "rank_median_ms", "comm_bytes", "peak_mem_bytes", "rank_area",
                                "gate_error", "layout", "notes", "device_name", "torch_version", "nccl_version")}
                            keep.update(local_kernel=local_kernel, options=variant, baseline=base)
                            if base and "tflops" in base and row["status"] == "ok":
                                keep["efficiency"] = row["tflops_per_gpu"] / base["tflops"]
                            rows.append(keep)
                            with open(args.out, "a") as f:
                                f.write(json.dumps(keep, default=str) + "\n")
                            print(f"{strategy:12s} {json.dumps(variant):40s} {mask:14s} {tokens // 1024:3d}K {direction} "
                                  f"{local_kernel:11s} "
                                  f"{row['status']:11s} "
                                  + (f"{row['tflops_per_gpu']:7.1f} TF/GPU  base {(base or {}).get('tflops', float('nan')):7.1f}"
                                     f"  eff {keep.get('efficiency', float('nan')):.3f}" if row["status"] == "ok"
                                     else str(row["reason"])[:150]), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
