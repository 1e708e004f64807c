"""The run-to-run spread of one table measured twice: what a margin between contenders must exceed.

    python lab/longca_lab/run_to_run.py A/kernels.parquet B/kernels.parquet [--seqlens 4096]
    python lab/longca_lab/run_to_run.py A/cp.parquet B/cp.parquet

Matches the cells of the two runs (a kernel table by kernel, mask, length, direction and dtype; a CP
table by strategy, mask, tokens per GPU, cp_size, direction and dtype; the problem shape must be the
same) and prints, in markdown: how many statuses agree, the ratio B / A of the cells ok on both
(median, range, how many within 1-10 %, quantiles of |ratio - 1|), and every group (mask × length ×
direction; for CP also × cp_size) whose fastest contender (kernel or strategy) differs between the
runs, with the margin the first run gave its winner there: a winner by less than that is a tie (the
report's ``tie_margin``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pandas as pd

from longca.api import parquet as results
from longca.api import tables


@dataclass(frozen=True)
class TableKind:
    contender: str          # what competes within a group
    group: tuple[str, ...]  # one comparison: the contenders of one problem
    value: str              # the figure compared
    length: str             # the column a --seqlens filter reads

    @property
    def keys(self) -> list[str]:
        return [self.contender, *self.group]


KERNELS = TableKind("kernel", ("mask", "seqlen", "direction", "dtype"), "tflops", "seqlen")
CP = TableKind("strategy", ("mask", "tokens_per_rank", "cp_size", "direction", "dtype"), "tflops_per_gpu",
               "tokens_per_rank")


def kind_of(table: pd.DataFrame) -> TableKind:
    return CP if "strategy" in table.columns else KERNELS


def ratios(a: pd.DataFrame, b: pd.DataFrame, kind: TableKind) -> pd.DataFrame:
    """Per cell ok in both runs: ``value_a``, ``value_b`` and ``ratio`` (b / a)."""
    both = tables.ok_on_both(a, b, kind.keys, kind.value)
    out = both[kind.keys].copy()
    out["value_a"], out["value_b"] = both[kind.value + "_a"], both[kind.value + "_b"]
    out["ratio"] = out["value_b"] / out["value_a"]
    return out.reset_index(drop=True)


def _label(column: str, value) -> str:
    return tables.seqlen_label(value) if column in ("seqlen", "tokens_per_rank") else str(value)


def summary(a: pd.DataFrame, b: pd.DataFrame) -> str:
    kind = kind_of(a)
    both = a.merge(b, on=kind.keys, suffixes=("_a", "_b"))
    pairs = ratios(a, b, kind)
    off = (pairs["ratio"] - 1).abs()
    lines = [f"cells in both runs: {len(both)}; same status: {int((both['status_a'] == both['status_b']).sum())}; "
             f"ok in both: {len(pairs)}",
             f"B / A: median {pairs['ratio'].median():.4f}, range {pairs['ratio'].min():.3f}–{pairs['ratio'].max():.3f}",
             "", "| within | cells |", "| --- | --- |"]
    lines += [f"| {t:.0%} | {int((off <= t).sum())} of {len(pairs)} |" for t in (0.01, 0.02, 0.03, 0.05, 0.10)]
    lines += ["", "| quantile of \\|B/A − 1\\| | " + " | ".join(f"{q:.0%}" for q in (0.5, 0.9, 0.95, 0.99, 1.0)) + " |",
              "| --- |" + " --- |" * 5,
              "| | " + " | ".join(f"{off.quantile(q):.2%}" for q in (0.5, 0.9, 0.95, 0.99, 1.0)) + " |", ""]
    shown = [c for c in kind.group if c != "dtype"]
    flips = []
    for key, group in pairs.groupby(list(kind.group), sort=True):
        if len(group) < 2:
            continue
        by_a = group.sort_values("value_a", ascending=False)
        win_a, win_b = by_a.iloc[0][kind.contender], group.loc[group["value_b"].idxmax(), kind.contender]
        if win_a != win_b:
            margin = by_a.iloc[0]["value_a"] / group.loc[group[kind.contender] == win_b, "value_a"].iloc[0]
            named = dict(zip(kind.group, key))
            flips.append(([_label(c, named[c]) for c in shown], win_a, win_b, margin))
    groups = pairs.groupby(list(kind.group)).ngroups
    lines.append(f"fastest {kind.contender} differs in {len(flips)} of {groups} {' × '.join(shown)} cells"
                 + (f"; A's margin there at most {max(f[-1] for f in flips):.3f}×" if flips else ""))
    if flips:
        lines += ["", f"| {' | '.join(shown)} | fastest in A | fastest in B | A's margin |",
                  "|" + " --- |" * (len(shown) + 3)]
        lines += [f"| {' | '.join(labels)} | {wa} | {wb} | {mg:.3f}× |" for labels, wa, wb, mg in flips]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="the first run's kernels.parquet or cp.parquet")
    ap.add_argument("b", help="the second run's table of the same kind")
    ap.add_argument("--seqlens", type=int, nargs="*", help="only these lengths (tokens per GPU for CP), both tables")
    args = ap.parse_args(argv)
    a, b = results.load(args.a), results.load(args.b)
    if kind_of(a) != kind_of(b):
        ap.error(f"{args.a} and {args.b} are not the same kind of table (one kernel, one CP)")
    if args.seqlens:
        column = kind_of(a).length
        a, b = a[a[column].isin(args.seqlens)], b[b[column].isin(args.seqlens)]
    print(summary(a, b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
