"""The package's layers import one way: attention ← kernels, cp ← execution ← results.

Read from the source (every import statement, also those inside functions), so a new module that
reaches up a layer fails here instead of in a review."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "longca"
# Layer of each subpackage; a module may import its own layer and those below.
LAYERS = {"attention": 0, "kernels": 1, "cp": 1, "execution": 2, "results": 3}


def imported_names(path: Path, source: str | None = None) -> set[str]:
    """Absolute names of every module and ``module.name`` that ``path`` (a file of this repository,
    or ``source`` as if it were there) imports, relative imports resolved."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]  # __init__ and plain modules alike resolve relative imports from their package
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {module} | {f"{module}.{a.name}" for a in node.names}
    return found


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Absolute names of the longca modules ``path`` (or ``source`` as if it were there) imports."""
    return {m for m in imported_names(path, source) if m == "longca" or m.startswith("longca.")}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_layers_import_only_downwards():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        here = rel.split("/")[0]
        if here not in LAYERS:
            continue
        for module in imported_modules(path):
            there = layer_of(module)
            if there is not None and LAYERS[there] > LAYERS[here]:
                wrong.append(f"{rel} imports {module}")
            if module in ("longca.cli", "longca.__main__"):
                wrong.append(f"{rel} imports the command line ({module})")
    assert not wrong, "\n".join(wrong)


EXECUTION = PACKAGE / "execution"
ROOMS = ("measure", "cache", "processes", "cluster")


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["longca", "execution"] and parts[2] in ROOMS else None


def function_level_imports(path: Path, source: str | None = None) -> set[str]:
    """The longca modules ``path`` (or ``source`` as if it were there) imports inside a function."""
    tree = ast.parse(path.read_text() if source is None else source)
    inner = "\n".join(ast.unparse(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for n in f.body)
    return imported_modules(path, inner)


def test_execution_is_four_rooms_that_reach_each_other_only_at_module_level():
    """Every module of ``longca/execution`` lives in a room (measure, cache, processes, cluster); a
    room uses another through module-level imports only, so what a room needs is read at its top
    (the measure room loads torch itself, behind ``measure_cell``)."""
    loose = sorted(p.name for p in EXECUTION.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside a room: {loose}"
    assert sorted(p.name for p in EXECUTION.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ROOMS)
    crossing = []
    for path in sorted(EXECUTION.rglob("*.py")):
        here = path.relative_to(EXECUTION).parts[0]
        for module in function_level_imports(path):
            there = room_of(module)
            if there is not None and there != here:
                crossing.append(f"{path.relative_to(PACKAGE)} imports {module} inside a function")
    assert not crossing, "\n".join(crossing)


def test_the_rooms_check_sees_an_import_inside_a_function():
    source = "from ..cache import store\ndef f():\n    from ..processes.runner import measure\n"
    found = function_level_imports(EXECUTION / "measure" / "cell.py", source)
    assert "longca.execution.processes.runner" in found and "longca.execution.cache" not in found


def test_kernels_and_cp_stay_apart_one_way():
    """CP strategies compute their local blocks with the kernels; no kernel knows about CP."""
    for path in sorted((PACKAGE / "kernels").rglob("*.py")):
        assert not any(layer_of(m) == "cp" for m in imported_modules(path)), path


def test_the_checker_resolves_relative_imports():
    """The check must be able to fail: relative imports reaching up a layer, also inside a function
    and from a package's __init__, resolve to the modules they name."""
    source = "from ..execution import timing\nfrom . import problem\ndef f():\n    from ..results.plots import x\n"
    assert imported_modules(PACKAGE / "attention" / "probe.py", source) >= {
        "longca.execution.timing", "longca.attention.problem", "longca.results.plots"}
    assert "longca.execution" in imported_modules(PACKAGE / "attention" / "__init__.py", "from .. import execution")


