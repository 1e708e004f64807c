"""What a kernel cell costs from nothing: its wall beside its GPU work, part by part.

    python lab/longca_lab/cell_cost.py RUN [--before RUN] [--memory-against PUBLISHED/kernels.parquet]
                                   [--estimate PUBLISHED/kernels.parquet]

RUN is a run's ``results/`` folder (its cells) or a ``kernels.parquet``.  A row's ``wall_s`` is the
whole cell in its measuring process; ``gate_wall_s``, ``time_wall_s`` and ``memory_wall_s`` are the
parts it measured (null when taken from the store).  The cell's GPU work is what its timing exists
for: the warm-up (``warmup_spent_ms``) and the timed calls (``reps`` x ``median_ms``).  Everything
else is overhead: the gate, the timing's set-up (inputs, ``prepare``, eager calls before capture,
the host probe, the capture), the memory probe, and building the problem.  Only cells measured whole
(``parts_reused`` null) say what a cell costs from nothing; the others are left out and counted.

Prints, in markdown: per kernel and length, cells, mean wall, GPU work and each part; the run's
totals; each kernel's first cell beside its others (what a first use costs: compilation, plans); with ``--before``, the same cells in both runs side by side (mean wall, and what the timing
part spent beyond its GPU work); with ``--memory-against``, how many ``peak_mem_bytes`` equal the
published table's, cell by cell; with ``--estimate``, the whole grid of a published table from
nothing on this run's GPU: each ok cell's published timed calls (``reps`` x ``median_ms``) plus the
warm-up and overhead this run measured for a cell of that kernel and length, in calls of the kernel
(the median over this run's ok cells of (wall - timed calls) / median_ms), so that lengths the run
did not measure scale with their calls and a run's newer warm-up replaces the published one
(``--estimate-keeps "gpu work"``: the published warm-up too, as pages before 2026-11-29 computed it).
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import pandas as pd

from longca.api import tables

KEY = ["kernel", "mask", "seqlen", "direction", "dtype"]
PARTS = ["gate_wall_s", "time_wall_s", "memory_wall_s"]


def load(path: str) -> pd.DataFrame:
    """A run's rows (a results/ folder's cell files, or a kernels.parquet), with ``gpu_s`` (the GPU
    work of an ok cell) and ``whole`` (every part measured by the row's own job)."""
    p = Path(path)
    if p.is_dir():
        files = glob.glob(str(p / "cells" / "kernels" / "**" / "*.json"), recursive=True)
        rows = pd.DataFrame([json.loads(Path(f).read_text()) for f in files])
    else:
        rows = pd.read_parquet(p)
    if rows.empty:
        raise SystemExit(f"cell_cost.py: no kernel cells in {path}")
    for column in PARTS + ["parts_reused", "warmup_spent_ms", "median_ms", "reps"]:
        if column not in rows:
            rows[column] = None
    rows["gpu_s"] = tables.gpu_work_s(rows)
    rows["timed_s"] = tables.timed_calls_s(rows)
    rows["whole"] = tables.measured_whole(rows)
    return rows


def _whole_ok(rows: pd.DataFrame) -> pd.DataFrame:
    """The ok cells whose parts were all measured by their own job: what a cell costs from nothing."""
    return rows[rows["whole"] & (rows["status"] == "ok")]


def _length(seqlen: int) -> str:
    return f"{seqlen // 1024}K"


def per_kernel(rows: pd.DataFrame) -> str:
    whole = _whole_ok(rows)
    lines = ["| kernel | length | ok cells | mean wall s | GPU work s | gate s | timing beyond GPU work s | memory s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (kernel, seqlen), g in whole.groupby(["kernel", "seqlen"]):
        lines.append(f"| {kernel} | {_length(seqlen)} | {len(g)} | {g['wall_s'].mean():.3f} | {g['gpu_s'].mean():.3f} | "
                     f"{g['gate_wall_s'].mean():.3f} | {(g['time_wall_s'] - g['gpu_s']).mean():.3f} | "
                     f"{g['memory_wall_s'].mean():.3f} |")
    return "\n".join(lines)


def totals(rows: pd.DataFrame) -> str:
    whole = rows[rows["whole"]]
    ok = whole[whole["status"] == "ok"]
    gpu = ok["gpu_s"].sum()
    wall = whole["wall_s"].sum()
    parts = {name: ok[name].sum() for name in PARTS}
    setup = wall - sum(parts.values())
    return "\n".join([
        f"cells: {len(rows)}, measured whole: {len(whole)} ({len(ok)} ok, "
        + ", ".join(f"{n} {s}" for s, n in whole["status"].value_counts().items() if s != "ok") + ")",
        f"mean cell wall: {whole['wall_s'].mean():.3f} s over all cells measured whole, "
        f"{ok['wall_s'].mean():.3f} s over the ok ones",
        f"wall of the cells: {wall:.1f} s; their GPU work (warm-up + timed calls): {gpu:.1f} s; "
        f"wall / GPU work: {wall / gpu:.2f}" if gpu else f"wall of the cells: {wall:.1f} s; no GPU work",
        f"parts: gate {parts['gate_wall_s']:.1f} s, timing {parts['time_wall_s']:.1f} s "
        f"(of which beyond GPU work {parts['time_wall_s'] - gpu:.1f} s), memory {parts['memory_wall_s']:.1f} s, "
        f"set-up and unsupported cells {setup:.1f} s",
    ])


def first_use(rows: pd.DataFrame) -> str:
    """Per kernel, its first ok cell measured whole in the run (by ``timed_at``): what it cost beyond its
    GPU work (compilation, plans, a library's first load), beside the median of the kernel's other
    cells.  The difference is paid once per measuring process and GPU."""
    ok = _whole_ok(rows).copy()
    if ok.empty or "timed_at" not in ok:
        return "no ok cell measured whole"
    ok["overhead_s"] = ok["wall_s"] - ok["gpu_s"]
    lines = ["| kernel | first cell | its overhead s (gate s) | median overhead s of the other cells | cells |",
             "| --- | --- | --- | --- | --- |"]
    extra = 0.0
    # ``timed_at`` has whole seconds: a cell timed in the same second as the first use came after it
    # (a first use costs its cell the time before its timing ends), so a tie goes to the costlier cell.
    in_order = ok.sort_values(["timed_at", "overhead_s"], ascending=[True, False], kind="stable")
    for kernel, g in in_order.groupby("kernel", sort=True):
        first, others = g.iloc[0], g.iloc[1:]
        median = others["overhead_s"].median() if len(others) else float("nan")
        extra += first["overhead_s"] - (median if median == median else 0.0)
        lines.append(f"| {kernel} | {first['mask']} {_length(first['seqlen'])} {first['direction']} | "
                     f"{first['overhead_s']:.2f} ({first['gate_wall_s']:.2f}) | {median:.3f} | {len(g)} |")
    lines.append(f"first uses beyond the median cell, all kernels: {extra:.1f} s")
    return "\n".join(lines)


def side_by_side(before: pd.DataFrame, after: pd.DataFrame, labels: tuple[str, str]) -> str:
    both = _whole_ok(before).merge(_whole_ok(after), on=KEY, suffixes=("_a", "_b"))
    if both.empty:
        return "no cell measured whole and ok in both runs"
    a, b = labels
    lines = [f"{len(both)} cells measured whole and ok in both runs",
             f"| length | cells | {a} mean wall s | {b} mean wall s | {b} / {a} | {a} timing beyond GPU work s | "
             f"{b} timing beyond GPU work s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for seqlen, g in list(both.groupby("seqlen")) + [("all", both)]:
        wa, wb = g["wall_s_a"].sum(), g["wall_s_b"].sum()
        label = seqlen if seqlen == "all" else _length(seqlen)
        lines.append(f"| {label} | {len(g)} | {g['wall_s_a'].mean():.3f} | {g['wall_s_b'].mean():.3f} | {wb / wa:.2f} | "
                     f"{(g['time_wall_s_a'] - g['gpu_s_a']).mean():.3f} | {(g['time_wall_s_b'] - g['gpu_s_b']).mean():.3f} |")
    return "\n".join(lines)


def memory_against(rows: pd.DataFrame, published: pd.DataFrame) -> str:
    mine = _whole_ok(rows)[KEY + ["peak_mem_bytes"]]
    theirs = published[(published["status"] == "ok") & published["peak_mem_bytes"].notna()][KEY + ["peak_mem_bytes"]]
    both = mine.merge(theirs, on=KEY, suffixes=("", "_published")).dropna()
    if both.empty:
        return "no ok cell with a memory figure in both"
    ratio = both["peak_mem_bytes"] / both["peak_mem_bytes_published"]
    same = int((both["peak_mem_bytes"] == both["peak_mem_bytes_published"]).sum())
    within = int(((ratio - 1).abs() <= 0.01).sum())
    return (f"peak_mem_bytes against the published table: {len(both)} cells; byte-identical {same} "
            f"({same / len(both):.0%}); within 1 % {within} ({within / len(both):.0%}); "
            f"ratio {ratio.min():.4f}-{ratio.max():.4f}")


def overhead_calls(rows: pd.DataFrame, beyond: str = "gpu_s") -> pd.DataFrame:
    """This run's ok cells measured whole: what their wall holds beyond ``beyond`` (``gpu_s``: the
    GPU work; ``timed_s``: the timed calls alone), in calls of their kernel, with kernel and length."""
    ok = _whole_ok(rows)
    calls = (ok["wall_s"] - ok[beyond]) / (ok["median_ms"].astype(float) / 1e3)
    return pd.DataFrame({"kernel": ok["kernel"], "seqlen": ok["seqlen"], "calls": calls})


def _calls_for(calls: pd.DataFrame):
    """Overhead in calls for a (kernel, length): the median of this run's cells of that kernel and
    length; else of that length; beyond the run's longest length, the longest's."""
    by_pair = calls.groupby(["kernel", "seqlen"])["calls"].median()
    by_length = calls.groupby("seqlen")["calls"].median()
    longest = by_length.index.max()

    def lookup(kernel: str, seqlen: int) -> float:
        seqlen = min(seqlen, longest)
        return by_pair.get((kernel, seqlen), by_length.get(seqlen, by_length[longest]))
    return lookup, by_length, longest


# What a published cell keeps of its own figures in the estimate (its column, and the words for it
# and for what it takes from the run).  "timed": its timed calls (reps x median_ms), the run's
# warm-up and overhead: for a run whose warm-up differs from the published table's (a newer timing
# protocol).  "gpu work": its warm-up too, the run's overhead only: the definition before the
# warm-up changed (pages up to 2026-11-28).
ESTIMATE_KEEPS = {"timed": ("timed_s", "timed calls", "warm-up and overhead"),
                  "gpu work": ("gpu_s", "GPU work", "overhead")}


def estimate(rows: pd.DataFrame, published: pd.DataFrame, keeps: str = "timed") -> str:
    if keeps not in ESTIMATE_KEEPS:
        raise SystemExit(f"cell_cost.py: --estimate-keeps must be one of {sorted(ESTIMATE_KEEPS)}, got {keeps!r}")
    column, what, rest = ESTIMATE_KEEPS[keeps]
    lookup, by_length, longest = _calls_for(overhead_calls(rows, column))
    ok = published[published["status"] == "ok"]
    per_call = pd.Series([lookup(k, s) for k, s in zip(ok["kernel"], ok["seqlen"])], index=ok.index)
    overhead = per_call * ok["median_ms"].astype(float) / 1e3
    kept = ok[column]
    other = published[published["status"] != "ok"]
    unsupported_wall = rows.loc[rows["status"] == "unsupported", "wall_s"].mean()
    other_s = len(other) * unsupported_wall if len(other) and unsupported_wall == unsupported_wall else 0.0
    total = kept.sum() + overhead.sum() + other_s
    by_seqlen = ", ".join(f"{_length(s)} {c:.0f}" for s, c in by_length.items())
    beyond = ok["seqlen"] > longest
    return "\n".join([
        f"{rest} per ok cell in calls of its kernel (median by length, this run): {by_seqlen}; each published "
        f"cell takes its kernel's median at its length where this run has one, else the length's; longer "
        f"lengths take the {_length(longest)} figures",
        f"the published table: {len(published)} cells, {len(ok)} ok: {what} {kept.sum() / 3600:.2f} h, "
        f"estimated {rest} {overhead.sum() / 3600:.2f} h ({overhead[beyond].sum() / 3600:.2f} h of it beyond "
        f"{_length(longest)}), other cells {other_s / 3600:.3f} h",
        f"estimated wall of its cells from nothing on one GPU: {total / 3600:.2f} h "
        f"(the workflow's own scheduling between cells not included)",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="+", help="a run's results/ folder or kernels.parquet; several: their rows together "
                        "(e.g. a 1K-32K stage and a 64K-128K sample)")
    parser.add_argument("--before", help="an earlier run of the same cells: side by side")
    parser.add_argument("--labels", nargs=2, default=("before", "after"))
    parser.add_argument("--memory-against", help="a published kernels.parquet: is peak_mem_bytes the same?")
    parser.add_argument("--estimate", help="a published kernels.parquet: its grid from nothing on this run's GPU")
    parser.add_argument("--estimate-keeps", default="timed", choices=sorted(ESTIMATE_KEEPS),
                        help="what a published cell keeps of its own figures (default: its timed calls)")
    args = parser.parse_args(argv)
    rows = pd.concat([load(run) for run in args.run], ignore_index=True)
    print(totals(rows), "", per_kernel(rows), "", first_use(rows), sep="\n")
    if args.before:
        print("", side_by_side(load(args.before), rows, tuple(args.labels)), sep="\n")
    if args.memory_against:
        print("", memory_against(rows, load(args.memory_against)), sep="\n")
    if args.estimate:
        print("", estimate(rows, load(args.estimate), args.estimate_keeps), sep="\n")


if __name__ == "__main__":
    main()
