"""End to end on the CPU: a grid of two shapes (head dim 16 and 32, batch 1 and 2 at the same
tokens) and a model preset, through the real Snakemake to the report, and one row's reproduce
command run as a user runs it."""

import html as html_lib
import json
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from snakemake_run import snakemake as run_snakemake

from longca.attention import masks
from longca.attention.flops import attention_flops
from longca.results.parquet import load

pytestmark = pytest.mark.slow

TINY_PRESET = {"name": "tiny_lm", "title": "Tiny-LM-like", "heads_q": 4, "heads_kv": 1, "head_dim": 16,
               "masks": ["causal", {"name": "window32", "pattern": "sliding_window_causal", "params": {"window": 32}}]}
SHAPES = {
    "device": "cpu", "threads": 1,
    "kernels": ["sdpa_math", "sdpa"],
    "masks": ["causal"],
    "seqlens": [128],
    "directions": ["fwd"],
    "dtypes": ["float32"],
    "heads_q": 4, "heads_kv": 2, "head_dim": 16, "batch": 1,
    "head_dims": [16, 32],
    "batches": [1, 2],
    "models": [TINY_PRESET],
    "gate_seqlen": 64,
    "timing": {"warmup": 1, "reps": 2},
    "cp_strategies": [],
}
# causal at 2 head dims x 2 batches, the preset's 2 masks at 2 batches: 8 masks x 2 kernels.
LABELS = {"causal": (4, 2, 16, 1), "causal@h4k2d16b2": (4, 2, 16, 2), "causal@h4k2d32b1": (4, 2, 32, 1),
          "causal@h4k2d32b2": (4, 2, 32, 2), "causal@h4k1d16b1": (4, 1, 16, 1), "causal@h4k1d16b2": (4, 1, 16, 2),
          "window32@h4k1d16b1": (4, 1, 16, 1), "window32@h4k1d16b2": (4, 1, 16, 2)}


@pytest.fixture(scope="module")
def shaped_run(repo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("shapes")
    (workdir / "config.yaml").write_text(yaml.safe_dump(SHAPES))
    proc = run_snakemake(workdir, "all", snakefile=repo / "Snakefile")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_each_shape_is_its_own_cell_and_the_grid_shape_keeps_its_path(shaped_run):
    files = {str(p.relative_to(shaped_run / "results" / "cells" / "kernels"))
             for p in (shaped_run / "results" / "cells" / "kernels").rglob("*.json")}
    expected = {f"{k}/{label}/float32_fwd_{128 // batch}.json"
                for k in SHAPES["kernels"] for label, (_, _, _, batch) in LABELS.items()}
    assert files == expected
    assert "sdpa/causal/float32_fwd_128.json" in files  # the grid's own shape: today's path


def test_rows_carry_their_shape_model_and_flops(shaped_run):
    df = load(shaped_run / "results" / "kernels.parquet")
    assert len(df) == 16 and set(df["status"]) == {"ok"}
    for row in df.itertuples():
        heads_q, heads_kv, head_dim, batch = LABELS[row.mask]
        assert (row.heads_q, row.heads_kv, row.head_dim, row.batch) == (heads_q, heads_kv, head_dim, batch)
        assert row.seqlen * row.batch == 128  # batch b at the same tokens
        m = masks.build(row.pattern, row.seqlen, **json.loads(row.mask_params))
        assert row.flops == attention_flops(m, heads_q, head_dim, row.direction, batch)
        assert (row.model if isinstance(row.model, str) else None) == ("tiny_lm" if "@h4k1" in row.mask else None)


def test_the_report_answers_per_model_on_its_first_table(shaped_run):
    page = (shaped_run / "results" / "report.html").read_text()
    assert page.index('id="by-model"') < page.index('id="by-seqlen"')
    table = page[page.index('id="model-table"'):page.index("</table>", page.index('id="model-table"'))]
    assert table.count("Tiny-LM-like") == 4  # causal and window32, each at batch 1 and 2
    assert "window32" in table and "4:1 · d16 · batch 2" in table
    assert len(re.findall(r'class="model-winner"', table)) == 4


def test_a_rows_reproduce_command_measures_that_cell_alone(shaped_run, tmp_path):
    page = (shaped_run / "results" / "report.html").read_text()
    commands = [html_lib.unescape(c) for c in re.findall(r"<td class=\"text\">(longca run-cell [^<]+)</td>", page)]
    assert len(commands) == 16
    (command,) = [c for c in commands if "--out results/cells/kernels/sdpa/causal@h4k2d32b2/" in c]
    argv = shlex.split(command)
    assert argv[:2] == ["longca", "run-cell"]
    # As a user runs it, in another directory (a fresh measurement: no store there).
    proc = subprocess.run([sys.executable, "-m", "longca", *argv[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "results/cells/kernels/sdpa/causal@h4k2d32b2/float32_fwd_64.json").read_text())
    assert row["status"] == "ok" and row["cell_id"] == "sdpa/causal@h4k2d32b2/float32_fwd_64"
    assert (row["head_dim"], row["batch"], row["seqlen"]) == (32, 2, 64)
    kept = json.loads((shaped_run / "results/cells/kernels/sdpa/causal@h4k2d32b2/float32_fwd_64.json").read_text())
    assert row["flops"] == kept["flops"]