def _imported_modules(path: Path) -> set[Path]:
    """The longca source files ``path`` imports (relative and absolute imports of longca)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
        elif node.module and node.module.split(".")[0] == "longca":
            base = PACKAGE.parent
        else:
            continue
        prefix = base.joinpath(*node.module.split(".")) if node.module else base
        for alias in node.names:
            for candidate in (prefix / f"{alias.name}.py", prefix / alias.name / "__init__.py",
                              prefix.with_suffix(".py"), prefix / "__init__.py"):
                if candidate.is_file():
                    found.add(candidate)
                    break
    return found


def test_each_part_fingerprint_covers_every_module_it_measures_with():
    """A part's cache key hashes the problem's code, the part's own and the adapter: a module the
    part's code imports but its list leaves out could change a number without re-measuring it."""
    from longca.execution.cache.parts import PARTS, PROBLEM_CODE, REGISTRIES

    from longca import kernels

    adapters = {p for p in (PACKAGE / "kernels").glob("*.py") if p.name not in ("__init__.py", "base.py")}
    lookup = {PACKAGE / p for p in REGISTRIES}  # finds the adapter, whose own file is in the key
    # A pattern only the kernels declaring it can run (``mask_code``: block_sparse_heads) is in those
    # kernels' keys (kernels.source_files); any other kernel's cell on it is unsupported before a part
    # is measured.
    declared = {PACKAGE / p for name in kernels.names() for p in getattr(kernels.get(name), "mask_code", ())}
    assert declared, "no kernel declares mask code: this allowance is dead"
    lookup |= declared
    missing = set()
    for part in PARTS.values():
        listed = {PACKAGE / p for p in PROBLEM_CODE + part.code} | lookup
        for path in [p for p in listed if p.suffix == ".py"]:
            missing |= {(part.name, m) for m in _imported_modules(path) if m not in listed and m not in adapters}
    assert not missing, sorted((name, str(m.relative_to(PACKAGE))) for name, m in missing)


def test_the_package_builds_no_path_into_the_workflow_or_its_config():
    """The package owns its files (schema, templates: package data); ``workflow/`` and ``config/``
    belong to the Snakemake workflow around it, which passes the package what it needs."""
    outside = {"workflow", "config", "config.yaml"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            parts = []
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # Path(...) / "workflow"
                parts = [side.value for side in (node.left, node.right)
                         if isinstance(side, ast.Constant) and isinstance(side.value, str)]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "Path", "open", "joinpath"):  # Path("config/config.yaml"), open("workflow/…")
                parts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {p!r}" for p in parts
                      if p.split("/")[0] in outside]
    assert not found, "\n".join(found)


STUDY = PACKAGE.parent / "benchmarks"


def private_longca_names(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] == "longca" and any(p.startswith("_") and p != "__init__"
                                                                  for p in n.split(".")[1:])}


def test_the_study_uses_the_tool_through_its_public_names_and_the_tool_never_imports_the_study():
    """benchmarks (the fidelity study) may import longca's public modules and names only; longca
    imports nothing of the study."""
    private = {f"{p.name}: {n}" for p in sorted(STUDY.glob("*.py")) for n in private_longca_names(imported_names(p))}
    assert not private, "\n".join(sorted(private))
    study = {f"{p.relative_to(PACKAGE)}: {n}" for p in sorted(PACKAGE.rglob("*.py")) for n in imported_names(p)
             if n.split(".")[0] == "benchmarks"}
    assert not study, "\n".join(sorted(study))
    # The check can fail: a private module or name of longca is caught.
    assert private_longca_names(imported_names(STUDY / "x.py", "from longca.kernels._flash_masks import flash_mask\n"
                                                               "from longca.config import _merge\n")) \
        == {"longca.kernels._flash_masks", "longca.kernels._flash_masks.flash_mask", "longca.config._merge"}


def test_the_study_shares_code_as_a_package_not_through_sys_path():
    """The study's modules import each other as ``benchmarks.<name>`` and edit no ``sys.path``."""
    siblings = {p.stem for p in STUDY.glob("*.py")} - {"__init__"}
    wrong = [f"{p.name}: {n}" for p in sorted(STUDY.glob("*.py")) for n in imported_names(p) if n.split(".")[0] in siblings]
    wrong += [p.name for p in sorted(STUDY.glob("*.py")) if "sys.path" in p.read_text()]
    assert not wrong, "\n".join(wrong)
