"""Cache keys follow what the code does: documenting, commenting, re-importing, moving or renaming
code keeps a cell's fingerprint; changing a statement does not."""

import shutil

from longca.execution.cache import fingerprint
from longca.execution.cache.fingerprint import code_lines, files_fingerprint


def test_code_lines_leave_out_docstrings_comments_imports_and_blank_lines():
    before = '"""Module."""\nimport os\n\ndef f(x):\n    """Doc."""\n    # why\n    return x + 1\n'
    reworded = ('"""Module,\nreworded."""\nfrom math import (\n    pi,\n)\nimport os\ndef f(x):\n'
                '    """Another doc,\n    two lines."""\n\n    return x + 1   # the end of a line\n')
    changed = '"""Module."""\n\ndef f(x):\n    """Doc."""\n    return x + 2\n'
    assert code_lines(before) == code_lines(reworded) == ["def f(x):", "    return x + 1"]
    assert code_lines(changed) != code_lines(before)
    shared = 'def f(x): """doc"""; return 1\n'  # a docstring on a line with code stays
    assert code_lines(shared) == [shared.rstrip()]
    assert code_lines("import os; x = 1\n") == ["import os; x = 1"]  # so does an import
    assert code_lines('s = "# not a comment"  # a comment\n') == ['s = "# not a comment"']


def test_a_fingerprint_follows_content_not_file_names(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f(x):\n    return x + 1\n")
    b.write_text("Y = 2\n")
    key = files_fingerprint([a, b])
    moved = tmp_path / "sub" / "renamed.py"
    moved.parent.mkdir()
    shutil.copy(a, moved)
    b2 = tmp_path / "b2.py"
    b2.write_text('"""Now documented."""\nimport math  # and importing\n\nY = 2  # why 2\n')
    assert files_fingerprint([b2, moved]) == key
    edited = tmp_path / "edited.py"
    edited.write_text("def f(x):\n    return x + 2\n")
    assert files_fingerprint([edited, b]) != key
    data = tmp_path / "d.json"
    data.write_text('{"a": 1}')
    assert files_fingerprint([a, b, data]) != key  # data files count byte for byte


def test_moving_a_function_to_another_module_keeps_the_fingerprint(tmp_path):
    (tmp_path / "a.py").write_text("def f(x):\n    return x + 1\n\n\nclass C:\n    K = 2\n\n"
                                   "    def m(self):\n        return self.K\n")
    (tmp_path / "b.py").write_text("Y = 2\n")
    key = files_fingerprint([tmp_path / "a.py", tmp_path / "b.py"])
    (tmp_path / "a2.py").write_text("class C:\n    K = 2\n\n    def m(self):\n        return self.K\n")
    (tmp_path / "b2.py").write_text("Y = 2\n\n\ndef f(x):\n    return x + 1\n")
    assert files_fingerprint([tmp_path / "a2.py", tmp_path / "b2.py"]) == key
    # A method is a unit of its own: removing another leaves its digest, changing it does not.
    before = set(fingerprint.code_units("class C:\n    def m(self):\n        return 1\n\n"
                                        "    def n(self):\n        return 2\n"))
    after = set(fingerprint.code_units("class C:\n    def m(self):\n        return 1\n"))
    assert after < before
    changed = set(fingerprint.code_units("class C:\n    def m(self):\n        return 3\n"))
    assert not changed <= before


def test_every_kernel_has_a_fingerprint_over_its_adapter_and_the_measurement_code():
    files = fingerprint.kernel_files("sdpa")
    assert all(f.exists() for f in files) and any(f.name == "sdpa.py" for f in files)
    assert fingerprint.kernel_fingerprint("sdpa") != fingerprint.kernel_fingerprint("flex")


def test_each_part_is_keyed_on_its_own_code_only():
    from longca.execution.cache.parts import PARTS

    names = {part: {f.name for f in fingerprint.part_files(part, "sdpa")} for part in PARTS}
    assert "gate.py" in names["gate"] and "reference.py" in names["gate"]
    assert {"timing.py", "graphed.py", "timed.py"} <= names["time"]
    assert "memory.py" in names["memory"]
    assert not {"gate.py", "reference.py", "memory.py"} & names["time"]   # a gate fix re-times nothing
    # The memory is read off the timing's own calls (call_memory.CallReading), so the timing's code
    # keys it too; a fix to the memory part's own call (memory.py) still re-times nothing.
    assert {"call_memory.py", "timing.py", "timed.py"} <= names["memory"] and "call_memory.py" in names["time"]
    assert not {"gate.py", "reference.py"} & names["memory"]
    assert all("sdpa.py" in n and "cell.py" not in n for n in names.values())


def test_a_cp_strategy_depends_on_its_module_and_every_module_that_registers_no_strategy():
    """No hand list: a new machinery module of longca/cp is in every strategy's key, a new strategy
    module in its own strategies' keys only."""
    import inspect
    from pathlib import Path

    from longca import cp

    package = Path(cp.__file__).resolve().parent
    strategy_modules = {Path(inspect.getfile(cp.get(name))).name for name in cp.names()} | {"testing.py"}
    machinery = {p.name for p in package.glob("*.py")} - strategy_modules - {"__init__.py"}
    assert {"base.py", "comm.py", "fused.py", "sequence_parallel.py"} <= machinery
    for name in cp.names():
        files = cp.source_files(name)
        assert files[0] == Path(inspect.getfile(cp.get(name)))
        assert {p.name for p in files[1:]} == machinery, name
