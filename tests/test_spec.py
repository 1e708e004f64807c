"""The problem's fields are declared once (``longca.spec.ProblemSpec``), and everything that carries
them (cache keys, config's cell settings, ``run-cell``'s flags, the Parquet columns) holds the same
fields."""

import argparse
import ast
import dataclasses
from pathlib import Path

from longca import config as longca_config
from longca import problem_settings
from longca.execution.cache.parts import PROBLEM_SETTINGS
from longca.results import parquet
from longca.spec import ProblemSpec

PACKAGE = Path(__file__).resolve().parent.parent / "longca"
FIELDS = {f.name for f in dataclasses.fields(ProblemSpec)}
# Where the fields are spelled out together, and why: the declaration itself; the problem built
# from it (tensors' shapes, torch); the typed Parquet columns (the results' contract, held equal to
# the declaration below).
ALLOWED = {("spec.py", "ProblemSpec"), ("attention/problem.py", "Problem"), ("results/parquet.py", "_PROBLEM")}


def spelled_together(tree: ast.AST) -> list[tuple[str, set[str]]]:
    """Each class, literal or assignment of ``tree`` that spells out field names: (its name, them)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            found.append((node.name, names))
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else value.elts
            names = set()
            for item in items:
                first = item.elts[0] if isinstance(item, ast.Tuple) and item.elts else item
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names.add(first.value)
            target = node.targets[0]
            found.append((getattr(target, "id", "?"), names))
        elif isinstance(node, ast.Dict):
            found.append(("a dict", {k.value for k in node.keys if isinstance(k, ast.Constant)}))
    return found


def test_the_problems_fields_are_declared_once():
    """No module spells out most of the problem's fields but the declaration (and the two places
    named in ALLOWED); everything else derives them from ``longca.spec``."""
    many = (len(FIELDS) * 3) // 4   # 9 of the 13: a cell's own axes (mask, length, …) alone stay below
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for name, names in spelled_together(ast.parse(path.read_text())):
            if len(names & FIELDS) >= many and (rel, name) not in ALLOWED:
                spelled.append(f"{rel}: {name} spells {len(names & FIELDS)} of the problem's fields")
    assert not spelled, "\n".join(spelled)
    assert len(ALLOWED) == 3


def test_the_check_finds_a_second_declaration():
    source = "SETTINGS = ('mask', 'seqlen', 'direction', 'dtype', 'batch', 'heads_q', 'heads_kv', 'head_dim', 'seed')\n"
    assert ("SETTINGS", FIELDS - {"mask_params", "device", "pattern", "head_dim_v"}) in spelled_together(ast.parse(source))


def test_keys_flags_config_and_columns_carry_exactly_the_declared_fields():
    assert set(PROBLEM_SETTINGS) == FIELDS | {"kernel", "kernel_options"}
    parser = argparse.ArgumentParser()
    problem_settings.add_flags(parser)
    flags = vars(parser.parse_args([]))
    assert set(flags) == FIELDS
    assert flags == {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING
                              else None if f.default is dataclasses.MISSING else f.default)
                     for f in dataclasses.fields(ProblemSpec)}
    cfg = longca_config.validate(longca_config.merge_files(["config/config.yaml"]))
    cell = next(iter(longca_config.kernel_cells(cfg)))
    settings = longca_config.cell_settings(cfg, cell.kernel, cell.mask, cell.seqlen, cell.direction, cell.dtype)
    # head_dim_v is in a cell's settings only where it differs from head_dim (problem_settings.settled):
    # a cell of one head dim keeps the settings it had before the field existed.
    assert FIELDS - {"head_dim_v"} <= set(settings) and "head_dim_v" not in settings
    columns = {name for name, _ in parquet._PROBLEM}
    assert FIELDS <= columns
    assert columns - FIELDS == {"mask_params_resolved", "gate_seqlen"} | {n for n, _ in parquet._timing_columns(
        parquet.CountedTiming)}
