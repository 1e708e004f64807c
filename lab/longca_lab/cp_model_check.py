"""How well ``longca predict`` (``longca.results.cp_model``) predicts CP cells it was not fitted on.

    python lab/longca_lab/cp_model_check.py [--figures DIR] > docs/results/cp_model_2026-11-27.md

Three held-out checks on the published CP tables, each fitted on one part and checked on another:
4 × H100 (fitted at cp_size 2, checked at cp_size 4), 2 × H200 (fitted at 16K tokens per GPU,
checked at 64K) and 4 × H200 (measured after the model was written: fitted at cp_size 2, checked at
cp_size 4); then the H100 model (fitted on its whole table) against the figures MagiAttention
published for cp_size 8–64 on H100 at 8K tokens per GPU (``lab/data/magiattention_cp_h100.csv``,
read from its charts), with a network it does not state: 50 GB/s per GPU (8 × 400 Gb/s per node)
assumed.  Prints Markdown: per strategy and per mask the median |predicted / measured - 1|, the
strategy ranking's agreement, and the chart comparison.  ``--figures DIR`` also draws, per mask of
the charts, the H100 model's curves to 96 GPUs with the measured points and MagiAttention's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from longca.api import cp_model

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
# (name, cp table, kernel table, rows to fit on, rows to check, what is held out)
CHECKS = [
    ("4 × H100", "cp_4xh100_graphs_2026-11-27", "h100_2026-11-23",
     lambda cp: cp["cp_size"] <= 2, lambda cp: cp["cp_size"] == 4, "fitted at cp_size 2, checked at cp_size 4"),
    ("2 × H200", "cp_2xh200_2026-11-27", "h200_2026-11-23",
     lambda cp: cp["tokens_per_rank"] == 16384, lambda cp: cp["tokens_per_rank"] == 65536,
     "fitted at 16K tokens per GPU, checked at 64K"),
    ("4 × H200", "cp_4xh200_2026-11-27", "h200_2026-11-23",
     lambda cp: cp["cp_size"] <= 2, lambda cp: cp["cp_size"] == 4, "fitted at cp_size 2, checked at cp_size 4"),
]


def _median_abs(errors: pd.Series) -> str:
    return f"{errors.abs().median() * 100:.0f} %"


def held_out_section(name, cp_dir, kernel_dir, fit_rows, check_rows, what) -> list[str]:
    cp = pd.read_parquet(RESULTS / cp_dir / "cp.parquet")
    kernels = pd.read_parquet(RESULTS / kernel_dir / "kernels.parquet")
    model = cp_model.fit(cp, kernels, fit_rows(cp))
    fitted = cp_model.held_out(model, cp, fit_rows(cp) & (cp["cp_size"] > 1))
    checked = cp_model.held_out(model, cp, check_rows(cp) & (cp["cp_size"] > 1))
    agree, total = cp_model.ranking_agreement(checked)
    lines = [f"### {name}: {what}", "",
             f"Fitted: NVLink {model.links.nvlink_gbs:.0f} GB/s, {model.call_s * 1e6:.0f} µs per local call, "
             f"{model.row_s * 1e9:.0f} ns per query row a call reduces into; {len(fitted)} rows fitted on (median "
             f"|error| {_median_abs(fitted['error'])}), **{len(checked)} held-out rows: median |error| "
             f"{_median_abs(checked['error'])}**, 90th percentile {checked['error'].abs().quantile(0.9) * 100:.0f} %; "
             f"the predicted best strategy is the measured best or tied (5 %) in **{agree} of {total}** "
             "mask × length × direction cells.", "",
             "| held out | rows | median abs error | median signed error |", "|---|---|---|---|"]
    for key in ("strategy", "mask"):
        for value, g in checked.groupby(key):
            lines.append(f"| {key} {value} | {len(g)} | {_median_abs(g['error'])} | {g['error'].median() * 100:+.0f} % |")
    return lines + [""]


def magi_section() -> list[str]:
    charts = pd.read_csv(REPO / "lab" / "data" / "magiattention_cp_h100.csv")
    cp = pd.read_parquet(RESULTS / "cp_4xh100_graphs_2026-11-27" / "cp.parquet")
    kernels = pd.read_parquet(RESULTS / "h100_2026-11-23" / "kernels.parquet")
    lines = ["### Against MagiAttention's H100 charts (cp_size 8–64, 8K tokens per GPU, forward)", "",
             "Their strategies (FA3 local kernel, their own ring and Ulysses, their document lengths) against "
             "this model of LongCA's (FFA local kernel, LongCA's default histogram), fitted on the whole 4 × H100 "
             "table; 8 GPUs per node, the network assumed at 50 GB/s per GPU.", "",
             "| strategy (theirs → ours) | mask | cp | MagiAttention | predicted | ratio |", "|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    for (strategy, mask), g in charts.groupby(["longca_strategy", "mask"]):
        _, table = cp_model.predictions(cp, kernels, [strategy], mask, "fwd", 8192, sorted(g["cp_size"]))
        for row in g.itertuples():
            pred = table.loc[table["cp_size"] == row.cp_size, "tflops_per_gpu"].iloc[0]
            ratios.setdefault(strategy, []).append(pred / row.tflops_per_gpu)
            lines.append(f"| {row.strategy} → {strategy} | {mask} | {row.cp_size} | {row.tflops_per_gpu:.0f} | "
                         f"{pred:.0f} | {pred / row.tflops_per_gpu:.2f} |")
    lines += [""] + [f"* {s}: median |ratio − 1| {pd.Series(r).sub(1).abs().median() * 100:.0f} %" for s, r in ratios.items()]
    return lines + [""]


FIGURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 96]


def draw_figures(outdir: Path) -> list[Path]:
    """Per mask of MagiAttention's charts, forward at 8K tokens per GPU on H100: predicted curves to
    96 GPUs, the measured points, their figures."""
    from longca.api import plots

    charts = pd.read_csv(REPO / "lab" / "data" / "magiattention_cp_h100.csv")
    cp = pd.read_parquet(RESULTS / "cp_4xh100_graphs_2026-11-27" / "cp.parquet")
    kernels = pd.read_parquet(RESULTS / "h100_2026-11-23" / "kernels.parquet")
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for mask, published in charts.groupby("mask"):
        strategies = sorted(published["longca_strategy"].unique())
        _, predicted = cp_model.predictions(cp, kernels, strategies, mask, "fwd", 8192, FIGURE_SIZES)
        measured = cp[(cp["status"] == "ok") & (cp["mask"] == mask) & (cp["direction"] == "fwd")
                      & (cp["tokens_per_rank"] == 8192) & cp["strategy"].isin(strategies)]
        theirs = published.assign(strategy=published["longca_strategy"], label="MagiAttention's charts")
        fig = plots.cp_prediction_figure(
            predicted, measured[["strategy", "cp_size", "tflops_per_gpu"]],
            f"{mask}, forward, 8K tokens per GPU, H100\ndashed: predicted by longca predict (a model, not "
            "measured); open squares: MagiAttention's own strategies", theirs)
        path = outdir / f"cp_predicted_{mask}.png"
        fig.savefig(path)
        written.append(path)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--figures", type=Path, help="also draw the prediction figures into this folder")
    args = p.parse_args(argv)
    lines = ["## Held-out checks", ""]
    for check in CHECKS:
        lines += held_out_section(*check)
    lines += magi_section()
    print("\n".join(lines))
    if args.figures:
        draw_figures(args.figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
