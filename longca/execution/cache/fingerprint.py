"""Code fingerprints: part of every cached measurement's key.

A kernel cell measures three things, each cached on its own (``longca.execution.cache.parts``):
correctness (the gate), time and memory.  Each is determined by its settings and by the code that
computes it: the problem's code (masks, shapes, the kernel registry), the kernel's adapter, and the
part's own modules.  So changing one adapter reruns that adapter's cells only, fixing the gate re-runs
gates and no timing, and report-side code (results, plots, report) is in no key.

The key follows what the code does, not where it is or how it reads.  A Python file counts as its
code units (``code_units``): each top-level statement, and each method of a class on its own, by its
code lines (``code_lines``: without docstrings, comments, blank lines and import statements; an
import computes nothing, and the files it brings in are hashed themselves).  A fingerprint is over the
units' digests, sorted, not over file names.  So moving a function to another module, renaming a
file, commenting, documenting or re-importing re-times nothing, while a changed statement reruns the
measurements it computes.  Data files count byte for byte, as one unit.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tokenize
from pathlib import Path

from .parts import PARTS, PROBLEM_CODE

PACKAGE = Path(__file__).resolve().parents[2]  # longca/: the files below are named relative to it


def code_lines(source: str) -> list[str]:
    """The lines of a Python module that compute something: without docstrings, import statements,
    comments (whole lines and the end of a line) and blank lines.  A docstring or an import that
    shares a line with other code stays."""
    return [line for _, line in _numbered_code_lines(source)]


def _numbered_code_lines(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    drop: set[int] = set()
    # Lines where a simple statement other than an import starts: an import sharing one stays.
    busy = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.stmt) and not hasattr(n, "body")
            and not isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(set(range(node.lineno, node.end_lineno + 1)) - busy)
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body or not isinstance(body[0], ast.Expr):
            continue
        doc = body[0].value
        if not (isinstance(doc, ast.Constant) and isinstance(doc.value, str)):
            continue
        first, last = doc.lineno, doc.end_lineno
        alone = (not hasattr(node, "lineno") or node.lineno < first) and (len(body) < 2 or body[1].lineno > last)
        if alone:
            drop.update(range(first, last + 1))
    comment_at = {tok.start[0]: tok.start[1] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                  if tok.type == tokenize.COMMENT}
    kept = []
    for number, line in enumerate(source.splitlines(), 1):
        if number in drop:
            continue
        line = line[:comment_at[number]] if number in comment_at else line
        if line.strip():
            kept.append((number, line.rstrip()))
    return kept


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def code_units(source: str) -> list[str]:
    """The digests of a module's code units: each top-level statement but imports and the module's
    docstring, with a class split into its header (and class-level statements) and one unit per
    method, each by its code lines.  A unit's digest does not depend on the file it is in."""
    tree = ast.parse(source)
    kept = dict(_numbered_code_lines(source))
    spans: list[list[range]] = []
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        whole = range(start, node.end_lineno + 1)
        if isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            method_spans = [range(min([m.lineno] + [d.lineno for d in m.decorator_list]), m.end_lineno + 1)
                            for m in methods]
            inside = {n for r in method_spans for n in r}
            spans.append([range(n, n + 1) for n in whole if n not in inside])
            spans.extend([r] for r in method_spans)
        else:
            spans.append([whole])
    units = []
    for ranges in spans:
        lines = [kept[n] for r in ranges for n in r if n in kept]
        if lines:
            units.append(_digest("\n".join(lines)))
    return units


@functools.lru_cache(maxsize=None)
def file_units(path: Path) -> tuple[str, ...]:
    """What a file contributes to a fingerprint: its code units (Python) or its bytes (data)."""
    if path.suffix == ".py":
        return tuple(code_units(path.read_text()))
    return (hashlib.sha256(path.read_bytes()).hexdigest(),)


def units(paths) -> list[str]:
    """The code units of ``paths`` (a module not written yet, an optional one, counts as absent)."""
    return [u for path in {Path(p).resolve() for p in paths} if path.exists() for u in file_units(path)]


def units_fingerprint(digests) -> str:
    h = hashlib.sha256()
    for digest in sorted(digests):
        h.update(digest.encode())
    return h.hexdigest()[:16]


def files_fingerprint(paths) -> str:
    """The fingerprint of the code in ``paths``: their units' digests, sorted, so not their names,
    their order or which file holds which function."""
    return units_fingerprint(units(paths))


def problem_files(kernel: str, code: tuple[str, ...] = ()) -> list[Path]:
    """The problem's code, ``code`` (relative to the package) and the kernel's adapter: what any
    measurement of a kernel on a problem depends on (whether the kernel supports it, to begin with)."""
    from ... import kernels

    return [PACKAGE / p for p in PROBLEM_CODE + tuple(code)] + kernels.source_files(kernel)


def part_files(part: str, kernel: str) -> list[Path]:
    """The files one measurement of a kernel cell depends on: the problem's code, the part's own
    and the kernel's adapter."""
    return problem_files(kernel, PARTS[part].code)


def part_fingerprint(part: str, kernel: str) -> str:
    return files_fingerprint(part_files(part, kernel))


def kernel_files(kernel: str) -> list[Path]:
    """The files any measurement of a kernel cell depends on (the union of its parts')."""
    files = {f: None for part in PARTS for f in part_files(part, kernel)}
    return list(files)


def kernel_fingerprint(kernel: str) -> str:
    """A kernel cell's whole code: a Snakemake param, so that a change to any part's code reruns
    the cell's job, which then measures only the parts whose own key changed."""
    return files_fingerprint(kernel_files(kernel))


def cp_fingerprint(strategy: str, local_kernel: str | None = None) -> str:
    """A CP cell's code: the problem's, the gate's and the timing's, the strategy's module and the
    CP machinery, and the local kernel's adapter with its attention-with-LSE ops."""
    from ... import cp, kernels

    code = PROBLEM_CODE + PARTS["gate"].code + PARTS["time"].code
    files = ([PACKAGE / p for p in code] + cp.source_files(strategy)
             + [PACKAGE / "execution" / "measure" / "cp_cell.py", PACKAGE / "kernels" / "_lse_ops.py"])
    if local_kernel == "auto":  # any of the kernels auto may pick, on any device
        from ...cp.local import AUTO_LOCAL_KERNELS

        files += [kernels.source_file(k) for k in sorted({k for ks in AUTO_LOCAL_KERNELS.values() for k in ks})]
    elif local_kernel:
        files.append(kernels.source_file(local_kernel))
    return files_fingerprint(files)
