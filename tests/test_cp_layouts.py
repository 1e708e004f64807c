"""`cp_layouts`: CP cells of a document mask measured on several document layouts, averaged in the
report.  Layout 0 is the cell as it is with one layout; layout i is `<mask>~layout<i>` at seed + i."""

import json

import pandas as pd
import pytest
from snakemake_run import planned_cells, snakemake, write_config

import tiny
from longca import cells, config
from longca.results import tables
from longca.results.parquet import load

DOCS = {"name": "docs", "pattern": "varlen_causal", "params": {"histogram": {"edges": [8, 32], "weights": [1]}}}
GIVEN = {"name": "given", "pattern": "varlen_causal", "params": {"documents": [32, 96]}}


def _grid(**overrides):
    return config.validate(tiny.grid(masks=["causal", DOCS, GIVEN], cp_strategies=["ring"], cp_sizes=[2],
                                     cp_tokens_per_rank=[64], seqlens=[128], **overrides))


def test_layouts_multiply_only_the_cells_of_masks_that_draw_documents_and_keep_layout_zero():
    one, three = _grid(), _grid(cp_layouts=3)
    assert [c.mask for c in config.cp_cells(one)] == ["causal", "docs", "given"]
    assert [c.mask for c in config.cp_cells(three)] == ["causal", "docs", "docs~layout1", "docs~layout2", "given"]
    settings = lambda cfg, mask: config.cp_cell_settings(cfg, "ring", mask, 64, 2, "fwd", "float32")
    # Layout 0's cell is the same cell (same settings, so the same cache key and row) either way.
    assert settings(three, "docs") == settings(one, "docs")
    second = settings(three, "docs~layout2")
    assert second["seed"] == one["seed"] + 2 and second["mask"] == "docs~layout2"
    assert {k: v for k, v in second.items() if k not in ("seed", "mask")} == \
           {k: v for k, v in settings(one, "docs").items() if k not in ("seed", "mask")}
    assert cells.split_layout("docs~layout12") == ("docs", 12) and cells.split_layout("a~layoutx") == ("a~layoutx", 0)
    with pytest.raises(config.ConfigError, match="config.cp_layouts"):
        _grid(cp_layouts=0)


def test_three_layouts_are_three_different_draws_of_documents():
    import torch

    from longca.execution.measure.cp_cell import CPSpec

    cfg = _grid(cp_layouts=3)
    drawn = {}
    for cell in config.cp_cells(cfg):
        if cell.mask.startswith("docs"):
            spec = CPSpec.from_dict(config.cp_cell_settings(cfg, "ring", cell.mask, 64, 2, "fwd", "float32"))
            drawn[cell.mask] = tuple(map(str, spec.problem(torch.device("cpu")).mask.slices))
    assert len(drawn) == 3 and len(set(drawn.values())) == 3


def _row(mask, tflops, status="ok", seed=0):
    return {"cell_id": f"ring/{mask}/float32_fwd_64x2", "strategy": "ring", "mask": mask, "cp_size": 2,
            "seqlen": 128, "direction": "fwd", "dtype": "float32", "status": status, "reason": None,
            "tflops_per_gpu": tflops, "tflops_per_gpu_p20": tflops, "tflops_per_gpu_p80": tflops,
            "median_ms": 1.0 / tflops if tflops else None, "flops": 1.0, "seed": seed}


def test_layout_means_average_the_ok_layouts_and_name_the_cell_by_layout_zero():
    cp = pd.DataFrame([_row("docs", 10.0), _row("docs~layout1", 20.0, seed=1), _row("docs~layout2", None, "error", 2),
                       _row("causal", 30.0)])
    out = tables.layout_means(cp).set_index("cell_id")
    docs = out.loc["ring/docs/float32_fwd_64x2"]
    assert (docs["mask"], docs["status"], docs["layouts"]) == ("docs", "ok", 2)
    assert (docs["tflops_per_gpu"], docs["layout_min"], docs["layout_max"]) == (15.0, 10.0, 20.0)
    assert docs["layout_std"] == pytest.approx(50 ** 0.5)  # sample std of 10 and 20
    assert out.loc["ring/causal/float32_fwd_64x2", "tflops_per_gpu"] == 30.0 and len(out) == 2
    plain = cp[~cp["mask"].str.contains("~")]
    assert tables.layout_means(plain) is plain  # one layout: the table as it is


