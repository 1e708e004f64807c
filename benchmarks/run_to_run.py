"""The run-to-run spread of one kernel table measured twice: what a margin between kernels must exceed.

    python benchmarks/run_to_run.py A/kernels.parquet B/kernels.parquet [--seqlens 4096]

Matches the cells of the two runs (``longca.results.tables.device_ratios``: kernel, mask, length,
direction, dtype; same problem shape) and prints, in markdown: how many statuses agree, the ratio
B / A of the cells ok on both (median, range, how many within 1-10 %, quantiles of |ratio - 1|), and
every mask × length × direction whose fastest kernel differs between the runs, with the margin the
first run gave its winner there: a winner by less than that is a tie (the report's ``tie_margin``).
"""

from __future__ import annotations

import argparse

import pandas as pd

from longca.results import parquet as results
from longca.results import tables


def summary(a: pd.DataFrame, b: pd.DataFrame) -> str:
    both = a.merge(b, on=tables.CELL_KEYS, suffixes=("_a", "_b"))
    pairs = tables.device_ratios(a, b)
    off = (pairs["ratio"] - 1).abs()
    lines = [f"cells in both runs: {len(both)}; same status: {int((both['status_a'] == both['status_b']).sum())}; "
             f"ok in both: {len(pairs)}",
             f"B / A: median {pairs['ratio'].median():.4f}, range {pairs['ratio'].min():.3f}–{pairs['ratio'].max():.3f}",
             "", "| within | cells |", "| --- | --- |"]
    lines += [f"| {t:.0%} | {int((off <= t).sum())} of {len(pairs)} |" for t in (0.01, 0.02, 0.03, 0.05, 0.10)]
    lines += ["", "| quantile of \\|B/A − 1\\| | " + " | ".join(f"{q:.0%}" for q in (0.5, 0.9, 0.95, 0.99, 1.0)) + " |",
              "| --- |" + " --- |" * 5,
              "| | " + " | ".join(f"{off.quantile(q):.2%}" for q in (0.5, 0.9, 0.95, 0.99, 1.0)) + " |", ""]
    flips = []
    for key, group in pairs.groupby(["mask", "seqlen", "direction", "dtype"], sort=True):
        if len(group) < 2:
            continue
        by_a = group.sort_values("tflops_a", ascending=False)
        win_a, win_b = by_a.iloc[0]["kernel"], group.loc[group["tflops_b"].idxmax(), "kernel"]
        if win_a != win_b:
            margin = by_a.iloc[0]["tflops_a"] / group.loc[group["kernel"] == win_b, "tflops_a"].iloc[0]
            flips.append((*key, win_a, win_b, margin))
    groups = pairs.groupby(["mask", "seqlen", "direction", "dtype"]).ngroups
    lines.append(f"fastest kernel differs in {len(flips)} of {groups} mask × length × direction cells"
                 + (f"; A's margin there at most {max(f[-1] for f in flips):.3f}×" if flips else ""))
    if flips:
        lines += ["", "| mask | length | direction | fastest in A | fastest in B | A's margin |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {m} | {tables.seqlen_label(s)} | {d} | {wa} | {wb} | {mg:.3f}× |" for m, s, d, _, wa, wb, mg in flips]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="the first run's kernels.parquet")
    ap.add_argument("b", help="the second run's kernels.parquet")
    ap.add_argument("--seqlens", type=int, nargs="*", help="only these lengths (both tables)")
    args = ap.parse_args(argv)
    a, b = results.load(args.a), results.load(args.b)
    if args.seqlens:
        a, b = a[a["seqlen"].isin(args.seqlens)], b[b["seqlen"].isin(args.seqlens)]
    print(summary(a, b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
