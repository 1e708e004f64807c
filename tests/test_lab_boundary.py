"""The tool apart from the lab: ``pip`` installs ``longca`` only, the lab (``lab/``) reaches the tool
through ``longca.api`` alone, and nothing of the tool imports the lab or the user scripts."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "lab"
PUBLIC = "longca.api"


def imported(path: Path, source: str | None = None) -> set[str]:
    """Every module a file imports, at module level or inside functions (``from a import b``: a.b)."""
    tree = ast.parse(source if source is not None else path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def tool_names_beyond_the_api(names: set[str]) -> set[str]:
    return {n for n in names if (n == "longca" or n.startswith("longca.")) and not
            (n == PUBLIC or n.startswith(PUBLIC + "."))}


def test_the_lab_imports_the_tool_only_through_its_public_module():
    lab_files = sorted(LAB.rglob("*.py"))
    assert len(lab_files) > 20
    beyond = {f"{p.relative_to(REPO)}: {n}" for p in lab_files for n in tool_names_beyond_the_api(imported(p))}
    assert not beyond, "\n".join(sorted(beyond))
    # The check can fail: a module below the public one, a name of the package, a plain import.
    assert tool_names_beyond_the_api(imported(LAB / "x.py", "from longca.results import tables\n"
                                              "def f():\n    from longca import kernels\n    import longca.cp\n")) \
        == {"longca.results", "longca.results.tables", "longca", "longca.kernels", "longca.cp"}


def test_the_tool_never_imports_the_lab_or_the_scripts():
    outside = {"longca_lab", "benchmarks"} | {p.stem for p in (REPO / "scripts").glob("*.py")}
    found = {f"{p.relative_to(REPO)}: {n}" for folder in ("longca", "workflow") for p in sorted((REPO / folder).rglob("*.py"))
             for n in imported(p) if n.split(".")[0] in outside}
    assert not found, "\n".join(sorted(found))


def test_every_public_name_resolves():
    import longca.api as api

    assert set(api.__all__) == set(api.NAMES)
    for name in api.NAMES:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError, match="no 'nope'"):
        api.nope


@pytest.mark.slow
def test_a_wheel_built_from_the_repository_holds_only_longca(tmp_path):
    # Built from a copy of the tracked files: setuptools writes build/ and *.egg-info beside the
    # sources it builds, and a test leaves the repository as it found it.
    source = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("longca-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"longca"}, tops
