"""The longest length that fits one GPU, per kernel × mask × direction: predicted by the memory model
fitted on the rows up to ``--fit-up-to`` tokens, and checked on the longer rows held out of the fit.

    python scripts/longest_fits.py TABLE.parquet [TABLE.parquet ...] [--fit-up-to 131072] [--masks ...]

Prints a Markdown table: the model's terms and points, its predicted longest length on the rows' GPU
(``longca.results.gpus``), the longest length measured ok and the first ``oom`` one, and the peak it
predicts at the longest ok length beside the measured peak there (the held-out error).  Only groups
measured past ``--fit-up-to`` are listed: the others have nothing held out.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from longca.results import memory_model, tables


def rows(kernels: pd.DataFrame, fit_up_to: int, masks: list[str] | None) -> list[dict]:
    measured = {tuple(e[k] for k in memory_model.GROUP): e
                for e in tables.longest_fits(kernels, masks, by=memory_model.GROUP)}
    limits = memory_model.limits(kernels[kernels["seqlen"] <= fit_up_to], masks)
    out = []
    for r in limits.to_dict("records"):
        e = measured.get(tuple(r[k] for k in memory_model.GROUP), {})
        if (e.get("largest_measured") or 0) <= fit_up_to:
            continue
        model = memory_model.MemoryFit(r["a"], r["b"], r["c"], ())
        longest_ok, peak = e.get("longest_ok"), e.get("peak_mem_bytes")
        error = (model.bytes(longest_ok) - peak) / peak if longest_ok and peak else None
        out.append({**r, "longest_ok": longest_ok, "first_oom": e.get("first_oom"), "measured_peak": peak,
                    "predicted_peak": model.bytes(longest_ok) if longest_ok else None, "error": error})
    return out


def markdown(entries: list[dict]) -> str:
    def tokens(n):
        return "—" if n is None or pd.isna(n) else f"{int(n) // 1024:,}K"

    def gib(b):
        return "—" if b is None or pd.isna(b) else f"{b / 2**30:.1f}"

    lines = ["| kernel | mask | dir | model (points) | predicted longest | longest ok | first oom | "
             "peak at longest ok: predicted / measured GiB (error) |", "|" + " --- |" * 8]
    for e in entries:
        err = "—" if e["error"] is None else f"{100 * e['error']:+.1f} %"
        lines.append(f"| {e['kernel']} | {e['mask']} | {e['direction']} | {e['terms']} ({e['points']}) | "
                     f"{tokens(e['predicted_longest'])} | {tokens(e['longest_ok'])} | {tokens(e['first_oom'])} | "
                     f"{gib(e['predicted_peak'])} / {gib(e['measured_peak'])} ({err}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="kernels.parquet files of one GPU model")
    parser.add_argument("--fit-up-to", type=int, default=131072, help="fit on rows up to this length (default 131072)")
    parser.add_argument("--masks", nargs="*", default=None, help="only these masks (default: all)")
    args = parser.parse_args(argv)
    kernels = pd.concat([pd.read_parquet(t) for t in args.tables], ignore_index=True)
    if args.masks:
        kernels = kernels[kernels["mask"].isin(args.masks)]
    print(markdown(rows(kernels, args.fit_up_to, args.masks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
