"""The tables a CP results page quotes, computed from its committed Parquet (so they can be checked).

    python lab/longca_lab/cp_summary.py docs/results/cp_4xh100_graphs_2026-11-27/cp.parquet \\
        --kernels docs/results/h100_2026-11-23/kernels.parquet \\
        [--before docs/results/cp_4xh100_2026-11-27/cp.parquet] [--tie 0.05] [--by-local-kernel]

Prints Markdown: the best strategy per mask × tokens per GPU × cp_size (2, 4) × direction, with its
p20–p80 spread, the strategies tied with it (``tables.tied_with``, the kernel tables' rule: a strategy
whose figure × (1 + tie) reaches the best's), the scaling against cp_size 1 and the ratio to the
fastest one-GPU kernel of ``--kernels`` on the same total problem (``longca.results.tables.cp_efficiency``);
with ``--before``, the per-cell ratio of this table's per-GPU TFLOPs/s to another table's (same
strategy, mask, tokens per GPU, cp_size, direction), per strategy × mask.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from longca.api import parquet, tables

KEYS = ["strategy", "mask", "tokens_per_rank", "cp_size", "direction", "dtype"]


def _k(n: int) -> str:
    return f"{n // 1024}K"


def best_table(cp: pd.DataFrame, kernels: pd.DataFrame, tie: float) -> str:
    rows = tables.cp_efficiency(tables.layout_means(cp), kernels)  # a cell's layouts: their mean
    ok = rows[(rows["status"] == "ok") & (rows["cp_size"] > 1)]
    lines = ["| mask | tokens/GPU | dir | cp | best (of n) | TFLOPs/s per GPU (p20–p80) | tied within "
             f"{tie:.0%} | scaling vs cp 1 | vs best one GPU | best one-GPU kernel | area max/mean |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = tables.mask_order(ok, None)
    for (mask, tpr, direction, size), group in sorted(
            ok.groupby(["mask", "tokens_per_rank", "direction", "cp_size"]),
            key=lambda item: (order.index(item[0][0]), item[0][1], item[0][2], item[0][3])):
        ranked = group.sort_values("tflops_per_gpu", ascending=False)
        top = ranked.iloc[0]
        tied = tables.tied_with(ranked, "tflops_per_gpu", "strategy", tie)  # the kernel tables' rule
        areas = top["rank_area"]
        imbalance = max(areas) / (sum(areas) / len(areas)) if areas is not None and sum(areas) else float("nan")
        one = (f"{top['one_gpu_kernel']} {top['one_gpu_tflops']:.0f}" if pd.notna(top["one_gpu_tflops"])
               else "none at that length")
        vs = f"{top['vs_one_gpu']:.2f}" if pd.notna(top["vs_one_gpu"]) else "–"
        scaling = f"{top['scaling']:.2f}" if pd.notna(top["scaling"]) else "–"
        lines.append(f"| {mask} | {_k(int(tpr))} | {direction} | {size} | {top['strategy']} ({len(ranked)}) | "
                     f"{top['tflops_per_gpu']:.0f} ({top['tflops_per_gpu_p20']:.0f}–{top['tflops_per_gpu_p80']:.0f}) | "
                     f"{','.join(tied) or '–'} | {scaling} | {vs} | {one} | {imbalance:.3f} |")
    return "\n".join(lines)


def before_after(cp: pd.DataFrame, before: pd.DataFrame) -> str:
    ok = lambda df: df[df["status"] == "ok"].assign(tokens_per_rank=tables.tokens_per_rank(df))  # noqa: E731
    both = ok(cp).merge(ok(before), on=KEYS, suffixes=("", "_before"))
    both["ratio"] = both["tflops_per_gpu"] / both["tflops_per_gpu_before"]
    multi = both[both["cp_size"] > 1]
    lines = [f"{len(both)} cells in both tables ({len(multi)} at cp_size 2 and 4); per-GPU TFLOPs/s now ÷ before, "
             "median (min–max) over the cells at cp_size 2 and 4:", "",
             "| mask | " + " | ".join(sorted(multi["strategy"].unique())) + " |",
             "|---|" + "---|" * multi["strategy"].nunique()]
    for mask, group in multi.groupby("mask"):
        cells = []
        for strategy in sorted(multi["strategy"].unique()):
            r = group[group["strategy"] == strategy]["ratio"]
            cells.append(f"{r.median():.2f} ({r.min():.2f}–{r.max():.2f})" if len(r) else "–")
        lines.append(f"| {mask} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cp", type=Path, nargs="+", help="a cp.parquet (several: their rows together)")
    ap.add_argument("--kernels", type=Path, required=True, help="the kernel table of the same GPU model")
    ap.add_argument("--before", type=Path, help="another cp.parquet to compare cell by cell")
    ap.add_argument("--tie", type=float, default=0.05, help="tie margin (default 0.05)")
    ap.add_argument("--by-local-kernel", action="store_true",
                    help="name each strategy with its local kernel (strategy·kernel), so one strategy on two "
                         "local kernels is two contenders, each scaled against its own cp_size 1")
    args = ap.parse_args()
    cp = pd.concat([parquet.load(p) for p in args.cp], ignore_index=True)
    if args.by_local_kernel:
        cp["strategy"] = cp["strategy"] + "·" + cp["local_kernel"].fillna("?")
    print(best_table(cp, parquet.load(args.kernels), args.tie))
    if args.before:
        print()
        print(before_after(cp, parquet.load(args.before)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
