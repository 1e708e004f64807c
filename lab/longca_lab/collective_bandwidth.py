"""The box's collective bandwidths: what a CP strategy's transfers can run at on these GPUs.

    torchrun --nproc-per-node=W lab/longca_lab/collective_bandwidth.py OUTDIR [--sizes-mib 1 16 64 256]

Each rank times ``all_gather_into_tensor``, ``all_to_all_single``, ``reduce_scatter_tensor`` and a
ring of batched ``isend``/``irecv`` (each rank to the next) on bf16 buffers of each size (NCCL, CUDA
events; without a GPU: gloo, float32, wall clock), over ``--reps`` calls after ``--warmup``; the
figure is the slowest rank's median.  Bandwidth
is *bytes this rank sends* per second, counted as ``longca.cp.comm.Comm`` counts them (the part of
the payload that leaves the rank: (W-1)/W of an all-to-all or reduce-scatter input, W-1 shards of an
all-gather, the whole P2P message), so a strategy's ``comm_bytes`` divided by it is the time its
transfers take at that size when nothing overlaps.  Rank 0 writes ``OUTDIR/collectives_<W>.jsonl``
(one line per collective × size, with the per-rank medians) and ``OUTDIR/collectives_<W>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from longca.api import sent_bytes

COLLECTIVES = ("all_gather", "all_to_all", "reduce_scatter", "p2p_ring")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64, 256],
                   help="per-rank payload: the all-gather's shard, the all-to-all's and reduce-scatter's "
                        "input, the P2P message")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    return p.parse_args(argv)


def _call(name: str, x: torch.Tensor, world: int, rank: int):
    """``(run, bytes sent)`` for collective ``name`` on a per-rank payload ``x``."""
    nbytes = x.numel() * x.element_size()
    if name == "all_gather":
        out = x.new_empty((world * x.shape[0],))
        return (lambda: dist.all_gather_into_tensor(out, x)), sent_bytes("all_gather", nbytes, world)
    if name == "all_to_all":
        out = torch.empty_like(x)
        return (lambda: dist.all_to_all_single(out, x)), sent_bytes("all_to_all", nbytes, world)
    if name == "reduce_scatter":
        out = x.new_empty((x.shape[0] // world,))
        return (lambda: dist.reduce_scatter_tensor(out, x)), sent_bytes("reduce_scatter", nbytes, world)
    recv = torch.empty_like(x)

    def ring():
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return ring, sent_bytes("send", nbytes, world)


def _median_ms(run, warmup: int, reps: int, cuda: bool) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def page(rows: list[dict]) -> str:
    """The markdown page of ``collectives_<W>.jsonl``'s rows."""
    first = rows[0]
    backend = f"NCCL {first['nccl_version']}" if first["nccl_version"] else "gloo"
    lines = [f"# Collectives on {first['ranks']} × {first['device_name']} ({backend})", "",
             "GB/s = bytes this rank sends / the slowest rank's median time.", "",
             "| collective | payload MiB | sent MiB | median ms | GB/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['collective']} | {r['payload_mib']:g} | {r['sent_bytes'] / 2**20:.1f} | {r['median_ms']:.3f} | "
              f"{r['gb_per_s']:.0f} |" if r["gb_per_s"] else
              f"| {r['collective']} | {r['payload_mib']:g} | 0 | {r['median_ms']:.3f} | – |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype, itemsize = (torch.bfloat16, 2) if cuda else (torch.float32, 4)
    device = "cuda" if cuda else "cpu"
    device_name = torch.cuda.get_device_name() if cuda else "CPU (gloo)"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    rows = []
    for mib in args.sizes_mib:
        n = int(mib * 2**20) // itemsize // world * world  # elements, divisible by the ranks
        x = torch.randn(n, device=device).to(dtype)
        for name in COLLECTIVES:
            run, sent = _call(name, x, world, rank)
            ms = _median_ms(run, args.warmup, args.reps, cuda)
            every: list = [None] * world
            dist.all_gather_object(every, ms)
            slowest = max(every)
            rows.append({"collective": name, "ranks": world, "payload_mib": mib, "sent_bytes": sent,
                         "median_ms": slowest, "rank_median_ms": every,
                         "gb_per_s": sent / (slowest * 1e-3) / 1e9 if sent else None,
                         "device_name": device_name, "nccl_version": nccl})
    if rank == 0:
        args.outdir.mkdir(parents=True, exist_ok=True)
        with open(args.outdir / f"collectives_{world}.jsonl", "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        (args.outdir / f"collectives_{world}.md").write_text(page(rows))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
