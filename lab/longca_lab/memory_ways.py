"""Does reading the memory part off the timing's calls give the figure a call of its own gives?

    python lab/longca_lab/memory_ways.py OUTDIR --budget-s 120 --cells CELL ... [--configfile config/gpu.yaml]

A graphed cell's memory part is read off the calls its timing makes anyway (``memory_via`` ``timing``:
its inputs and ``prepare`` in one window, the host probe's first call in another;
``longca.execution.measure.call_memory``); where the timing is taken from the store, the memory
part makes a call of its own (``own call``).  This probe measures each named cell
(``kernel/mask/dtype_dir_seqlen``) both ways in one process, one right after the other: the timing
with its reading, then ``measure_memory`` warm.  Written to OUTDIR: ``memory_ways.jsonl`` (one line
per cell) and ``summary.md`` (both figures and their ratio per cell, and how many agree).
"""

from __future__ import annotations

import json
import time

from longca_lab.timing_series import cell_probe_parser, kernel_and_problem, mib_text, specs


def measure_both(spec) -> dict:
    """One cell's memory part read off its timing, then from a call of its own."""
    from longca.api import CallReading
    from longca.api import is_oom
    from longca.api import measure_memory
    from longca.api import time_kernel

    try:
        kernel, problem, reason = kernel_and_problem(spec)
        if reason:
            return {"status": "unsupported", "reason": reason}
        reading = CallReading(problem.device) if problem.device.type == "cuda" else None
        started = time.perf_counter()
        time_kernel(kernel, problem, **spec.timing.harness_args(), memory=reading)
        timed_s = time.perf_counter() - started
        started = time.perf_counter()
        own = measure_memory(kernel, problem, warm=True)
        own_s = time.perf_counter() - started
        read = reading.part() if reading is not None else None
        return {"status": "ok", "timing": (read or {}).get("peak_mem_bytes"), "own_call": own["peak_mem_bytes"],
                "time_wall_s": timed_s, "own_call_wall_s": own_s}
    except Exception as exc:  # noqa: BLE001 — a row per cell, whatever happens
        return {"status": "oom" if is_oom(exc) else "error", "reason": f"{type(exc).__name__}: {exc}"}


def summary(rows: list[dict]) -> str:
    lines = ["| cell | status | MiB read off the timing | MiB own call | ratio |", "| --- | --- | --- | --- | --- |"]
    both = [r for r in rows if r.get("timing") and r.get("own_call")]
    for r in rows:
        a, b = r.get("timing"), r.get("own_call")
        lines.append(f"| {r['cell']} | {r['status']} | {mib_text(a)} | {mib_text(b)} | {f'{a / b:.4f}' if a and b else '–'} |")
    same = sum(r["timing"] == r["own_call"] for r in both)
    within = sum(abs(r["timing"] / r["own_call"] - 1) <= 0.01 for r in both)
    lines.append(f"\n{len(both)} cells with both figures: byte-identical {same}, within 1 % {within}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = cell_probe_parser(__doc__).parse_args(argv)
    cell_specs = specs(args.configfile, args.cells)  # a name that is no cell stops here, before any work
    args.outdir.mkdir(parents=True, exist_ok=True)
    started, rows = time.monotonic(), []
    for name, spec in zip(args.cells, cell_specs):
        if time.monotonic() - started > args.budget_s:
            break
        rows.append({"cell": name, **measure_both(spec)})
    (args.outdir / "memory_ways.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = summary(rows)
    (args.outdir / "summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
