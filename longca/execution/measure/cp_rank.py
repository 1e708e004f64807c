"""``torchrun … -m longca.execution.measure.cp_rank --settings JSON --out ROW.json``: one CP cell, every rank.

The process group is gloo on CPU and NCCL on CUDA, with the cell's time limit as its collective
timeout, so a hung collective ends as a ``timeout`` row instead of a hung pipeline (the launcher,
``longca cp-cell``, also kills the whole job past the limit and writes the row itself).  With
``--failures DIR`` every rank records its own first failure there, one starting the process group
(a missing NCCL, a rendezvous) included, and the launcher names the earliest over all ranks
(``first_failure``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from ... import cp_env
from ..cache.atomic import write_json_atomic
from .first_failure import Recorder


def identified(row: dict, cell_id: str | None, fingerprint: str | None) -> dict:
    """Rank 0's row with the cell's name, its code's fingerprint and, for a timed row, when and
    where the timing ran (``timed_at``, ``timed_on``, ``timed_load_1m``: rank 0's host, just after)."""
    from . import env

    row["cell_id"], row["fingerprint"] = cell_id, fingerprint
    if row["status"] == "ok":
        row.update({f"timed_{k}": v for k, v in env.now_here().items()})
    return row


def launch_seen() -> list[dict]:
    """The launch environment's variables as every rank sees them (a collective: every rank calls
    it), so a row records what its ranks ran under, not what was asked for."""
    import torch.distributed as dist

    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, cp_env.seen())
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longca.execution.measure.cp_rank")
    parser.add_argument("--settings", required=True, help="the cell's resolved settings (JSON)")
    parser.add_argument("--out", required=True, help="where rank 0 writes the row")
    parser.add_argument("--cell-id", default=None)
    parser.add_argument("--fingerprint", default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank")
    parser.add_argument("--failures", default=None, help="the folder where each rank records its first failure")
    args = parser.parse_args(argv)
    recorder = Recorder(args.failures)
    try:
        # Everything up to a working process group, torch's import included: a failure here (no
        # NCCL, a rendezvous that never completes) is often the one that makes every other rank fail.
        import torch
        import torch.distributed as dist

        from .cp_cell import CPSpec, run_cell

        # The preset was applied by the launcher (the ranks' environment); here it is only recorded.
        settings, launch = cp_env.split(json.loads(args.settings))
        cp_env.variables(launch)  # an unknown preset stops the rank before any work
        spec = CPSpec.from_dict(settings)
        if args.threads:
            torch.set_num_threads(args.threads)
        backend = "nccl" if spec.device == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    except BaseException as exc:
        recorder.note("timeout" if "timed out" in str(exc).lower() else "error", exc, stage="start")
        raise
    try:
        seen = launch_seen()
        row = run_cell(spec, on_failure=recorder.note)
        if row is not None:
            cp_env.record(row, launch, seen)
            write_json_atomic(identified(row, args.cell_id, args.fingerprint), args.out)
            print(f"{args.cell_id}: {row['status']}"
                  + (f" {row['tflops_per_gpu']:.3f} TFLOPs/s per GPU" if row["status"] == "ok"
                     else f" ({row['reason']})"), file=sys.stderr)
    except BaseException as exc:  # run_cell catches the cell's own; this is what escaped it
        recorder.note("error", exc)
        raise
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
