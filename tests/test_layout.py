"""The package's imports point down: no file imports one that imports it back, the layers import one
way (``ORDER``: settings ← attention ← kernels ← cp ← config ← execution ← results ← the command line)
and so do the rooms of ``longca/execution`` (``ROOMS``: cache ← measure ← processes ← cluster).

Read from the source (every import statement, also those inside functions), so a new module that
reaches up a layer or closes a circle fails here instead of in a review."""

import ast
from pathlib import Path
from typing import Mapping

PACKAGE = Path(__file__).resolve().parent.parent / "longca"


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


# --- Files: which file of the package each import statement runs -------------------------------------

def module_name(path: Path) -> str:
    """``longca/cp/local.py`` → ``longca.cp.local``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _file_of(name: str) -> str | None:
    """The package file a dotted name is in (``longca.cp.local.merge_into`` → ``longca.cp.local``)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in FILES:
        parts.pop()
    return ".".join(parts) or None


def imported_files(path: Path, source: str | None = None) -> set[str]:
    """The package files (as ``module_name``s) whose code ``path``'s import statements run, at module
    level and inside functions.  ``from pkg import x`` is ``pkg/x.py`` where ``x`` is a submodule, else
    ``pkg/__init__.py`` (a member's ``from . import register`` imports its package's ``__init__``).
    The ``__init__`` of the packages above a named file, which Python runs first, is not counted: every
    package would then be a circle with the modules it imports.  Nor is a registry's discovery of its
    members (``importlib.import_module`` in ``longca/registry.py``): it is no import statement."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [f"{module}.{a.name}" if f"{module}.{a.name}" in FILES else module for a in node.names]
        else:
            continue
        found |= {f for f in map(_file_of, names) if f is not None}
    return found - {module_name(path)}


def import_graph(extra: Mapping[str, str] = {}) -> dict[str, set[str]]:
    """Each package file → the package files it imports; ``extra`` adds source to a file (for tests
    of the checks themselves)."""
    return {m: imported_files(p, p.read_text() + "\n" + extra.get(m, "")) for m, p in FILES.items()}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The groups of files that import each other, directly or around a circle (each sorted)."""
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    groups = {tuple(sorted({m} | {n for n in reach[m] if m in reach[n]})) for m in graph if m in reach[m]}
    return sorted(list(g) for g in groups)


def _explained(group: list[str], graph: Mapping[str, set[str]]) -> str:
    return "circle: " + "; ".join(f"{m} imports {', '.join(sorted(graph[m] & set(group)))}" for m in group)


# No circle is allowed, not even through an import inside a function: one would let a module run
# before the module it needs has finished.  The only exception this test would name is a lazy import
# of torch-bound code from a torch-free module, with why; none is needed (spec.py no longer builds
# the Problem: ``Problem.from_spec`` does, and cp/block_ops.py holds what cp/fused, fused_varlen and
# local shared).
ALLOWED_CIRCLES: list[list[str]] = []


def test_no_file_of_the_package_imports_one_that_imports_it_back():
    graph = import_graph()
    found = [g for g in circles(graph) if g not in ALLOWED_CIRCLES]
    assert not found, "\n".join(_explained(g, graph) for g in found)


def test_the_circle_check_sees_imports_inside_functions_and_of_a_package_init():
    # spec.py building the Problem itself, lazily: the circle this package had.
    lazy = {"longca.spec": "def problem(self):\n    from .attention.problem import Problem\n"}
    assert ["longca.attention.problem", "longca.spec"] in circles(import_graph(lazy))
    # A registry's package importing a member that imports ``register`` from the package.
    member = {"longca.kernels": "def names():\n    from . import sdpa\n"}
    assert ["longca.kernels", "longca.kernels.sdpa"] in circles(import_graph(member))


