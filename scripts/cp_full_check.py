"""The CP full-size check: every strategy × mask × direction at a real length on the ranks it runs on.

    torchrun --nproc-per-node=W scripts/cp_full_check.py OUTDIR --budget-s 300 \\
        [--configfile config/gpu.yaml ...] [--tokens-per-rank 8192] [--strategies S ...] [--masks M ...]

The cells' gate checks each CP cell at ``gate_seqlen`` tokens against a float64 reference; a
strategy could still go wrong only at length (a shard boundary inside a long document, an index
past 2^16, a block the gate's short sequence never makes).  This runs each strategy on W ranks at
``tokens-per-rank × W`` tokens (NCCL on GPUs, gloo on the CPU) and compares the output, and for
backward dq, dk, dv, with exact attention computed in float32 block by block on rank 0
(``longca.attention.chunked_reference``), within the CP gate's tolerances.  Rank 0 writes one line
per check to ``OUTDIR/cp_full_check_<W>.jsonl`` and a table to ``OUTDIR/cp_full_check_<W>.md``;
no check starts after ``--budget-s`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from full_check import checked, write_summary
from workflow_config import REPO, resolved

from longca import config as longca_config
from longca.execution.measure.cp_cell import CHUNKED_FLOAT32, CPSpec, correctness_gate, local_device


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--budget-s", type=float, required=True, help="start no check after this many seconds")
    p.add_argument("--configfile", type=Path, nargs="+", default=[REPO / "config" / "gpu.yaml"])
    p.add_argument("--tokens-per-rank", type=int, default=8192)
    p.add_argument("--strategies", nargs="+", help="default: the config's cp_strategies")
    p.add_argument("--masks", nargs="+", help="default: the config's cp_masks")
    return p.parse_args(argv)


def one_check(settings: dict) -> dict:
    spec = CPSpec.from_dict(settings)
    row = {"strategy": spec.strategy, "mask": spec.mask, "direction": spec.direction, "dtype": spec.dtype,
           "seqlen": spec.seqlen, "cp_size": spec.cp_size, "status": "error", "reason": None}

    def check() -> dict:
        ok, err, tol, detail = correctness_gate(spec, spec.problem(local_device(spec)), exact=CHUNKED_FLOAT32)
        return {"ok": ok, "error": err, "tolerance": tol, "detail": detail}

    return checked(row, check)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = resolved(*args.configfile)
    device = cfg["device"]
    if device == "cuda":  # before the group: NCCL binds each rank to the device current at init
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    strategies = args.strategies or cfg["cp_strategies"]
    masks = args.masks or cfg["cp_masks"] or [e.name for e in longca_config.mask_entries(cfg)]
    args.outdir.mkdir(parents=True, exist_ok=True)
    started, rows = time.monotonic(), []
    for strategy in strategies:
        for mask in masks:
            for direction in cfg["directions"]:
                go = [time.monotonic() - started <= args.budget_s]
                dist.broadcast_object_list(go, src=0)  # every rank stops at the same check
                if not go[0]:
                    break
                settings = longca_config.cp_cell_settings(cfg, strategy, mask, args.tokens_per_rank, world,
                                                          direction, cfg["dtypes"][0])
                row = one_check(settings)
                rows.append(row)
                if rank == 0:
                    print(f"{strategy}/{mask}/{direction} x{world}: {row['status']} "
                          f"{row.get('detail') or row.get('reason') or ''}"[:240], flush=True)
    if rank == 0:
        with open(args.outdir / f"cp_full_check_{world}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        counts = write_summary(rows, ["strategy", "mask", "direction", "seqlen", "cp_size"],
                               args.outdir / f"cp_full_check_{world}.md")
        print(f"{len(rows)} checks on {world} ranks: {counts}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
