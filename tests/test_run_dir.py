"""The run directory is named in one module (`longca/run_dir.py`): no other module of the package,
no rule, script or benchmark spells a path under ``results/`` (prose in docstrings and help texts
may name the folder)."""

import ast
import re
from pathlib import Path

from longca import cells, run_dir

REPO = Path(__file__).resolve().parents[1]
# A string that is a path under the run directory (a regex for one too): no spaces.  The bare word
# "results" is also an argument's name and a folder of docs/, so it is not looked for.
RUN_PATH = re.compile(r"^\^?(?:\(|\\s\*output: \()?results/\S*$")


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            out.add(id(body[0].value))
    return out


def _run_paths(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and RUN_PATH.match(n.value)]


def test_no_python_module_but_run_dir_spells_a_results_path():
    files = [p for folder in ("longca", "scripts", "lab/longca_lab", "workflow/scripts") for p in (REPO / folder).rglob("*.py")]
    offenders = {str(p.relative_to(REPO)): hits for p in files
                 if p.name != "run_dir.py" and (hits := _run_paths(p))}
    assert not offenders, offenders


def test_no_rule_spells_a_results_path():
    quoted = re.compile(r"""["']results(?:/[^"'\s]*)?["']""")
    for path in [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        code = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        assert not quoted.findall(code), (path.name, quoted.findall(code))


def test_the_scan_finds_a_results_path_where_there_is_one(tmp_path):
    """The check above would catch the paths it was written against."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""The run keeps results/ tidy."""\nA = "results/cells"\nB = r"^results/cells/(?:x)/"\n'
                      'C = "see results/ for more"\n')
    assert [v for _, v in _run_paths(sample)] == ["results/cells", "^results/cells/(?:x)/"]


def test_cell_files_and_logs_live_where_the_run_dir_says():
    assert cells.KERNEL_FILE.startswith(run_dir.KERNEL_CELLS + "/") and cells.CP_FILE.startswith(run_dir.CP_CELLS + "/")
    assert cells.KERNEL_LOG.startswith(run_dir.KERNEL_LOGS + "/") and cells.CP_LOG.startswith(run_dir.CP_LOGS + "/")
    assert run_dir.figure("kernels_{mask}") == "results/figures/kernels_{mask}.png"
    assert run_dir.cell_log("kernel", "sdpa/causal/x") == "results/logs/kernels/sdpa/causal/x.log"
    assert run_dir.cell_log("cp", "ring/causal/x") == "results/logs/cp/ring/causal/x.log"
