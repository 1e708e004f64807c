"""The tables a sparse-study results page quotes, computed from its committed Parquet.

    python lab/longca_lab/sparse_summary.py docs/results/sparse_h100_2026-11-27/kernels.parquet [--tie 0.05]

Prints Markdown: per block size × kept fraction × length × direction, each block-sparse kernel's
TFLOPs/s (on the kept tiles) and time (a status marker where it has no number, — where the table
has no row), the fastest dense kernel on the full mask at that length
and its time, and the best sparse kernel's speed against it (dense time ÷ sparse time,
``longca.results.sparse.answers``); kernels within ``--tie`` of the best are named as tied.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from longca.api import parquet, sparse, tables


def _k(n: int) -> str:
    return f"{n // 1024}K"


def kernel_table(kernels: pd.DataFrame, tie: float) -> str:
    rows = sparse.sparse_rows(kernels)
    names = sorted(set(tables.ok_rows(rows)["kernel"]))
    answers = {(e["tiles"], e["block"], e["kept"], e["seqlen"], e["direction"], e["dtype"]): e
               for e in sparse.answers(kernels, tie)}
    head = (["block", "kept (exact)", "length", "dir"] + [f"{n} TFLOPs/s (ms)" for n in names]
            + ["fastest dense on full (ms)", "speed-up of the best (dense ÷ sparse time)", "tied within " + f"{tie:.0%}"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, group in rows.groupby(sparse.GROUP, sort=True):
        e = answers[key]
        cells = []
        for name in names:
            r = group[group["kernel"] == name]
            ok = tables.ok_rows(r)
            cells.append(f"{ok['tflops'].iloc[0]:.0f} ({ok['median_ms'].iloc[0]:.2f})" if len(ok)
                         else (tables.status_marker(r["status"].iloc[0]) if len(r) else "—"))
        dense = f"{e['dense_kernel']} ({e['dense_ms']:.2f})" if e["dense_kernel"] else "—"
        speed = f"**{e['speedup']:.2f}×**" if e["speedup"] else "—"
        tied = ", ".join([e["kernel"], *e.get("tied", [])]) if e.get("tie") else (e["kernel"] or "—")
        lines.append(f"| {sparse.block_label(key[0], key[1])} | {key[2]} ({e['kept_actual']:.3f}) | {_k(key[3])} | {key[4]} | "
                     + " | ".join(cells) + f" | {dense} | {speed} | {tied} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernels", type=Path, help="a kernels.parquet with block_sparse_heads rows")
    ap.add_argument("--tie", type=float, default=0.05, help="kernels within this of the best are tied")
    args = ap.parse_args(argv)
    print(kernel_table(parquet.load(args.kernels), args.tie))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