def test_a_wrong_layout_makes_the_averaged_cell_wrong_naming_the_layout():
    wrong = {**_row("docs~layout2", 12.0, "wrong", 2), "reason": "relative L2 error 3e-1"}
    cp = pd.DataFrame([_row("docs", 10.0), _row("docs~layout1", 20.0, seed=1), wrong])
    docs = tables.layout_means(cp).iloc[0]
    assert docs["status"] == "wrong" and docs["reason"] == "layout 2: relative L2 error 3e-1"
    assert (docs["layouts"], docs["tflops_per_gpu"]) == (2, 15.0)  # the mean still of the ok layouts alone
    assert tables.best_strategies(tables.cp_efficiency(tables.layout_means(cp), pd.DataFrame()))[0]["strategy"] is None


@pytest.mark.slow
def test_the_workflow_measures_each_layout_and_the_report_shows_their_mean(tmp_path):
    """Real Snakemake, two ranks (torchrun, gloo): the document mask's cell at layouts 0 and 1 with
    different documents, both in cp.parquet, the report's CP table with their mean; back at one
    layout nothing is measured again."""
    grid = tiny.grid(masks=[DOCS], cp_masks=["docs"], cp_strategies=["ring"], cp_sizes=[2], cp_tokens_per_rank=[64],
                     cp_options={"ring": {"local_kernel": "sdpa_math"}}, kernels=["sdpa_math"], seqlens=[128],
                     cp_layouts=2)
    write_config(tmp_path, grid)
    proc = snakemake(tmp_path, "all")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {r["cell_id"]: r for r in load(tmp_path / "results" / "cp.parquet").to_dict("records")}
    first, second = rows["ring/docs/float32_fwd_64x2"], rows["ring/docs~layout1/float32_fwd_64x2"]
    assert first["status"] == second["status"] == "ok", (first["reason"], second["reason"])
    assert (first["seed"], second["seed"]) == (0, 1)
    # Other documents: another count here, so another attended area.
    assert json.loads(first["mask_params_resolved"])["seed"] == 0 and first["area"] != second["area"]
    report = (tmp_path / "results" / "report.html").read_text()
    assert ">layouts<" in report and "ring/docs~layout1" not in report.split('id="cp-table"')[1].split("</table>")[0]
    write_config(tmp_path, {**grid, "cp_layouts": 1})
    assert planned_cells(tmp_path) == set()


def test_a_failed_layout_is_listed_among_the_reports_failed_cells_though_its_cell_ran_ok(tmp_path):
    """The CP table averages a cell's ok layouts; the failed cells keep every layout's own row."""
    import report_data as rd

    from longca.results import report

    rows = rd.cp_rows()
    ok = next(r for r in rows if r["status"] == "ok" and r["cp_size"] == 2)
    failed = {**ok, "cell_id": ok["cell_id"].replace("/causal/", "/causal~layout1/"), "mask": "causal~layout1",
              "status": "error", "reason": "layout 1 crashed", "tflops_per_gpu": None}
    cp = pd.concat([rd.cp_df(), pd.DataFrame([failed])], ignore_index=True)
    ctx = report.context(rd.kernels_df(), cp=cp)
    assert failed["cell_id"] in {f["cell_id"] for f in ctx["failed"]}
    assert failed["cell_id"] not in {r["cell_id"] for r in tables.cp_table(cp, rd.kernels_df()).to_dict("records")}
