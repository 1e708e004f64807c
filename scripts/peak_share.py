"""A run's ok rows beside the dense peak at the SM clock sampled while each was timed, as Markdown.

    python scripts/peak_share.py RUN/kernels.parquet RUN/gpu_clocks.csv [--where dtype=float8_e4m3fn ...]

``gpu_clocks.csv`` is what ``scripts/gpu_grid.sh`` writes beside a run; the arithmetic and the
window are ``longca.results.peak``'s.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from longca.results import peak


def table(rows: pd.DataFrame) -> str:
    head = "| kernel | mask | dtype | dir | tokens | TFLOP/s (p20–p80) | SM MHz | peak at it | % of peak |"
    lines = [head, "|" + " --- |" * 9]
    for r in rows.itertuples(index=False):
        pct = "—" if pd.isna(r.pct_of_peak) else f"{r.pct_of_peak:.0f} %"
        mhz = "—" if pd.isna(r.sm_clock_mhz) else f"{r.sm_clock_mhz:.0f}"
        top = "—" if pd.isna(r.peak_tflops_at_clock) else f"{r.peak_tflops_at_clock:.0f}"
        lines.append(f"| {r.kernel} | {r.mask} | {r.dtype} | {r.direction} | {r.seqlen // 1024}K | "
                     f"{r.tflops:.0f} ({r.tflops_p20:.0f}–{r.tflops_p80:.0f}) | {mhz} | {top} | {pct} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", help="a run's kernels.parquet")
    parser.add_argument("clocks", help="the run's gpu_clocks.csv")
    parser.add_argument("--where", nargs="*", default=[], metavar="COLUMN=VALUE", help="keep rows where COLUMN is VALUE")
    args = parser.parse_args(argv)
    rows = pd.read_parquet(args.kernels)
    rows = rows[rows["status"] == "ok"]
    for clause in args.where:
        column, _, value = clause.partition("=")
        rows = rows[rows[column].astype(str) == value]
    rows = peak.with_peak_share(rows, peak.read_clocks(args.clocks))
    rows = rows.sort_values(["seqlen", "mask", "direction", "dtype", "kernel"])
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
