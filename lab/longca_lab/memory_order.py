"""Does a cell's ``peak_mem_bytes`` depend on what ran before it?  The memory part, in two orders.

    python lab/longca_lab/memory_order.py OUTDIR --budget-s 240 --cells CELL ... [--configfile config/gpu.yaml]

The workflow's memory part (``longca.execution.measure.memory``: one unmeasured call, then the
allocator's peak over one eager call above what was held before it) is meant to read the same
whichever cells ran earlier in the measuring process.  This probe measures the named cells
(``kernel/mask/dtype_dir_seqlen``) in the given order in one fresh process, then in the reverse order
in another, so that the first cell of one is the last of the other.  Written to OUTDIR:
``memory_order.jsonl`` (one line per cell and order) and ``summary.md`` (both readings and their
ratio per cell).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from longca_lab.timing_series import cell_probe_parser, kernel_and_problem, mib_text, specs


def measure_in_order(configfile: Path, cells: list[str], budget_s: float) -> list[dict]:
    """In this process: each cell's memory part, in order, until the budget is spent."""
    from longca.api import is_oom
    from longca.api import measure_memory

    started, rows = time.monotonic(), []
    for position, (name, spec) in enumerate(zip(cells, specs(configfile, cells))):
        if time.monotonic() - started > budget_s:
            break
        row = {"cell": name, "position": position}
        try:
            kernel, problem, reason = kernel_and_problem(spec)
            row.update({"status": "unsupported", "reason": reason} if reason else
                       {"status": "ok", **measure_memory(kernel, problem)})
        except Exception as exc:  # noqa: BLE001 — a row per cell, whatever happens
            row.update(status="oom" if is_oom(exc) else "error", reason=f"{type(exc).__name__}: {exc}")
        rows.append(row)
    return rows


def _child(configfile: Path, cells: list[str], budget_s: float) -> list[dict]:
    script = ("import json, sys; from longca_lab import memory_order as m; "
              "print(json.dumps(m.measure_in_order(__import__('pathlib').Path(sys.argv[1]), "
              "json.loads(sys.argv[2]), float(sys.argv[3]))))")
    out = subprocess.run([sys.executable, "-c", script, str(configfile), json.dumps(cells), str(budget_s)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main(argv=None) -> int:
    args = cell_probe_parser(__doc__).parse_args(argv)
    specs(args.configfile, args.cells)  # a name that is no cell stops here, before any work
    args.outdir.mkdir(parents=True, exist_ok=True)
    half = args.budget_s / 2
    runs = {"given": _child(args.configfile, args.cells, half),
            "reversed": _child(args.configfile, args.cells[::-1], half)}
    with open(args.outdir / "memory_order.jsonl", "w") as f:
        for order, rows in runs.items():
            for row in rows:
                f.write(json.dumps({"order": order, **row}) + "\n")
    by = {order: {r["cell"]: r for r in rows} for order, rows in runs.items()}
    lines = ["| cell | status | position (given / reversed) | MiB given | MiB reversed | ratio |",
             "| --- | --- | --- | --- | --- | --- |"]
    for cell in args.cells:
        a, b = by["given"].get(cell), by["reversed"].get(cell)
        if a is None or b is None:
            continue
        pa, pb = a.get("peak_mem_bytes"), b.get("peak_mem_bytes")
        ratio = f"{pb / pa:.4f}" if pa and pb else "–"
        lines.append(f"| {cell} | {a['status']} / {b['status']} | {a['position']} / {b['position']} | "
                     f"{mib_text(pa)} | {mib_text(pb)} | {ratio} |")
    (args.outdir / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
