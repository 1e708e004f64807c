"""Two machines' kernel tables side by side: what the second one buys, per mask and length.

    python scripts/compare_gpus.py A/kernels.parquet B/kernels.parquet OUT.png \\
        --labels H100 H200 [--config config/gpu.yaml]

Matches the cells measured ok on both (kernel, mask, length, direction, dtype; the problem shape
must agree), draws a mask × length heatmap of B's fastest kernel over A's among the kernels both
measured (``longca.results.tables.best_kernel_ratios``), and prints two markdown tables: that
heatmap's numbers with the winning kernels, and the median ratio per kernel and direction over
every matched cell.  Read the ratios together with how each table was made (docs/results/README.md):
two runs are two moments of two machines, not a side-by-side measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workflow_config import resolved

from longca import config as config_mod
from longca.results import parquet as results
from longca.results import plots, tables


def markdown(best, pairs, label_a: str, label_b: str) -> str:
    lines = [f"| mask | length | direction | {label_a} fastest (TFLOPs/s) | {label_b} fastest (TFLOPs/s) | "
             f"{label_b} / {label_a} | kernels on both |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in best.itertuples():
        lines.append(f"| {r.mask} | {tables.seqlen_label(r.seqlen)} | {r.direction} | {r.kernel_a} {r.tflops_a:.0f} | "
                     f"{r.kernel_b} {r.tflops_b:.0f} | {r.ratio:.3f} | {r.kernels} |")
    lines += ["", f"| kernel | direction | cells | median {label_b} / {label_a} | min | max |",
              "| --- | --- | --- | --- | --- | --- |"]
    for (kernel, direction), g in pairs.groupby(["kernel", "direction"]):
        lines.append(f"| {kernel} | {direction} | {len(g)} | {g['ratio'].median():.3f} | {g['ratio'].min():.3f} | "
                     f"{g['ratio'].max():.3f} |")
    return "\n".join(lines)


def memory_markdown(ratios, label_a: str, label_b: str, worst: int = 10) -> str:
    """One call's memory on both machines: the share within 5 %, and the cells that differ most."""
    agreement = tables.memory_agreement(ratios)
    if not agreement["cells"]:
        return "\nMemory: no cell has a memory figure on both machines."
    lines = [f"\nMemory (one call's need), {agreement['cells']} cells with a figure on both: "
             f"{agreement['agree']} ({agreement['share']:.1%}) within 5 %; {label_b} / {label_a} median "
             f"{agreement['median']:.3f}, range {agreement['min']:.3f}–{agreement['max']:.3f}.", "",
             f"| kernel | mask | length | direction | {label_a} MiB | {label_b} MiB | {label_b} / {label_a} |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    far = ratios.assign(off=(ratios["ratio"] - 1).abs()).sort_values("off", ascending=False).head(worst)
    for r in far.itertuples():
        lines.append(f"| {r.kernel} | {r.mask} | {r.seqlen} | {r.direction} | {r.mem_a / 2**20:,.0f} | "
                     f"{r.mem_b / 2**20:,.0f} | {r.ratio:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="the first machine's kernels.parquet")
    ap.add_argument("b", type=Path, help="the second machine's kernels.parquet")
    ap.add_argument("out", type=Path, help="the figure (PNG)")
    ap.add_argument("--labels", nargs=2, default=["A", "B"], metavar=("A", "B"))
    ap.add_argument("--config", nargs="*", default=[], help="config files whose mask order the figure follows")
    args = ap.parse_args(argv)
    for path in (args.a, args.b):
        if not path.is_file():
            ap.error(f"{path}: no such file (a kernels.parquet of a run)")
    a, b = results.load(args.a), results.load(args.b)
    pairs = tables.device_ratios(a, b)
    best = tables.best_kernel_ratios(pairs)
    masks = None
    if args.config:
        masks = [e.name for e in config_mod.mask_entries(resolved(*args.config))]
        order = {m: i for i, m in enumerate(masks)}
        best = best.sort_values(["direction", "mask", "seqlen"], key=lambda c: c.map(order) if c.name == "mask" else c)
    plots.save(plots.device_ratio_figure(best, *args.labels, masks=masks), args.out)
    print(markdown(best, pairs, *args.labels))
    print(f"\n{len(pairs)} kernel cells ok on both; {len(best)} mask x length x direction cells -> {args.out}")
    print(memory_markdown(tables.memory_ratios(a, b), *args.labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