# --- Layers: lowest first; a file imports its own layer and those below ---------------------------
# A name is a top-level module or subpackage of longca/ ("__init__": the package's own file).
ORDER: tuple[tuple[str, ...], ...] = (
    # Settings and names, torch-free, that every layer shares: the registry that finds kernels and
    # strategies, a cell's problem and timing as settings, the run's paths, a cell's identity, the
    # CP launch environments.
    ("__init__", "registry", "spec", "timing_spec", "problem_settings", "run_dir", "cells", "cp_env"),
    # The attention model, and its public names re-exported at the top (masks, flops, reference).
    ("attention", "masks", "flops", "reference"),
    ("kernels",),
    ("cp",),  # CP strategies compute their local blocks with the kernels; no kernel knows about CP
    ("config", "shapes"),  # config as data, validated against the kernels' and strategies' names; its shapes
    ("execution",),
    ("results",),
    ("status", "cli", "__main__"),  # the command line and what it reports
    ("api",),  # the names code outside the tool uses (the lab): it may name any layer
)


def layer_name(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(module: str) -> int:
    return next(i for i, names in enumerate(ORDER) if layer_name(module) in names)


def upward(graph: Mapping[str, set[str]], level, where=lambda m: True) -> list[str]:
    """Each import in ``graph`` of a file whose ``level`` is above the importer's."""
    return [f"{m} imports {t}" for m, targets in sorted(graph.items()) if where(m)
            for t in sorted(targets) if where(t) and level(t) > level(m)]


def test_every_module_of_the_package_has_one_place_in_the_order():
    names = [n for layer_names in ORDER for n in layer_names]
    assert len(names) == len(set(names)), names
    top = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert top == set(names), f"not in ORDER: {sorted(top - set(names))}; gone: {sorted(set(names) - top)}"


def test_layers_import_only_downwards():
    wrong = upward(import_graph(), layer)
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_an_upward_import_inside_a_function():
    bad = {"longca.attention.problem": "def f():\n    from ..results import tables\n",
           "longca.kernels.sdpa": "from ..cp import local\n",
           "longca.spec": "def g():\n    from . import config\n"}
    assert set(upward(import_graph(bad), layer)) >= {
        "longca.attention.problem imports longca.results.tables", "longca.kernels.sdpa imports longca.cp.local",
        "longca.spec imports longca.config"}


# --- The rooms of longca/execution: lowest first ---------------------------------------------------
# What is measured is keyed by the cache (cache/parts: the parts and their keys; fingerprint: their
# code); processes run the measuring code on this machine; cluster runs them across GPUs and nodes.
EXECUTION = PACKAGE / "execution"
ROOMS = ("cache", "measure", "processes", "cluster")


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["longca", "execution"] and parts[2] in ROOMS else None


def test_execution_rooms_import_only_downwards_or_within_the_room():
    wrong = upward(import_graph(), lambda m: ROOMS.index(room_of(m)), where=room_of)
    assert not wrong, "\n".join(wrong)


def test_the_room_check_sees_an_upward_import_inside_a_function():
    bad = {"longca.execution.cache.store": "def f():\n    from ..measure import cell\n",
           "longca.execution.measure.cell": "from ..processes import wire\n"}
    assert set(upward(import_graph(bad), lambda m: ROOMS.index(room_of(m)), where=room_of)) == {
        "longca.execution.cache.store imports longca.execution.measure.cell",
        "longca.execution.measure.cell imports longca.execution.processes.wire"}


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


def test_the_checker_resolves_relative_imports():
    """The check must be able to fail: relative imports reaching up a layer, also inside a function
    and from a package's __init__, resolve to the modules they name."""
    source = "from ..execution import timing\nfrom . import problem\ndef f():\n    from ..results.plots import x\n"
    assert imported_modules(PACKAGE / "attention" / "probe.py", source) >= {
        "longca.execution.timing", "longca.attention.problem", "longca.results.plots"}
    assert "longca.execution" in imported_modules(PACKAGE / "attention" / "__init__.py", "from .. import execution")
    # Files: a submodule named in ``from pkg import x`` is its own file, any other name its package's.
    assert imported_files(PACKAGE / "cp" / "probe.py", "from . import local, register\nfrom ..kernels.sdpa import X\n"
                          "def f():\n    import longca.results.tables\n") == {
        "longca.cp.local", "longca.cp", "longca.kernels.sdpa", "longca.results.tables"}


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
