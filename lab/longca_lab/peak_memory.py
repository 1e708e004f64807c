"""What a cell's ``peak_mem_bytes`` counts: each cell run as configured and eagerly, in one process.

    python lab/longca_lab/peak_memory.py OUTDIR --budget-s 240 --cells CELL ... [--configfile config/gpu.yaml]

``timing.measure`` reports the allocator's peak during the timed calls, or what was allocated when
they started if that is more.  On CUDA the workflow times replays of a captured graph, and a replay
allocates nothing: the call's transient buffers were allocated and freed while it was captured.  So
a graph-timed row's figure is what was allocated when its replays began, whatever held it.  This
probe runs each named cell (``kernel/mask/dtype_dir_seqlen``) twice, one run right after the other
in one process, as the resident worker runs cells: as the config says (graph replays on CUDA) and
with ``cuda_graph`` off (eager calls, whose every allocation the allocator counts).  Around each run
it records what the process had allocated (memory an earlier cell left behind shows there).
Written to OUTDIR: ``peak_memory.jsonl`` (one line per cell and way) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import dataclasses

from longca_lab.timing_series import cell_probe_parser, probe_cells, specs  # the same cell names, settings and loop

MIB = 2 ** 20


def parse_args(argv=None) -> argparse.Namespace:
    return cell_probe_parser(__doc__).parse_args(argv)


def allocated(device: str) -> int | None:
    import torch

    return torch.cuda.memory_allocated(torch.device(device)) if device.startswith("cuda") else None


def both_ways(spec) -> list[dict]:
    from longca.api import run_cell

    rows = []
    for way, run in (("as configured", spec), ("eager", dataclasses.replace(spec, cuda_graph=False))):
        before = allocated(spec.device)
        row = run_cell(run)
        rows.append({"way": way, "status": row["status"], "reason": row["reason"], "timed_via": row.get("timed_via"),
                     "median_ms": row.get("median_ms"), "peak_mem_bytes": row.get("peak_mem_bytes"),
                     "allocated_before": before, "allocated_after": allocated(spec.device)})
    return rows


def _mib(n) -> str:
    return "–" if n is None else f"{n / MIB:,.0f}"


def summary(rows: list[dict]) -> str:
    lines = ["| cell | way | status | timed via | median ms | peak MiB | allocated before (MiB) | after (MiB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        median = "–" if r["median_ms"] is None else f"{r['median_ms']:.2f}"
        lines.append(f"| {r['cell']} | {r['way']} | {r['status']} | {r['timed_via'] or '–'} | {median} "
                     f"| {_mib(r['peak_mem_bytes'])} | {_mib(r['allocated_before'])} | {_mib(r['allocated_after'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    cells = specs(args.configfile, args.cells)
    probe_cells(args.outdir, args.budget_s, args.cells, cells, both_ways, "peak_memory.jsonl", summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
