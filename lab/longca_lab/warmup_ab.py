"""Two warm-ups of a graphed cell side by side on one GPU, in one process: do they time alike?

    python lab/longca_lab/warmup_ab.py OUTDIR --budget-s 240 --cells CELL ... [--rounds 4]
        [--configfile config/gpu.yaml]

A graphed cell makes its ``warmup`` eager calls, the host probe, the capture, then warms up its
replays until two successive windows agree.  Up to 2177873 that warm-up began with ``warmup``
untimed replays and compared windows of replays only (``untimed replay``); since b26788a it makes
no untimed replay and compares its first window with the host probe's call when that was one call
of >= 10 ms (``probe-seeded``): at 64K-128K one replay instead of three.  Fewer calls before the
timed ones could leave the GPU short of its sustained state, so this times named cells both ways,
alternating (ABBA, then BAAB, ...) on one captured graph: each round is the host probe and the
harness's ``timing.measure`` with the cell's settings, as ``timed.time_kernel`` does.  One discarded
measurement per cell first loads the device (the harness's first cell after idle warms up long).

Written to OUTDIR: ``rounds.jsonl`` (one line per cell, round and warm-up) and ``summary.md``: per
cell the median of each warm-up's medians, their ratio, each warm-up's spread over rounds (max /
min of its round medians) and the calls it made before the timed ones.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from longca_lab.timing_series import cell_probe_parser, kernel_and_problem, probe_cells, specs

OLD, NEW = "untimed replay", "probe-seeded"


def parse_args(argv=None):
    p = cell_probe_parser(__doc__)
    p.add_argument("--rounds", type=int, default=4, help="rounds per cell, each timing both warm-ups")
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    return args


def probe_pace_ms(run, device) -> float | None:
    """The host probe's pace as a graphed cell gets it (``timed._host_probe``; on the CPU one call
    timed to its end, so the benchmark runs there too)."""
    from longca.api import timed

    if device.type == "cuda":
        return timed._host_probe(run, device)[1]
    start = time.perf_counter()
    run()
    pace = (time.perf_counter() - start) * 1e3
    return pace if pace >= timed.HOST_PROBE_MS else None


def order(rounds: int) -> list[str]:
    """ABBA BAAB ...: each warm-up first as often as second, so a drift over the cell cancels."""
    pairs = [(OLD, NEW), (NEW, OLD), (NEW, OLD), (OLD, NEW)]
    return [side for i in range(rounds) for side in pairs[i % 4]]


def probe(spec, rounds: int) -> list[dict]:
    from longca.api import graphed, timing
    from longca.api import timed_call

    kernel, problem, refused = kernel_and_problem(spec)
    if refused:
        return [{"round": None, "warmup": None, "refused": refused}]
    device = problem.device
    counted = max(spec.warmup, kernel.min_warmup)
    harness = dict(device=device, reps=spec.reps, warmup_ms=spec.warmup_ms, warmup_max_ms=spec.warmup_max_ms,
                   rep_ms=spec.rep_ms)
    stream = graphed.stream_for(device, spec.cuda_graph)
    rows = []
    with graphed.on(stream):
        run, _ = timed_call(kernel, problem)
        for _ in range(counted):
            run()
        replay, via = graphed.capture(run, stream) if stream is not None else (None, "eager")
        call = replay or run
        timing.measure(call, warmup=counted, **harness)        # loads the device; not kept
        for i, side in enumerate(order(rounds)):
            pace = probe_pace_ms(run, device)
            t = timing.measure(call, warmup=counted if side == OLD else 0,
                               previous_ms=pace if side == NEW else None, **harness)
            rows.append({"round": i // 2, "warmup": side, "timed_via": via, "probe_pace_ms": pace,
                         "median_ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "reps": t.reps,
                         "warmup_calls": t.warmup_calls, "warmup_spent_ms": t.warmup_spent_ms,
                         "warmup_steady": t.warmup_steady})
    return rows


def summary(rows: list[dict]) -> str:
    lines = [f"| cell | {NEW} / {OLD} (medians of round medians) | {OLD} spread | {NEW} spread | "
             f"{OLD} calls before timed | {NEW} calls before timed | rounds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    ratios = []
    for cell in dict.fromkeys(r["cell"] for r in rows):
        mine = [r for r in rows if r["cell"] == cell]
        if mine[0].get("refused"):
            lines.append(f"| {cell} | unsupported: {mine[0]['refused']} | | | | | |")
            continue
        by = {side: [r for r in mine if r["warmup"] == side] for side in (OLD, NEW)}
        med = {side: statistics.median(r["median_ms"] for r in by[side]) for side in by}
        spread = {side: max(r["median_ms"] for r in by[side]) / min(r["median_ms"] for r in by[side]) for side in by}
        calls = {side: statistics.median(r["warmup_calls"] for r in by[side]) for side in by}
        ratios.append(med[NEW] / med[OLD])
        lines.append(f"| {cell} | {med[NEW] / med[OLD]:.4f} | {spread[OLD]:.4f} | {spread[NEW]:.4f} | "
                     f"{calls[OLD]:g} | {calls[NEW]:g} | {len(by[OLD])} |")
    if ratios:
        lines.append(f"\n{len(ratios)} cells: {NEW} / {OLD} median {statistics.median(ratios):.4f}, "
                     f"range {min(ratios):.4f}-{max(ratios):.4f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    cells = specs(args.configfile, args.cells)
    probe_cells(Path(args.outdir), args.budget_s, args.cells, cells, lambda spec: probe(spec, args.rounds),
                "rounds.jsonl", summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
