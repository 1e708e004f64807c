"""Tables, figures and the HTML report from whatever cells a run finished.

The workflow builds the report only once every cell of its grid exists.  A run stopped by its time
budget ends before that (docs/results/README.md): this renders the cells that did finish, with the
same library functions the workflow's aggregate, plot and report rules call, so the published
report shows exactly what was measured and nothing else.

    python scripts/render_results.py RUN/results docs/results/h200_2026-11-22 \\
        --config config/gpu.yaml run-overrides.yaml

Given a published ``kernels.parquet`` instead of a results folder, it renders from that table (with
the ``cp.parquet`` and ``ceilings.json`` beside it, where there are), so a fresh clone rebuilds a
published report from what is committed:

    python scripts/render_results.py docs/results/h100_2026-11-23/kernels.parquet /tmp/h100 \\
        --config config/gpu.yaml docs/results/h100_2026-11-23/overrides.yaml
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from workflow_config import resolved

from longca import config as config_mod
from longca.execution.measure import ceilings as ceilings_mod
from longca.results import parquet as results
from longca.results import plots, tables
from longca.results.report import Figures, render


NOT_MEASURED = "not_measured.txt"


def write_not_measured(path: Path, cells: list) -> None:
    """The grid's cells without a row, one per line, beside the table (none: no file).  It is what the
    table lacks, derived from it and the config each time, so a stale list never outlives its table."""
    if not cells:
        path.unlink(missing_ok=True)
        return
    path.write_text("# Cells of this table's grid with no row yet (scripts/render_results.py): a later run\n"
                    "# measures exactly these (restore the table's archives, then scripts/gpu_grid.sh).\n"
                    + "".join(f"{c.name}\n" for c in cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a run's results/ folder (cells/kernels, cells/cp, ceilings.json), "
                    "or a published kernels.parquet")
    ap.add_argument("out", type=Path)
    ap.add_argument("--config", nargs="*", default=[], help="the config files the run used, in order")
    ap.add_argument("--cp", type=Path, help="a published cp.parquet to keep beside these kernel cells (a "
                    "results folder restored from a kernel-cell archive has no CP cells)")
    args = ap.parse_args()
    if args.cp and not args.cp.is_file():
        ap.error(f"--cp {args.cp}: no such file")
    kept_cp = results.load(args.cp) if args.cp else None  # read first: it may be the file written below

    config = resolved(*args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.results.suffix == ".parquet":
        if not args.results.is_file():
            print(f"{args.results}: no such file", file=sys.stderr)
            return 2
        kernels = results.load(args.results)
        cp_table = args.results.with_name("cp.parquet")
        cp = results.load(cp_table) if cp_table.is_file() else tables.empty_cp()
        ceilings = ceilings_mod.load(args.results.with_name("ceilings.json"))
        if args.results.resolve() != (args.out / "kernels.parquet").resolve():
            shutil.copyfile(args.results, args.out / "kernels.parquet")
    else:
        kernel_cells = sorted((args.results / "cells" / "kernels").rglob("*.json"))
        cp_cells = sorted((args.results / "cells" / "cp").rglob("*.json"))
        if not kernel_cells and not cp_cells:
            print(f"no cells under {args.results / 'cells'}", file=sys.stderr)
            return 2
        results.aggregate(kernel_cells, args.out / "kernels.parquet", schema=results.KERNEL_SCHEMA)
        kernels = results.load(args.out / "kernels.parquet")
        if kept_cp is None:
            results.aggregate(cp_cells, args.out / "cp.parquet", schema=results.CP_SCHEMA)
            cp = results.load(args.out / "cp.parquet")
        ceilings = ceilings_mod.load(args.results / "ceilings.json")  # None when the run measured none
    if kept_cp is not None:  # from a parquet or a results folder alike
        cp = kept_cp
        if args.cp.resolve() != (args.out / "cp.parquet").resolve():
            shutil.copyfile(args.cp, args.out / "cp.parquet")

    # The config's mask order, keeping only masks with at least one finished cell.
    masks = [e.name for e in config_mod.mask_entries(config) if e.name in set(kernels["mask"])]
    cp_masks = sorted(set(cp["mask"])) if len(cp) else []
    figdir = args.out / "figures"
    figdir.mkdir(exist_ok=True)
    figures = Figures(plots.draw_all(plots.FigureData(kernels, cp, ceilings=ceilings, masks=masks), figdir, cp_masks))
    missing = tables.not_measured(kernels, config_mod.kernel_cells(config))
    render(kernels, args.out / "report.html", cp=cp, figures=figures, ceilings=ceilings, config=config, masks=masks,
           not_measured=missing)
    write_not_measured(args.out / NOT_MEASURED, missing)
    print(f"{len(kernels)} kernel cells, {len(cp)} CP cells -> {args.out}"
          + (f"; {len(missing)} cells of the grid have no row ({NOT_MEASURED})" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
